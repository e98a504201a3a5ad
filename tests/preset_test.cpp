// The framework presets against the frameworks' own rules, written here independently of the
// preset code: Megatron-core's generate_masked_orthogonal_rank_groups (transcribed from its
// algorithm: decompose a group index over the unmasked sizes, a member index over the masked
// ones, first name fastest) and torchtitan's views as row-major unflattens of the world,
// enumerated rank by rank. Random degrees and orders, several hundred configurations each,
// invalid ones included: those must be refused exactly when the framework refuses them.
#include "meshsim/preset.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "meshsim/error.hpp"

namespace meshsim {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

Groups sorted(Groups g) {
  std::sort(g.begin(), g.end());
  return g;
}

Groups groups_by_name(const DeviceMesh& m, const std::string& dim) { return sorted(m.groups(m.dim_index(dim))); }

// ---- Megatron's enumeration ----

std::vector<int64_t> prefix_product(const std::vector<int64_t>& a) {
  std::vector<int64_t> r{1};
  for (int64_t v : a) r.push_back(r.back() * v);
  return r;
}

std::vector<int64_t> decompose(int64_t index, const std::vector<int64_t>& shape) {
  const std::vector<int64_t> stride = prefix_product(shape);
  std::vector<int64_t> idx;
  for (std::size_t i = 0; i < shape.size(); ++i) idx.push_back((index / stride[i]) % shape[i]);
  return idx;
}

Groups masked_orthogonal_groups(int64_t world, const std::vector<int64_t>& size, const std::vector<bool>& mask) {
  std::vector<int64_t> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  const std::vector<int64_t> global_stride = prefix_product(size);
  for (std::size_t i = 0; i < size.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  const int64_t group_size = prefix_product(masked_shape).back();
  Groups out;
  for (int64_t g = 0; g < world / group_size; ++g) {
    const std::vector<int64_t> gi = decompose(g, unmasked_shape);
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < group_size; ++r) {
      const std::vector<int64_t> ri = decompose(r, masked_shape);
      ranks.push_back(std::inner_product(ri.begin(), ri.end(), masked_stride.begin(), int64_t{0}) +
                      std::inner_product(gi.begin(), gi.end(), unmasked_stride.begin(), int64_t{0}));
    }
    out.push_back(ranks);
  }
  return out;
}

// RankGenerator: sizes by name; names missing from the order are appended (size 1 only).
struct RankGenerator {
  std::vector<std::string> order;
  std::vector<int64_t> size;
  int64_t world = 1;
  bool ok = true;

  RankGenerator(std::vector<std::string> tokens, const std::map<std::string, int64_t>& by_name) {
    for (const auto& [name, s] : by_name) {
      if (std::find(tokens.begin(), tokens.end(), name) != tokens.end()) continue;
      if (s != 1) ok = false;
      tokens.push_back(name);
    }
    order = tokens;
    for (const std::string& t : order) {
      size.push_back(by_name.at(t));
      world *= by_name.at(t);
    }
  }
  Groups get_ranks(const std::vector<std::string>& token) const {
    std::vector<bool> mask(order.size(), false);
    for (const std::string& t : token) mask[std::find(order.begin(), order.end(), t) - order.begin()] = true;
    return masked_orthogonal_groups(world, size, mask);
  }
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& t : v) s += (s.empty() ? "" : "-") + t;
  return s;
}

