// universe.hpp (core-private) — the state a root mesh shares with every mesh derived from it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "meshsim/backend_config.hpp"
#include "meshsim/group_record.hpp"
#include "meshsim/torch_version.hpp"
#include "meshsim/layout.hpp"
#include "rank_map.hpp"

namespace meshsim {

// Universe: the root's description and rank map (immutable, public const), and the two things
// that grow as meshes are derived — the flatten registry and the group cache — behind methods
// that take the universe's lock. Thread safety: every method may be called from many threads.
class Universe {
 public:
  // HandedGroup is a group a root was handed (from_group): the root dim's canonical layout, its
  // config, the name every mesh of the universe calls it by (if it came with one) and the
  // ProcessGroup's own description, which PyTorch keeps.
  struct HandedGroup {
    Layout canonical;
    BackendConfig config;
    std::optional<std::string> name;
    std::string desc;
    std::optional<std::string> dim_name;  // the root's name for the dim
  };
  Universe(std::string device_type, std::optional<int64_t> world, RankMap ranks, Layout root_layout,
           MeshNames root_names, std::vector<BackendConfig> root_configs, bool init_backend = true,
           std::string default_backend = {}, std::vector<HandedGroup> handed = {},
           TorchVersion torch_version = kNewestTorch);

  const uint64_t id;  // unique within the process
  const std::string device_type;
  const std::optional<int64_t> world_size;
  const RankMap rank_map;
  const Layout root_layout;
  const MeshNames root_names;
  const std::vector<BackendConfig> root_configs;
  const bool init_backend;             // PyTorch's _init_backend: false means no process groups
  const std::string default_backend;   // the world's default backend ("" = the run's own)
  const std::vector<HandedGroup> handed;  // root dims handed by name (from_group), in dim order
  const TorchVersion torch_version;     // the PyTorch release the universe answers as

  // handed_name is the name the root was handed for (canonical dim layout, config), if any (the
  // first such dim's).
  std::optional<std::string> handed_name(const Layout& canonical, const BackendConfig& config) const;
  // handed_dim is the handed group a mesh's dim is (every dim of a from_group root, and the
  // same dim sliced out of it: same canonical layout, config and name), or null: a dim that
  // flatten or unflatten made is a group of its own even where its layout is a handed one's.
  const HandedGroup* handed_dim(const Layout& canonical, const BackendConfig& config,
                                const std::optional<std::string>& dim_name) const;

  // Flattened is one flatten registration: its name, layout as written, the layout's canonical
  // form (what identity compares) and backend config.
  struct Flattened {
    std::string name;
    Layout layout;
    Layout canonical;
    BackendConfig config;
  };
  // register_flatten records `name` -> layout, or returns the registration made before under
  // that name when its canonical layout is the same (AlreadyExists when it differs). A config
  // given now wins; otherwise the earlier registration's config is kept.
  Flattened register_flatten(const std::string& name, const Layout& layout, const Layout& canonical,
                             const std::optional<BackendConfig>& config) const;
  // find_flattened is the registration under `name`, if any.
  std::optional<Flattened> find_flattened(const std::string& name) const;
  // flattened lists the registrations in registration order.
  std::vector<Flattened> flattened() const;

  // find_or_create_group returns the cached record for (layout, config), creating it with
  // `make` on a miss (`make` runs outside the lock; the first insert wins). Counts hits/misses.
  std::shared_ptr<const GroupRecord> find_or_create_group(
      const Layout& layout, const BackendConfig& config,
      const std::function<std::shared_ptr<GroupRecord>()>& make) const;
  CacheStats stats() const;

  // record appends a group-making operation to the creation log (past kMaxCreationEvents the
  // log only counts); events is the log, ResourceExhausted once it overflowed.
  // (The event is built in place: a rank thread's stack holds no copy of it.)
  void record(GroupCreationEvent::Op op, const char* what, bool creates, int first, int count, const Layout& layout,
              const MeshNames& names, const std::vector<BackendConfig>& configs) const;
  std::vector<GroupCreationEvent> events() const;
  uint64_t events_digest() const;

 private:
  // Logged is one event as kept: a root's mesh is the universe's own root (not copied: every
  // rank thread's universe logs its root); a flatten's or unflatten's mesh is kept beside it.
  struct Logged {
    GroupCreationEvent::Op op;
    const char* what;
    bool creates;
    int first;
    int count;
    std::unique_ptr<const GroupCreationEvent> mesh;  // null for a root
  };
  mutable std::vector<Logged> events_;
  mutable bool events_overflowed_ = false;
  struct GroupKey {
    Layout layout;
    BackendConfig config;
    friend bool operator==(const GroupKey&, const GroupKey&) = default;
  };
  struct GroupKeyHash {
    std::size_t operator()(const GroupKey& k) const;
  };

  mutable std::mutex mu_;
  mutable std::vector<Flattened> flattened_;  // registration order
  mutable std::unordered_map<GroupKey, std::shared_ptr<const GroupRecord>, GroupKeyHash> groups_;
  mutable CacheStats stats_;
};

}  // namespace meshsim
