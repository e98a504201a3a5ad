// meshsim/group_record.hpp — what a universe (the state every mesh of one root shares) keeps
// per group: the cached GroupRecord of a dim layout under a backend config, the cache's
// counters, and the log of its group-making calls (GroupCreationEvent). DeviceMesh hands these
// out (device_mesh.hpp includes this header).
//
// Thread safety: a GroupRecord is immutable once made; table() and rows() compute on first use,
// once, from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/backend_config.hpp"
#include "meshsim/layout.hpp"
#include "meshsim/mesh_layout.hpp"

namespace meshsim {

// MeshNames are a mesh's dimension names; std::nullopt for an unnamed mesh.
using MeshNames = std::optional<std::vector<std::string>>;

// GroupRecord is one cached group of a universe: one dim layout under one backend config, a
// stable name that is the same for the same key in every run and process, and every row of the
// dim (global ranks, in complement order, each in mesh order). Backends attach communicators to
// records. The rows are listed on first use (O(world)): a rank that only needs its own
// communicator never pays for them.
struct GroupRecord {
  GroupRecord(std::string name, Layout layout, BackendConfig config,
              std::function<GroupTable()> list_rows);
  std::string name;       // stable across runs and processes for the same (layout, config)
  Layout layout;          // the canonical dim layout over rank-map positions
  BackendConfig config;   // the backend the group is created with
  // table is every group of the dim, global ranks, in one buffer (computed once, thread-safe).
  const GroupTable& table() const;
  // rows is table() as one vector per group (built from it on first use, thread-safe).
  const std::vector<std::vector<int64_t>>& rows() const;

 private:
  std::function<GroupTable()> list_rows_;
  mutable std::once_flag table_once_;
  mutable GroupTable table_;
  mutable std::once_flag rows_once_;
  mutable std::vector<std::vector<int64_t>> rows_;
};

// CacheStats counts group-cache lookups of a universe.
struct CacheStats {
  int64_t hits = 0;    // lookups that found a record
  int64_t misses = 0;  // lookups that created one
  int64_t size = 0;    // records held
};

// GroupCreationEvent is one call, in a universe, of a DeviceMesh operation that PyTorch's
// DeviceMesh creates process groups in (its root, _flatten, _unflatten), in call order: what a
// rank's process-group calls are made of (recipes' creation_plan.hpp reads them).
struct GroupCreationEvent {
  enum class Op { kRoot, kFlatten, kUnflatten };
  Op op = Op::kRoot;
  std::string what;   // root: "init_device_mesh", "DeviceMesh" or "from_group"; else the op's name
  // creates: the op makes its groups (a root with process groups that were not handed to it; a
  // flatten under a name not flattened before; an unflatten). A flatten that makes none (the
  // name flattened before, a 1-D mesh into its own name) is not logged.
  bool creates = true;
  int first = 0;      // the dims of the resulting mesh it makes groups for: [first, first + count)
  int count = 0;
  Layout layout;      // the resulting mesh
  MeshNames names;
  std::vector<BackendConfig> configs;
};

// kMaxCreationEvents bounds a universe's creation log (a program that flattens or unflattens
// more often than that has its plan refused, ResourceExhausted, rather than cut).
inline constexpr std::size_t kMaxCreationEvents = 1 << 16;

}  // namespace meshsim