TEST(MegatronPreset, EveryGroupIsMegatronsOwnEnumerationMemberOrderIncluded) {
  std::mt19937 rng(20261126);
  auto pick = [&](std::vector<int64_t> v) { return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)]; };
  int valid = 0, refused = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    preset::Megatron m;
    m.tp = pick({1, 2, 3, 4});
    m.pp = pick({1, 2, 3});
    m.cp = pick({1, 2, 4});
    m.ep = pick({1, 2, 4});
    if (rng() % 2) m.etp = pick({1, 2, 4});
    std::vector<std::string> tokens{"tp", "cp", "ep", "dp", "pp"};
    std::shuffle(tokens.begin(), tokens.end(), rng);
    if (rng() % 3 == 0) tokens.erase(tokens.begin() + static_cast<long>(rng() % tokens.size()));
    if (rng() % 4 == 0) tokens = {"tp", "cp", "ep", "dp", "pp"};  // Megatron's default
    m.order = join(tokens);
    const int64_t dp = pick({1, 2, 3, 4});
    int64_t world = m.tp * m.pp * m.cp * dp;
    if (rng() % 10 == 0) world += pick({1, 2});  // sometimes not a multiple
    const int64_t etp = m.etp.value_or(m.tp);
    SCOPED_TRACE("tp=" + std::to_string(m.tp) + " pp=" + std::to_string(m.pp) + " cp=" + std::to_string(m.cp) +
                 " ep=" + std::to_string(m.ep) + " etp=" + std::to_string(etp) + " order=" + m.order +
                 " world=" + std::to_string(world));
    // Megatron's checks, in its words.
    bool ok = world % (m.tp * m.pp * m.cp) == 0 && world % (etp * m.ep * m.pp) == 0;
    const int64_t mdp = world / (m.tp * m.pp * m.cp), edp = world / (etp * m.ep * m.pp);
    const RankGenerator dense(tokens, {{"tp", m.tp}, {"ep", 1}, {"dp", mdp}, {"pp", m.pp}, {"cp", m.cp}});
    const RankGenerator expert(tokens, {{"tp", etp}, {"ep", m.ep}, {"dp", edp}, {"pp", m.pp}, {"cp", 1}});
    ok = ok && dense.ok && expert.ok;
    ok = ok && (m.order.ends_with("pp") || m.pp == 1 || edp == mdp);
    ok = ok && dense.get_ranks({"pp"}) == expert.get_ranks({"pp"});
    if (!ok) {
      EXPECT_THROW(apply(preset::megatron_recipe(m, world)), InvalidArgument);
      ++refused;
      continue;
    }
    const BuiltMeshes b = apply(preset::megatron_recipe(m, world));
    const DeviceMesh& d = b.handles.at("dense");
    const DeviceMesh& e = b.handles.at("expert");
    EXPECT_EQ(groups_by_name(d, "tp"), sorted(dense.get_ranks({"tp"})));
    EXPECT_EQ(groups_by_name(d, "cp"), sorted(dense.get_ranks({"cp"})));
    EXPECT_EQ(groups_by_name(d, "dp"), sorted(dense.get_ranks({"dp"})));
    EXPECT_EQ(groups_by_name(d, "pp"), sorted(dense.get_ranks({"pp"})));
    EXPECT_EQ(groups_by_name(b.handles.at("dp_cp"), "dp_cp"), sorted(dense.get_ranks({"dp", "cp"})));
    EXPECT_EQ(groups_by_name(b.handles.at("mp"), "mp"), sorted(dense.get_ranks({"tp", "pp"})));
    EXPECT_EQ(groups_by_name(e, "etp"), sorted(expert.get_ranks({"tp"})));
    EXPECT_EQ(groups_by_name(e, "ep"), sorted(expert.get_ranks({"ep"})));
    EXPECT_EQ(groups_by_name(e, "edp"), sorted(expert.get_ranks({"dp"})));
    EXPECT_EQ(groups_by_name(e, "pp"), sorted(expert.get_ranks({"pp"})));
    ++valid;
  }
  std::cout << "megatron: " << valid << " configurations matched, " << refused << " refused as Megatron does\n";
  EXPECT_GT(valid, 350);
  EXPECT_GT(refused, 30);
}

// ---- torchtitan's views ----

