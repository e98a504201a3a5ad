#include "universe.hpp"

#include <algorithm>
#include <atomic>

#include "meshsim/digest.hpp"
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
                   bool init_backend, std::string default_backend, std::vector<HandedGroup> handed,
                   TorchVersion torch_version)
    : id(next_id()),
      device_type(std::move(device_type)),
      world_size(world),
      rank_map(std::move(ranks)),
      root_layout(std::move(root_layout)),
      root_names(std::move(root_names)),
      root_configs(std::move(root_configs)),
      init_backend(init_backend),
      default_backend(std::move(default_backend)),
      handed(std::move(handed)),
      torch_version(torch_version) {}

std::optional<std::string> Universe::handed_name(const Layout& canonical, const BackendConfig& config) const {
  for (const HandedGroup& h : handed) {
    if (h.name && h.canonical == canonical && h.config == config) return h.name;
  }
  return std::nullopt;
}

const Universe::HandedGroup* Universe::handed_dim(const Layout& canonical, const BackendConfig& config,
                                                  const std::optional<std::string>& dim_name) const {
  for (const HandedGroup& h : handed) {
    if (h.canonical == canonical && h.config == config && h.dim_name == dim_name) return &h;
  }
  return nullptr;
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

void Universe::record(GroupCreationEvent::Op op, const char* what, bool creates, int first, int count,
                      const Layout& layout, const MeshNames& names, const std::vector<BackendConfig>& configs) const {
  std::unique_ptr<GroupCreationEvent> mesh;
  if (op != GroupCreationEvent::Op::kRoot) {
    mesh = std::make_unique<GroupCreationEvent>();
    mesh->layout = layout;
    mesh->names = names;
    mesh->configs = configs;
  }
  std::lock_guard lock(mu_);
  if (events_.size() >= kMaxCreationEvents) {
    events_overflowed_ = true;
    return;
  }
  events_.push_back(Logged{op, what, creates, first, count, std::move(mesh)});
}

std::vector<GroupCreationEvent> Universe::events() const {
  std::lock_guard lock(mu_);
  if (events_overflowed_) {
    throw ResourceExhausted("the mesh's universe made more than " + std::to_string(kMaxCreationEvents) +
                            " group-making operations (flatten, unflatten): its creation plan is not kept");
  }
  std::vector<GroupCreationEvent> out;
  out.reserve(events_.size());
  for (const Logged& l : events_) {
    GroupCreationEvent& e = out.emplace_back();
    e.op = l.op;
    e.what = l.what;
    e.creates = l.creates;
    e.first = l.first;
    e.count = l.count;
    e.layout = l.mesh ? l.mesh->layout : root_layout;
    e.names = l.mesh ? l.mesh->names : root_names;
    e.configs = l.mesh ? l.mesh->configs : root_configs;
  }
  return out;
}

uint64_t Universe::events_digest() const {
  std::lock_guard lock(mu_);
  Fnv1a f;
  f.u64(events_overflowed_);
  for (const Logged& e : events_) {
    f.u64(static_cast<uint64_t>(e.op));
    f.str(e.what);
    f.u64(e.creates);
    f.u64(static_cast<uint64_t>(e.first));
    f.u64(static_cast<uint64_t>(e.count));
    const Layout& layout = e.mesh ? e.mesh->layout : root_layout;
    const MeshNames& names = e.mesh ? e.mesh->names : root_names;
    const std::vector<BackendConfig>& configs = e.mesh ? e.mesh->configs : root_configs;
    f.u64(layout.hash());
    f.u64(names.has_value());
    if (names) {
      for (const std::string& n : *names) f.str(n);
    }
    f.u64(configs.size());
    for (const BackendConfig& c : configs) f.u64(c.fingerprint());
  }
  return f.value();
}

CacheStats Universe::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace meshsim
