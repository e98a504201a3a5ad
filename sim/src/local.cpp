#include "meshsim/local.hpp"

#include <algorithm>
#include <numeric>

namespace meshsim {

LocalGroups::LocalGroups(const DeviceMesh& mesh, int dim) {
  name_ = mesh.to_string() + " dim " + mesh.dim_name(dim);
  // The groups of the dim from its layout and complement, in complement order, in one buffer.
  GroupTable table = mesh.group_table(dim);
  count_ = table.count;
  size_ = table.size;
  ranks_ = std::move(table.ranks);
  int64_t hi = -1;
  for (int64_t r : ranks_) hi = std::max(hi, r);
  slot_of_.assign(static_cast<std::size_t>(hi + 1), -1);
  for (std::size_t s = 0; s < ranks_.size(); ++s) slot_of_[static_cast<std::size_t>(ranks_[s])] = static_cast<int64_t>(s);
}

std::optional<std::pair<int64_t, int64_t>> LocalGroups::of(int64_t rank) const {
  if (rank < 0 || rank >= static_cast<int64_t>(slot_of_.size())) return std::nullopt;
  const int64_t s = slot_of_[static_cast<std::size_t>(rank)];
  if (s < 0) return std::nullopt;
  return std::pair<int64_t, int64_t>{s / size_, s % size_};
}

LocalValue<int64_t> LocalWorld::local_ranks(const LocalGroups& groups) const {
  std::vector<int64_t> v(static_cast<std::size_t>(world_), -1);
  for (int64_t g = 0; g < groups.count(); ++g) {
    std::span<const int64_t> members = groups.group(g);
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i] < 0 || members[i] >= world_) {
        throw OutOfRange("local_ranks: rank " + std::to_string(members[i]) + " of dim " + groups.name() +
                         " is outside the local world of " + std::to_string(world_));
      }
      v[static_cast<std::size_t>(members[i])] = static_cast<int64_t>(i);
    }
  }
  return LocalValue<int64_t>::dense(std::move(v));
}

std::vector<LocalValue<int64_t>> LocalWorld::coordinates(const DeviceMesh& mesh) const {
  std::vector<LocalValue<int64_t>> out;
  for (int d = 0; d < mesh.ndim(); ++d) out.push_back(local_ranks(LocalGroups(mesh, d)));
  return out;
}

LocalWorld::LocalWorld(int64_t world) : world_(world) {
  if (world < 1) throw InvalidArgument("local world size " + std::to_string(world) + " is not >= 1");
  if (world > kMaxLocalWorld) {
    throw InvalidArgument("local world size " + std::to_string(world) + " exceeds the limit of " +
                          std::to_string(kMaxLocalWorld) + " ranks");
  }
  std::vector<int64_t> shape{world};
  world_groups_ = std::make_shared<const LocalGroups>(DeviceMesh::init(shape, std::vector<std::string>{"world"}), 0);
}

void LocalWorld::barrier(const LocalGroups& groups, const LocalCall& call) {
  check(groups, {CollectiveOp::kBarrier, DType::kInt64, 0, -1, ReduceOp::kSum}, call);
  collectives_ += groups.count() * groups.size();
}

void LocalWorld::check(const LocalGroups& groups, const CollectiveDesc& d, const LocalCall& call) {
  const uint64_t number = groups.next_number();
  for (int64_t r : call.absent) {
    auto where = groups.of(r);
    if (!where) continue;
    throw LocalFailure(departed_diagnosis({r}, collective_label(d, number), groups.group(where->first)));
  }
  if (call.count_of.empty()) return;
  // Per group: the members whose count differs from the group's most common count.
  std::set<int64_t> seen_groups;
  for (const auto& [r, count] : call.count_of) {
    auto where = groups.of(r);
    if (!where || !seen_groups.insert(where->first).second) continue;
    std::span<const int64_t> members = groups.group(where->first);
    std::map<int64_t, std::vector<int64_t>> by_count;
    for (int64_t m : members) {
      auto it = call.count_of.find(m);
      by_count[it == call.count_of.end() ? call.count : it->second].push_back(m);
    }
    if (by_count.size() < 2) continue;
    std::vector<std::pair<std::string, std::vector<int64_t>>> calls;
    for (auto& [c, ranks] : by_count) {
      CollectiveDesc called = d;
      called.count = c;
      calls.emplace_back(called.to_string(), std::move(ranks));
    }
    throw LocalFailure(mismatch_diagnosis("#" + std::to_string(number), members, calls));
  }
}

}  // namespace meshsim