// rowmajor_groups: the groups of the dims `vary` of the world 0..W-1 unflattened row-major to
// `sizes`, members row-major over `vary` (a flattened dim's order).
Groups rowmajor_groups(const std::vector<int64_t>& sizes, const std::set<std::size_t>& vary) {
  int64_t world = 1;
  for (int64_t s : sizes) world *= s;
  std::map<std::vector<int64_t>, std::vector<std::pair<std::vector<int64_t>, int64_t>>> by_key;
  for (int64_t r = 0; r < world; ++r) {
    std::vector<int64_t> c(sizes.size());
    int64_t rest = r;
    for (std::size_t i = sizes.size(); i-- > 0;) {
      c[i] = rest % sizes[i];
      rest /= sizes[i];
    }
    std::vector<int64_t> key, pos;
    for (std::size_t i = 0; i < sizes.size(); ++i) (vary.count(i) ? pos : key).push_back(c[i]);
    by_key[key].push_back({pos, r});
  }
  Groups out;
  for (auto& [key, members] : by_key) {
    std::sort(members.begin(), members.end());
    std::vector<int64_t> g;
    for (const auto& [pos, r] : members) g.push_back(r);
    out.push_back(g);
  }
  return sorted(out);
}

void expect_view(const BuiltMeshes& b, const std::string& view, const std::vector<std::string>& names,
                 const std::vector<int64_t>& sizes, const std::vector<std::string>& of_names) {
  ASSERT_TRUE(b.handles.count(view)) << view;
  const DeviceMesh& m = b.handles.at(view);
  ASSERT_EQ(*m.names(), names) << view;
  for (const std::string& n : names) {
    const std::size_t at = static_cast<std::size_t>(std::find(of_names.begin(), of_names.end(), n) - of_names.begin());
    EXPECT_EQ(groups_by_name(m, n), rowmajor_groups(sizes, {at})) << view << " " << n;
  }
}

TEST(TorchtitanPreset, EveryViewIsItsRowMajorUnflattenOfTheWorld) {
  std::mt19937 rng(11262026);
  auto pick = [&](std::vector<int64_t> v) { return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)]; };
  int valid = 0, refused = 0;
  for (int iter = 0; iter < 700; ++iter) {
    preset::Torchtitan t;
    t.pp = pick({1, 2, 3});
    t.dp_replicate = pick({1, 2, 3});
    const int64_t shard = pick({1, 2, 3, 4});
    t.dp_shard = rng() % 3 == 0 ? -1 : shard;
    t.cp = pick({1, 2});
    t.tp = pick({1, 2, 4});
    t.ep = pick({1, 2, 3, 4, 8});
    t.spmd_backend = rng() % 2 ? "spmd_types" : "partial_dtensor";
    int64_t world = t.pp * t.dp_replicate * shard * t.cp * t.tp;
    if (rng() % 10 == 0) world += 1;
    SCOPED_TRACE("pp=" + std::to_string(t.pp) + " dp_replicate=" + std::to_string(t.dp_replicate) +
                 " dp_shard=" + std::to_string(t.dp_shard) + " cp=" + std::to_string(t.cp) + " tp=" +
                 std::to_string(t.tp) + " ep=" + std::to_string(t.ep) + " " + t.spmd_backend +
                 " world=" + std::to_string(world));
    // torchtitan's _validate.
    int64_t dps = t.dp_shard < 0 ? world / (t.dp_replicate * t.cp * t.tp * t.pp) : t.dp_shard;
    const bool ok = dps >= 1 && t.dp_replicate * dps * t.cp * t.tp * t.pp == world && (dps * t.cp * t.tp) % t.ep == 0;
    if (!ok) {
      EXPECT_THROW(apply(preset::torchtitan_recipe(t, world)), InvalidArgument);
      ++refused;
      continue;
    }
    const MeshRecipe r = preset::torchtitan_recipe(t, world);
    const BuiltMeshes b = apply(r);
    const int64_t batch = t.dp_replicate * dps, efsdp = dps * t.cp * t.tp / t.ep;
    std::vector<std::string> names_seen;
    for (const View& v : views(r)) names_seen.push_back(v.name);
    std::vector<std::string> want_views{"root", "dataloading", "loss", "dense"};
    if (t.spmd_backend == "spmd_types") want_views.push_back("spmd_dense_for_fwdbwd");
    want_views.push_back("sparse");
    if (t.spmd_backend == "spmd_types" && t.ep > 1) want_views.push_back("spmd_sparse_for_fwdbwd");
    EXPECT_EQ(names_seen, want_views);
    const std::vector<std::string> dl{"pp", "batch", "cp", "tp"};
    expect_view(b, "dataloading", dl, {t.pp, batch, t.cp, t.tp}, dl);
    EXPECT_EQ(groups_by_name(b.handles.at("loss"), "loss_mesh"), rowmajor_groups({t.pp, batch, t.cp, t.tp}, {1, 2}));
    if (t.spmd_backend == "spmd_types") {
      const std::vector<std::string> dense{"pp", "dp_replicate", "dp_shard", "cp", "tp"};
      expect_view(b, "dense", dense, {t.pp, t.dp_replicate, dps, t.cp, t.tp}, dense);
      expect_view(b, "spmd_dense_for_fwdbwd", {"dp", "cp", "tp"}, {t.pp, batch, t.cp, t.tp}, {"pp", "dp", "cp", "tp"});
    } else {
      const std::vector<std::string> dense{"pp", "dp_replicate", "fsdp", "tp"};
      expect_view(b, "dense", dense, {t.pp, t.dp_replicate, dps * t.cp, t.tp}, dense);
    }
    const std::vector<std::string> sparse{"pp", "dp_replicate", "efsdp", "ep"};
    expect_view(b, "sparse", sparse, {t.pp, t.dp_replicate, efsdp, t.ep}, sparse);
    if (t.spmd_backend == "spmd_types" && t.ep > 1) {
      expect_view(b, "spmd_sparse_for_fwdbwd", {"dp_replicate", "efsdp", "ep"}, {t.pp, t.dp_replicate, efsdp, t.ep},
                  sparse);
    }
    ++valid;
  }
  std::cout << "torchtitan: " << valid << " configurations matched, " << refused << " refused as torchtitan does\n";
  EXPECT_GT(valid, 350);
  EXPECT_GT(refused, 30);
}

