// meshsim/local.hpp — local mode: every rank of a world evaluated at once, in one thread.
//
//   DeviceMesh mesh = DeviceMesh::init({64, 16, 1024}, {{"dp", "cp", "tp"}});   // 2^20 ranks
//   LocalWorld world(mesh.rank_map_size());
//   LocalGroups tp(mesh, 2);                                  // every tp group, one buffer
//   auto x = LocalValue<int64_t>::affine(world.size(), 1, 1);  // rank + 1 on every rank
//   LocalValue<int64_t> sum = world.all_reduce(tp, x, ReduceOp::kSum);   // once per group
//   sum.at(5) == 1 + 2 + ... + 1024
//
// A LocalValue holds one value per rank compactly: a constant, an affine function of the rank, a
// value per group of one dim (what all_reduce and broadcast return: every member shares it), or
// dense. LocalGroups reconstructs the groups of a dim from the dim's layout and its complement
// (DeviceMesh::groups) into one contiguous buffer, with the inverse map rank -> (group, index).
// Collectives run group by group with the threaded backend's semantics: reductions combine
// members in group-rank order (so float results are bit-identical to the threaded backend's), a
// member that does not call (`absent`) fails the collective naming it (kind "departed"), and
// members that call with different counts fail it with both descriptions (kind "mismatch").
// Memory: O(world) for per-rank data and O(ndim) for the mesh.
//
// Thread safety: values are immutable; a LocalWorld is used from one thread.
#pragma once

#include <cstdint>
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "meshsim/communicator.hpp"
#include "meshsim/device_mesh.hpp"
#include "meshsim/error.hpp"
#include "meshsim/threaded_backend.hpp"

namespace meshsim {

// kMaxLocalWorld is the largest world local mode runs (2^24 ranks, the enumeration limit).
inline constexpr int64_t kMaxLocalWorld = int64_t{1} << 24;

// LocalGroups are the groups of one dim of a mesh for every rank at once.
class LocalGroups {
 public:
  LocalGroups(const DeviceMesh& mesh, int dim);
  int64_t count() const { return count_; }  // groups, in complement order
  int64_t size() const { return size_; }    // members per group
  // group g's global ranks, in group-rank order (a view into one buffer).
  std::span<const int64_t> group(int64_t g) const {
    return {ranks_.data() + g * size_, static_cast<std::size_t>(size_)};
  }
  // of is (group, index in it) of `rank`; nullopt when the rank is outside the mesh.
  std::optional<std::pair<int64_t, int64_t>> of(int64_t rank) const;
  const std::string& name() const { return name_; }
  // next_number: the number of the next collective called on these groups (#0 first), as each
  // member's communicator counts its group's collectives. Not thread-safe (LocalWorld is one
  // thread).
  uint64_t next_number() const { return calls_++; }

 private:
  mutable uint64_t calls_ = 0;
  int64_t count_ = 0, size_ = 0;
  std::vector<int64_t> ranks_;        // count_ * size_
  std::vector<int64_t> slot_of_;      // by rank: g * size_ + i, or -1
  std::string name_;
};

// LocalValue<T> is one T per rank of a world, stored compactly.
template <typename T>
class LocalValue {
 public:
  static LocalValue constant(int64_t world, T v) {
    LocalValue x(world);
    x.constant_ = v;
    return x;
  }
  // affine is a + b * rank.
  static LocalValue affine(int64_t world, T a, T b) {
    LocalValue x(world);
    x.affine_ = std::pair<T, T>{a, b};
    return x;
  }
  // per_group is one value per group of `groups`, shared by its members (`outside` elsewhere).
  static LocalValue per_group(int64_t world, std::shared_ptr<const LocalGroups> groups,
                              std::vector<T> values, T outside) {
    LocalValue x(world);
    x.groups_ = std::move(groups);
    x.dense_ = std::move(values);
    x.outside_ = outside;
    return x;
  }
  static LocalValue dense(std::vector<T> values) {
    LocalValue x(static_cast<int64_t>(values.size()));
    x.dense_ = std::move(values);
    return x;
  }

  int64_t world() const { return world_; }
  T at(int64_t rank) const {
    if (constant_) return *constant_;
    if (affine_) return static_cast<T>(affine_->first + affine_->second * static_cast<T>(rank));
    if (groups_) {
      auto where = groups_->of(rank);
      return where ? dense_[static_cast<std::size_t>(where->first)] : outside_;
    }
    return dense_[static_cast<std::size_t>(rank)];
  }
  // stored is how many values are held (1 for a constant, 2 for affine, one per group, world).
  int64_t stored() const {
    if (constant_) return 1;
    if (affine_) return 2;
    return static_cast<int64_t>(dense_.size());
  }

