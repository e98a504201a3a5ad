#include "meshsim/backend_registry.hpp"

#include <deque>
#include <mutex>

#include "meshsim/error.hpp"
#include "meshsim/fiber_backend.hpp"
#include "meshsim/gloo_backend.hpp"
#include "meshsim/nccl_backend.hpp"
#include "meshsim/threaded_backend.hpp"

namespace meshsim {

void check_timeout(const std::string& who, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) throw InvalidArgument(who + ": timeout " + std::to_string(timeout.count()) + " ms is not > 0");
}

namespace {

// spanning_options: a process-spanning backend's Options with the request's common fields.
template <class O>
O spanning_options(const BackendRequest& r, std::string_view name) {
  auto o = backend_options<O>(r, name);
  o.world_size = r.world_size;
  o.placement = r.placement;
  o.timeout = r.timeout;
  return o;
}

// The built-in backends: the one list of names (adding a backend adds its entry here).
std::deque<BackendEntry> builtins() {
  std::deque<BackendEntry> b;
  b.push_back({"threaded", "one thread per rank over shared memory", false, 16384, [](const BackendRequest& r) {
                 auto o = backend_options<ThreadedBackend::Options>(r, "threaded");
                 o.world_size = r.world_size;
                 o.timeout = r.timeout;
                 return std::shared_ptr<SpmdBackend>(std::make_shared<ThreadedBackend>(o));
               }, {}, true, 0});
  b.push_back({"gloo", "Gloo over TCP: rank threads, or one rank per process under a launcher", true,
               GlooBackend::kMaxThreadRanks, [](const BackendRequest& r) {
                 auto o = spanning_options<GlooBackend::Options>(r, "gloo");
                 return std::shared_ptr<SpmdBackend>(std::make_shared<GlooBackend>(o));
               }, {}, true, 0});
  b.push_back({"fiber", "every rank a fiber of one thread, in turn", false, FiberBackend::kMaxRanks, [](const BackendRequest& r) {
                 auto o = backend_options<FiberBackend::Options>(r, "fiber");
                 o.world_size = r.world_size;
                 if (r.stack_bytes != 0) o.stack_bytes = r.stack_bytes;
                 return std::shared_ptr<SpmdBackend>(std::make_shared<FiberBackend>(o));
               }, {}, true, 0});
  b.push_back({"nccl", "NCCL, one GPU per rank; builds with NCCL", true, 16384,
               [](const BackendRequest& r) {
                 auto o = spanning_options<NcclBackend::Options>(r, "nccl");
                 if (!o.api) o.api = make_cuda_nccl_api();
                 return std::shared_ptr<SpmdBackend>(std::make_shared<NcclBackend>(o));
               },
               [](int64_t ranks, int64_t local_rank) { return gpu_shortfall(ranks, local_rank); },
#ifdef MESHSIM_WITH_NCCL
               true,
#else
               false,
#endif
               std::size_t{8} << 20});
  return b;
}

struct Registry {
  std::mutex mu;
  std::deque<BackendEntry> entries = builtins();  // appended only: references stay valid
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void throw_wrong_options(std::string_view backend, const char* type) {
  throw InvalidArgument("backend '" + std::string(backend) + "' was given options of another type (" + type +
                        "); give its own Options struct or none");
}

void register_backend(BackendEntry entry) {
  if (entry.name.empty()) throw InvalidArgument("register_backend: a backend needs a name");
  if (!entry.create) throw InvalidArgument("register_backend: backend '" + entry.name + "' has no factory");
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  for (const BackendEntry& e : r.entries) {
    if (e.name == entry.name) throw AlreadyExists("register_backend: a backend named '" + entry.name + "' exists");
  }
  r.entries.push_back(std::move(entry));
}

const BackendEntry* find_backend(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  for (const BackendEntry& e : r.entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::shared_ptr<SpmdBackend> create_backend(std::string_view name, const BackendRequest& request) {
  std::function<std::shared_ptr<SpmdBackend>(const BackendRequest&)> make;
  {
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    for (const BackendEntry& e : r.entries) {
      if (e.name == name) make = e.create;
    }
  }
  if (!make) {
    throw InvalidArgument("backend '" + std::string(name) + "' is not available (known: " + backend_names_text() + ")");
  }
  return make(request);
}

std::vector<std::string> backend_names() {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  std::vector<std::string> out;
  for (const BackendEntry& e : r.entries) out.push_back(e.name);
  return out;
}

std::string backend_names_text() {
  std::string s;
  for (const std::string& n : backend_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace meshsim
