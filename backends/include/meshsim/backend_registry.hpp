// meshsim/backend_registry.hpp — backends by name: the one list every runner, flag and error
// message reads, and the place a new backend registers itself.
//
//   BackendRequest req{.world_size = 8, .timeout = std::chrono::seconds(5)};
//   std::shared_ptr<SpmdBackend> b = create_backend("gloo", req);   // 8 Gloo rank threads
//   req.options = GlooBackend::Options{.hostname = "10.0.0.7"};     // the backend's own settings
//   register_backend({.name = "mine", .description = "...", .create = [](const BackendRequest& r) {
//     return std::make_shared<MyBackend>(r.world_size); }});
//
// Built in (in this order): "threaded" (rank threads over shared memory), "gloo" (Gloo over
// TCP: rank threads, or ranks spread over processes), "fiber" (every rank a fiber of one thread,
// run by the backend), "nccl" (one GPU per rank; a build without NCCL refuses it when created).
//
// A request carries what every backend takes (world, the ranks run here, the store, the timeout)
// and, in `options`, the backend's own Options struct (ThreadedBackend::Options,
// GlooBackend::Options, NcclBackend::Options, FiberBackend::Options) or nothing for its
// defaults; the request's common fields override the struct's. Options of another backend's type
// are refused (InvalidArgument naming both).
//
// Thread safety: registering and creating may happen from any thread (one mutex).
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/rank_placement.hpp"
#include "meshsim/spmd_backend.hpp"
#include "meshsim/store.hpp"

namespace meshsim {

struct BackendRequest {
  int64_t world_size = 1;
  // placement: the ranks run in this process and the store the run's processes share (only a
  // backend that spans processes reads it).
  RankPlacement placement;
  std::chrono::milliseconds timeout{30000};
  std::any options;  // the backend's own Options, or empty
  // stack_bytes: each rank's stack where the backend runs ranks itself (fibers); 0: its default.
  std::size_t stack_bytes = 0;
};

struct BackendEntry {
  std::string name;
  std::string description;       // one line, for --help and errors
  bool spans_processes = false;  // its ranks may live in several processes
  int64_t max_rank_threads = 16384;  // ranks one process runs at most
  std::function<std::shared_ptr<SpmdBackend>(const BackendRequest&)> create;
  // precondition, when set, says why `ranks` ranks cannot run in this process now, the first at
  // local slot `local_rank` (NCCL: one GPU each, from that device on); nullopt when they can.
  // Runners ask before any rank starts (the tool refuses, FailedPrecondition; a test skips).
  std::function<std::optional<std::string>(int64_t ranks, int64_t local_rank)> precondition;
  // built: this build has what the backend needs (NCCL's only with -DMESHSIM_WITH_NCCL); a test
  // suite that runs every backend leaves out one that is not built.
  bool built = true;
  // rank_stack_bytes: the stack of each rank thread the runner starts for this backend when the
  // run asks for none (0: the runner's 512 KiB). NCCL's is 8 MiB: NCCL and the CUDA runtime run
  // on the rank's thread.
  std::size_t rank_stack_bytes = 0;
};

// register_backend adds a backend (AlreadyExists when the name is taken; InvalidArgument for an
// empty name or no factory).
void register_backend(BackendEntry entry);
// find_backend: the entry registered under `name`, or null.
const BackendEntry* find_backend(std::string_view name);
// create_backend builds one (InvalidArgument naming the known backends for an unknown name).
std::shared_ptr<SpmdBackend> create_backend(std::string_view name, const BackendRequest& request);
// backend_names: every registered name, built-ins first; backend_names_text: "threaded, gloo, ...".
std::vector<std::string> backend_names();
std::string backend_names_text();

[[noreturn]] void throw_wrong_options(std::string_view backend, const char* type);

// backend_options<T> is request.options as T (a default T when empty); InvalidArgument naming
// the backend when it holds another type.
template <class T>
T backend_options(const BackendRequest& request, std::string_view backend) {
  if (!request.options.has_value()) return T{};
  if (const T* t = std::any_cast<T>(&request.options)) return *t;
  throw_wrong_options(backend, request.options.type().name());
}

}  // namespace meshsim