 private:
  explicit LocalValue(int64_t world) : world_(world) {}
  int64_t world_;
  std::optional<T> constant_;
  std::optional<std::pair<T, T>> affine_;
  std::shared_ptr<const LocalGroups> groups_;
  std::vector<T> dense_;
  T outside_{};
};

// LocalBuffers<T> is one buffer of `count` values per rank of a world, dense: rank r's buffer is
// data[r * count, (r + 1) * count). Ranks outside a collective's groups keep zeros.
template <typename T>
struct LocalBuffers {
  int64_t world = 0;
  int64_t count = 0;
  std::vector<T> data;
  LocalBuffers(int64_t w, int64_t c) : world(w), count(c), data(static_cast<std::size_t>(w * c)) {}
  std::span<T> of(int64_t rank) { return {data.data() + rank * count, static_cast<std::size_t>(count)}; }
  std::span<const T> of(int64_t rank) const {
    return {data.data() + rank * count, static_cast<std::size_t>(count)};
  }
};

// LocalCall describes how the ranks of a world deviate at one collective: ranks that do not call
// it (their program ended or skipped it) and ranks that pass another count than the rest.
struct LocalCall {
  std::set<int64_t> absent;
  std::map<int64_t, int64_t> count_of;  // rank -> the count it passes (others pass `count`)
  int64_t count = 1;
};

// LocalWorld runs collectives over LocalValues, one group at a time, counting them the way the
// threaded backend does (one per participating rank). A failure throws LocalFailure carrying the
// diagnosis (kind, ranks at fault, message), as the SPMD runner reports it.
class LocalWorld {
 public:
  explicit LocalWorld(int64_t world);
  int64_t size() const { return world_; }

  // all_reduce of one value per member over each group of `groups`; members outside the mesh
  // keep `outside` (0).
  template <typename T>
  LocalValue<T> all_reduce(const std::shared_ptr<const LocalGroups>& groups,
                           const LocalValue<T>& in, ReduceOp op, const LocalCall& call = {});
  // all_gather of one value per member: one row per group (every member receives its group's).
  template <typename T>
  std::vector<std::vector<T>> all_gather(const LocalGroups& groups, const LocalValue<T>& in,
                                         const LocalCall& call = {});
  // broadcast gives every member its group's value at group rank `root`.
  template <typename T>
  LocalValue<T> broadcast(const std::shared_ptr<const LocalGroups>& groups, const LocalValue<T>& in,
                          int64_t root, const LocalCall& call = {});
  // barrier checks that every member takes part (absent members fail it, as any collective).
  void barrier(const LocalGroups& groups, const LocalCall& call = {});
  // reduce_scatter: each member passes size * n values (n = in.count / size); member i receives
  // block i reduced over the members, in group-rank order.
  template <typename T>
  LocalBuffers<T> reduce_scatter(const LocalGroups& groups, const LocalBuffers<T>& in, ReduceOp op,
                                 const LocalCall& call = {});
  // all_to_all: member i's block j goes to member j's block i.
  template <typename T>
  LocalBuffers<T> all_to_all(const LocalGroups& groups, const LocalBuffers<T>& in,
                             const LocalCall& call = {});
  // local_ranks: every rank's index in its group of `groups` (its local rank along that dim,
  // which is also its coordinate there); -1 for ranks outside the mesh. O(world).
  LocalValue<int64_t> local_ranks(const LocalGroups& groups) const;
  // coordinates: every rank's coordinate in `mesh`, one LocalValue per dim (-1 outside).
  std::vector<LocalValue<int64_t>> coordinates(const DeviceMesh& mesh) const;
  // world_groups is the one group of every rank, in rank order.
  std::shared_ptr<const LocalGroups> world_groups() const { return world_groups_; }

  int64_t collectives() const { return collectives_; }