TEST(Preset, HostileSpecsAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"torchtitan:tp=0", "tp=0"},
      {"torchtitan:tp=-2,dp_shard=1", "tp=-2"},
      {"torchtitan:dp_shard=-3", "dp_shard=-3"},
      {"torchtitan:tp=4611686018427387904,pp=4,dp_shard=1", "overflows"},
      {"torchtitan:tp=99999999999999999999", "tp"},
      {"torchtitan:tp=2,tp=2", "'tp' is given twice"},
      {"torchtitan:bogus=1", "unknown key 'bogus'"},
      {"torchtitan:etp=2,dp_shard=1", "etp=2"},
      {"torchtitan:spmd_backend=fsdp2,dp_shard=1", "spmd_backend='fsdp2'"},
      {"torchtitan:tp=2", "dp_shard=-1"},
      {"torchtitan:tp=x,dp_shard=1", "tp"},
      {"megatron:tp=2,dp=2,order=tp-xp", "'xp'"},
      {"megatron:tp=2,dp=2,order=tp-tp-dp", "names tp twice"},
      {"megatron:tp=2,dp=1,order=dp-pp", "the size of (tp) is (2)"},
      {"megatron:tp=2", "give --world-size or dp"},
      {"megatron:ep=0,dp=1", "ep=0"},
      {"slurm:tp=2", "expected torchtitan"},
  };
  for (const auto& [spec, needle] : bad) {
    try {
      apply(preset::recipe(spec, std::nullopt));
      ADD_FAILURE() << spec << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << spec << ": " << e.what();
    }
  }
  // Degrees that do not divide the world, named as the frameworks name them.
  EXPECT_THROW(preset::recipe("megatron:tp=4,pp=2", 12), InvalidArgument);
  EXPECT_THROW(preset::recipe("megatron:ep=8", 12), InvalidArgument);
  EXPECT_THROW(preset::recipe("torchtitan:tp=2,dp_shard=2,ep=3", 4), InvalidArgument);
  EXPECT_THROW(preset::recipe("torchtitan:tp=2,dp_shard=4", 6), InvalidArgument);
  EXPECT_THROW(preset::recipe("torchtitan:tp=2", 0), InvalidArgument);
}

}  // namespace
}  // namespace meshsim
