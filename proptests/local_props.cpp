// The differential property of local mode: random meshes, rank maps, transformations and
// collectives give identical per-rank results in local mode and on the threaded backend (floats
// bit for bit: both reduce in group-rank order).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <mutex>

#include "meshsim/local.hpp"
#include "meshsim/spmd.hpp"
#include "meshsim/testing/mesh_generators.hpp"

namespace meshsim {
namespace {

// value_of is a rank's input: an irregular double so that the reduction order shows in the bits.
double value_of(int64_t rank, uint64_t salt) {
  const uint64_t h = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull ^ salt;
  return static_cast<double>(h % 100003) / 7.0 - 3000.0;
}

uint64_t bits(double d) {
  uint64_t u = 0;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

RC_GTEST_PROP(LocalProps, LocalAndThreadedAgreeRankByRank, ()) {
  auto spec = *gen::mesh_root();
  // Small worlds: one rank thread each on the threaded side.
  RC_PRE(spec.size() <= 64 && spec.world() <= 256);
  DeviceMesh root = spec.build();
  // A transformation of the root: itself, a slice of its dims, or their flattening.
  const int kind = *rc::gen::inRange(0, 3);
  DeviceMesh mesh = root;
  if (root.names() && root.ndim() > 1 && kind > 0) {
    std::vector<std::string> pick;
    for (int d = 0; d < root.ndim(); ++d) {
      if (*rc::gen::arbitrary<bool>()) pick.push_back((*root.names())[static_cast<std::size_t>(d)]);
    }
    if (!pick.empty()) mesh = root.slice(pick);
    if (kind == 2) mesh = mesh.flatten();
  }
  const int dim = *rc::gen::inRange(0, mesh.ndim());
  const ReduceOp op = *rc::gen::element(ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                        ReduceOp::kMax, ReduceOp::kAvg);
  const uint64_t salt = *rc::gen::arbitrary<uint64_t>();
  const int64_t world = *root.world_size();
  const int64_t size = mesh.size(dim);
  const int64_t bcast_root = *rc::gen::inRange<int64_t>(0, size);
  // element e of rank r's reduce_scatter input (2 values per block) and all_to_all input.
  auto rs_in = [&](int64_t r, int64_t e) { return value_of(r * 131 + e, salt); };
  auto a2a_in = [](int64_t r, int64_t e) { return r * 1000 + e; };

  // Threaded: every rank of the mesh reduces and gathers over its dim's communicator.
  std::vector<double> reduced(static_cast<std::size_t>(world), 0);
  std::vector<std::vector<int64_t>> gathered(static_cast<std::size_t>(world));
  std::vector<double> bcast(static_cast<std::size_t>(world));
  std::vector<std::vector<double>> scattered(static_cast<std::size_t>(world));
  std::vector<std::vector<int64_t>> exchanged(static_cast<std::size_t>(world));
  std::mutex mu;
  SpmdOptions o;
  o.world_size = world;
  o.timeout = std::chrono::seconds(20);
  RunReport rep = run_spmd(o, [&](RankContext& ctx) {
    if (!mesh.contains(ctx.rank())) return;
    Communicator& c = ctx.comm(mesh, dim);
    double v = value_of(ctx.rank(), salt);
    c.all_reduce(std::span<double>(&v, 1), op);
    const int64_t me = ctx.rank() * 3 + 1;
    std::vector<int64_t> got(static_cast<std::size_t>(c.size()));
    c.all_gather(std::span<const int64_t>(&me, 1), std::span<int64_t>(got));
    double b = value_of(ctx.rank(), salt + 1);
    c.broadcast(std::span<double>(&b, 1), static_cast<int>(bcast_root));
    std::vector<double> rs(static_cast<std::size_t>(2 * size)), rs_out(2);
    for (int64_t e = 0; e < 2 * size; ++e) rs[static_cast<std::size_t>(e)] = rs_in(ctx.rank(), e);
    c.reduce_scatter(std::span<const double>(rs), std::span<double>(rs_out), op);
    std::vector<int64_t> a2a(static_cast<std::size_t>(size)), a2a_out(static_cast<std::size_t>(size));
    for (int64_t e = 0; e < size; ++e) a2a[static_cast<std::size_t>(e)] = a2a_in(ctx.rank(), e);
    c.all_to_all(std::span<const int64_t>(a2a), std::span<int64_t>(a2a_out));
    c.barrier();
    std::lock_guard lk(mu);
    reduced[static_cast<std::size_t>(ctx.rank())] = v;
    gathered[static_cast<std::size_t>(ctx.rank())] = std::move(got);
    bcast[static_cast<std::size_t>(ctx.rank())] = b;
    scattered[static_cast<std::size_t>(ctx.rank())] = std::move(rs_out);
    exchanged[static_cast<std::size_t>(ctx.rank())] = std::move(a2a_out);
  });
  RC_ASSERT(rep.ok);

  // Local: the same, group by group.
  LocalWorld w(world);
  auto groups = std::make_shared<const LocalGroups>(mesh, dim);
  std::vector<double> in(static_cast<std::size_t>(world));
  for (int64_t r = 0; r < world; ++r) in[static_cast<std::size_t>(r)] = value_of(r, salt);
  const LocalValue<double> red = w.all_reduce(groups, LocalValue<double>::dense(in), op);
  const auto rows = w.all_gather(*groups, LocalValue<int64_t>::affine(world, 1, 3));
  std::vector<double> bin(static_cast<std::size_t>(world));
  for (int64_t r = 0; r < world; ++r) bin[static_cast<std::size_t>(r)] = value_of(r, salt + 1);
  const LocalValue<double> bc = w.broadcast(groups, LocalValue<double>::dense(bin), bcast_root);
  LocalBuffers<double> rsb(world, 2 * size);
  LocalBuffers<int64_t> a2ab(world, size);
  for (int64_t r = 0; r < world; ++r) {
    for (int64_t e = 0; e < 2 * size; ++e) rsb.of(r)[static_cast<std::size_t>(e)] = rs_in(r, e);
    for (int64_t e = 0; e < size; ++e) a2ab.of(r)[static_cast<std::size_t>(e)] = a2a_in(r, e);
  }
  const LocalBuffers<double> rso = w.reduce_scatter(*groups, rsb, op);
  const LocalBuffers<int64_t> a2ao = w.all_to_all(*groups, a2ab);
  w.barrier(*groups);
  for (int64_t r = 0; r < world; ++r) {
    auto where = groups->of(r);
    RC_ASSERT(where.has_value() == mesh.contains(r));
    if (!where) continue;
    RC_ASSERT(bits(red.at(r)) == bits(reduced[static_cast<std::size_t>(r)]));
    RC_ASSERT(rows[static_cast<std::size_t>(where->first)] == gathered[static_cast<std::size_t>(r)]);
    RC_ASSERT(bits(bc.at(r)) == bits(bcast[static_cast<std::size_t>(r)]));
    for (std::size_t e = 0; e < 2; ++e) {
      RC_ASSERT(bits(rso.of(r)[e]) == bits(scattered[static_cast<std::size_t>(r)][e]));
    }
    const auto a = a2ao.of(r);
    RC_ASSERT(std::vector<int64_t>(a.begin(), a.end()) == exchanged[static_cast<std::size_t>(r)]);
  }
}

}  // namespace
}  // namespace meshsim