 private:
  // check fails the collective when a member of some group is absent or passes another count.
  // `d` describes the call as a member makes it (op, dtype, call.count, root, reduction).
  void check(const LocalGroups& groups, const CollectiveDesc& d, const LocalCall& call);
  int64_t world_;
  int64_t collectives_ = 0;
  std::shared_ptr<const LocalGroups> world_groups_;
};

// LocalFailure is how local mode stops: the diagnosis the threaded run would give.
class LocalFailure : public Error {
 public:
  explicit LocalFailure(Diagnosis d) : Error(d.message), diagnosis(std::move(d)) {}
  const char* type_name() const noexcept override { return "LocalFailure"; }
  Diagnosis diagnosis;
};

// ---- implementation of the templates -------------------------------------------------------


template <typename T>
LocalValue<T> LocalWorld::all_reduce(const std::shared_ptr<const LocalGroups>& groups,
                                     const LocalValue<T>& in, ReduceOp op, const LocalCall& call) {
  check(*groups, {CollectiveOp::kAllReduce, dtype_of<T>(), call.count, -1, op}, call);
  std::vector<T> out(static_cast<std::size_t>(groups->count()));
  for (int64_t g = 0; g < groups->count(); ++g) {
    std::span<const int64_t> members = groups->group(g);
    T acc = in.at(members[0]);
    for (std::size_t i = 1; i < members.size(); ++i) acc = combine(acc, in.at(members[i]), op);
    if (op == ReduceOp::kAvg) acc = static_cast<T>(acc / static_cast<T>(members.size()));
    out[static_cast<std::size_t>(g)] = acc;
  }
  collectives_ += groups->count() * groups->size();
  return LocalValue<T>::per_group(world_, groups, std::move(out), T{});
}

template <typename T>
std::vector<std::vector<T>> LocalWorld::all_gather(const LocalGroups& groups,
                                                   const LocalValue<T>& in,
                                                   const LocalCall& call) {
  check(groups, {CollectiveOp::kAllGather, dtype_of<T>(), call.count, -1, ReduceOp::kSum}, call);
  std::vector<std::vector<T>> out(static_cast<std::size_t>(groups.count()));
  for (int64_t g = 0; g < groups.count(); ++g) {
    std::span<const int64_t> members = groups.group(g);
    auto& row = out[static_cast<std::size_t>(g)];
    row.reserve(members.size());
    for (int64_t r : members) row.push_back(in.at(r));
  }
  collectives_ += groups.count() * groups.size();
  return out;
}

template <typename T>
LocalValue<T> LocalWorld::broadcast(const std::shared_ptr<const LocalGroups>& groups,
                                    const LocalValue<T>& in, int64_t root, const LocalCall& call) {
  if (root < 0 || root >= groups->size()) {
    throw OutOfRange("broadcast root " + std::to_string(root) + " is out of range [0, " +
                     std::to_string(groups->size()) + ")");
  }
  check(*groups, {CollectiveOp::kBroadcast, dtype_of<T>(), call.count, static_cast<int>(root), ReduceOp::kSum}, call);
  std::vector<T> out(static_cast<std::size_t>(groups->count()));
  for (int64_t g = 0; g < groups->count(); ++g) {
    out[static_cast<std::size_t>(g)] = in.at(groups->group(g)[static_cast<std::size_t>(root)]);
  }
  collectives_ += groups->count() * groups->size();
  return LocalValue<T>::per_group(world_, groups, std::move(out), T{});
}

template <typename T>
LocalBuffers<T> LocalWorld::reduce_scatter(const LocalGroups& groups, const LocalBuffers<T>& in,
                                           ReduceOp op, const LocalCall& call) {
  if (in.count % groups.size() != 0) {
    throw InvalidArgument("reduce_scatter: " + std::to_string(in.count) +
                          " values per rank do not split into " + std::to_string(groups.size()) +
                          " blocks");
  }
  check(groups, {CollectiveOp::kReduceScatter, dtype_of<T>(), in.count / groups.size(), -1, op}, call);
  const int64_t n = in.count / groups.size();
  LocalBuffers<T> out(world_, n);
  for (int64_t g = 0; g < groups.count(); ++g) {
    std::span<const int64_t> members = groups.group(g);
    for (std::size_t i = 0; i < members.size(); ++i) {
      std::span<T> dst = out.of(members[i]);
      for (int64_t e = 0; e < n; ++e) {
        const int64_t at = static_cast<int64_t>(i) * n + e;
        T acc = in.of(members[0])[static_cast<std::size_t>(at)];
        for (std::size_t m = 1; m < members.size(); ++m) {
          acc = combine(acc, in.of(members[m])[static_cast<std::size_t>(at)], op);
        }
        if (op == ReduceOp::kAvg) acc = static_cast<T>(acc / static_cast<T>(members.size()));
        dst[static_cast<std::size_t>(e)] = acc;
      }
    }
  }
  collectives_ += groups.count() * groups.size();
  return out;
}

template <typename T>
LocalBuffers<T> LocalWorld::all_to_all(const LocalGroups& groups, const LocalBuffers<T>& in,
                                       const LocalCall& call) {
  if (in.count % groups.size() != 0) {
    throw InvalidArgument("all_to_all: " + std::to_string(in.count) +
                          " values per rank do not split into " + std::to_string(groups.size()) +
                          " blocks");
  }
  check(groups, {CollectiveOp::kAllToAll, dtype_of<T>(), in.count / groups.size(), -1, ReduceOp::kSum}, call);
  const int64_t n = in.count / groups.size();
  LocalBuffers<T> out(world_, in.count);
  for (int64_t g = 0; g < groups.count(); ++g) {
    std::span<const int64_t> members = groups.group(g);
    for (std::size_t i = 0; i < members.size(); ++i) {
      for (std::size_t j = 0; j < members.size(); ++j) {
        std::span<const T> src = in.of(members[i]).subspan(j * static_cast<std::size_t>(n), static_cast<std::size_t>(n));
        std::span<T> dst = out.of(members[j]).subspan(i * static_cast<std::size_t>(n), static_cast<std::size_t>(n));
        std::copy(src.begin(), src.end(), dst.begin());
      }
    }
  }
  collectives_ += groups.count() * groups.size();
  return out;
}

}  // namespace meshsim
