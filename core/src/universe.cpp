#include "universe.hpp"

#include <algorithm>
#include <atomic>

#include "meshsim/error.hpp"

namespace meshsim {

namespace {
uint64_t next_id() {
  static std::atomic<uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

Universe::Universe(std::string device_type, std::optional<int64_t> world, RankMap ranks,
                   Layout root_layout, MeshNames root_names, std::vector<BackendConfig> root_configs,
                   bool init_backend, std::string default_backend, std::vector<HandedGroup> handed)
    : id(next_id()),
      device_type(std::move(device_type)),
      world_size(world),
      rank_map(std::move(ranks)),
      root_layout(std::move(root_layout)),
      root_names(std::move(root_names)),
      root_configs(std::move(root_configs)),
      init_backend(init_backend),
      default_backend(std::move(default_backend)),
      handed(std::move(handed)) {}

std::optional<std::string> Universe::handed_name(const Layout& canonical, const BackendConfig& config) const {
  for (const HandedGroup& h : handed) {
    if (h.canonical == canonical && h.config == config) return h.name;
  }
  return std::nullopt;
}

std::size_t Universe::GroupKeyHash::operator()(const GroupKey& k) const {
  const std::size_t seed = k.layout.hash();
  return seed ^ (k.config.hash() + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

Universe::Flattened Universe::register_flatten(const std::string& name, const Layout& layout,
                                               const Layout& canonical,
                                               const std::optional<BackendConfig>& config) const {
  std::lock_guard lock(mu_);
  auto it = std::find_if(flattened_.begin(), flattened_.end(),
                         [&](const Flattened& f) { return f.name == name; });
  if (it == flattened_.end()) {
    flattened_.push_back(Flattened{name, layout, canonical, config.value_or(BackendConfig{})});
    return flattened_.back();
  }
  if (it->canonical != canonical) {
    throw AlreadyExists("Flatten mesh with mesh_dim_name " + name +
                        " has been created before, Please specify another valid "
                        "mesh_dim_name (registered layout " + to_string(it->layout) +
                        ", this one " + to_string(layout) + ").");
  }
  Flattened out = *it;
  if (config) out.config = *config;
  return out;
}

std::optional<Universe::Flattened> Universe::find_flattened(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = std::find_if(flattened_.begin(), flattened_.end(),
                         [&](const Flattened& f) { return f.name == name; });
  if (it == flattened_.end()) return std::nullopt;
  return *it;
}

std::vector<Universe::Flattened> Universe::flattened() const {
  std::lock_guard lock(mu_);
  return flattened_;
}

std::shared_ptr<const GroupRecord> Universe::find_or_create_group(
    const Layout& layout, const BackendConfig& config,
    const std::function<std::shared_ptr<GroupRecord>()>& make) const {
  GroupKey key{layout, config};
  {
    std::lock_guard lock(mu_);
    auto it = groups_.find(key);
    if (it != groups_.end()) {
      ++stats_.hits;
      return it->second;
    }
  }
  // Build outside the lock (it may enumerate many ranks); the first insert wins.
  std::shared_ptr<const GroupRecord> rec = make();
  std::lock_guard lock(mu_);
  auto [it, inserted] = groups_.emplace(std::move(key), std::move(rec));
  if (inserted) {
    ++stats_.misses;
  } else {
    ++stats_.hits;
  }
  stats_.size = static_cast<int64_t>(groups_.size());
  return it->second;
}

void Universe::record(GroupCreationEvent e) const {
  std::lock_guard lock(mu_);
  if (events_.size() >= kMaxCreationEvents) {
    events_overflowed_ = true;
    return;
  }
  events_.push_back(std::move(e));
}

std::vector<GroupCreationEvent> Universe::events() const {
  std::lock_guard lock(mu_);
  if (events_overflowed_) {
    throw ResourceExhausted("the mesh's universe made more than " + std::to_string(kMaxCreationEvents) +
                            " group-making operations (flatten, unflatten): its creation plan is not kept");
  }
  return events_;
}

CacheStats Universe::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace meshsim
