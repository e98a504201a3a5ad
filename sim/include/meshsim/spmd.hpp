// meshsim/spmd.hpp — run N ranks of one SPMD program as threads over a backend, and never hang.
//
//   RunReport report = run_spmd({.world_size = 8, .timeout = std::chrono::seconds(5)},
//                               [](RankContext& ctx) {
//     DeviceMesh mesh = DeviceMesh::init({2, 4}, {{"dp", "tp"}});
//     ctx.check_mesh_agreement(mesh);
//     Communicator& tp = ctx.comm(mesh, "tp");
//     int64_t me = ctx.rank();
//     std::vector<int64_t> got(tp.size());
//     tp.all_gather(std::span<const int64_t>(&me, 1), std::span<int64_t>(got));
//   });
//   if (!report.ok) std::cerr << report.summary();
//
// Never a hang: the first failure on any rank (an exception, a mismatch, a departed rank) makes
// every blocked collective on every rank fail fast naming the failed rank; a watchdog turns a
// collective that waits past the timeout into a diagnosis listing, per rank, the collective it
// waits in and the ranks that never arrived. A rank still running `grace` after the run was
// aborted (user code in an endless loop) is reported as stuck and left detached.
//
// Thread safety: run_spmd may be called from any thread; each call has its own world.
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/backend_registry.hpp"
#include "meshsim/communicator.hpp"
#include "meshsim/device_mesh.hpp"
#include "meshsim/mesh_communicators.hpp"
#include "meshsim/rank_placement.hpp"
#include "meshsim/spmd_backend.hpp"
#include "meshsim/store.hpp"

namespace meshsim {

// kMaxSpmdWorld bounds a run's world (the ranks of every process); each backend bounds the
// ranks one process runs (BackendEntry::max_rank_threads: 16,384 threads, 65,536 fibers).
inline constexpr int64_t kMaxSpmdWorld = int64_t{1} << 20;
inline constexpr std::size_t kDefaultStackBytes = 512 * 1024;
inline constexpr std::size_t kMinStackBytes = 64 * 1024, kMaxStackBytes = std::size_t{1} << 30;

struct SpmdOptions {
  int64_t world_size = 1;
  // backend: a registered name (backend_registry.hpp): "threaded" (shared memory), "gloo" (Gloo
  // over TCP), "nccl" (one GPU per rank), "fiber" (every rank a fiber of one thread), or one
  // the program registered.
  std::string backend = "threaded";
  // backend_options: the backend's own Options struct (GlooBackend::Options{.hostname = ...},
  // NcclBackend::Options{.api = ...}, FiberBackend::Options{.on_switch = ...}), or empty for
  // its defaults; the fields below override the struct's world, ranks, store and timeout.
  std::any backend_options;
  // placement: the ranks run here and the store the run's processes share; the default runs
  // every rank here as a thread. Ranks of several processes (a backend that spans processes)
  // need placement.store.
  RankPlacement placement;
  // timeout bounds every wait; the watchdog diagnoses a wait older than this.
  std::chrono::milliseconds timeout{30000};
  bool watchdog = true;
  // stack_bytes: each rank's stack (a rank thread's, or a fiber's), in [64 KiB, 1 GiB]; 0 is the
  // backend's default (BackendEntry::rank_stack_bytes: 8 MiB for NCCL, whose library runs on the
  // rank's thread), else kDefaultStackBytes (a fiber backend's own Options then keep theirs). Reserved
  // whole and committed as used; 512 KiB is ample for a rank that builds meshes and calls
  // collectives (16,384 rank threads reserve 8 GiB of address space, commit about 24 KiB each).
  // Before starting rank threads the runner refuses (ResourceExhausted) a count over what the
  // process may start: the system's and the user's thread limits, the cgroup's pids.max, the
  // address space (RLIMIT_AS) for the stacks, and free memory at 64 KiB per thread; the error
  // names the limit that binds.
  std::size_t stack_bytes = 0;
  // grace is how long the runner waits for ranks to return after an abort, counted from the
  // abort or the last rank that returned since (so thousands of rank threads unwinding on a few
  // cores are not called stuck), and at most max(grace, timeout) in all.
  std::chrono::milliseconds grace{2000};
  // interrupted, when set, is asked every watchdog period (at most 250 ms) from the thread that
  // called run_spmd; once it answers true the run is aborted ("interrupted: ...", no rank at
  // fault) and every rank fails fast, as for any failure. Python's Ctrl-C reaches a run so.
  std::function<bool()> interrupted;
};

// MeshParts are the fingerprints ranks exchange to agree on a mesh before creating its groups.
struct MeshParts {
  uint64_t shape = 0, names = 0, layout = 0, rank_map = 0;
  friend bool operator==(const MeshParts&, const MeshParts&) = default;
};
MeshParts mesh_parts(const DeviceMesh& mesh);
// differing_parts names the parts of `a` that differ from `ref`: "shape", "names", "layout",
// "rank map", in that order (what mesh_diagnosis lists).
std::vector<std::string> differing_parts(const MeshParts& a, const MeshParts& ref);

// RankContext is what each rank's function gets. Thread safety: a context belongs to its rank's
// thread (or fiber); use it only from there (its communicators and group cache are that rank's).
class RankContext {
 public:
  RankContext(std::shared_ptr<SpmdBackend> backend, int64_t rank, bool process_rank = false);
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return backend_->world_size(); }
  Communicator& world() { return *world_; }
  Backend& backend() { return *backend_; }
  MeshCommunicators& comms() { return comms_; }
  // comm is this rank's communicator along a dim of `mesh` (through the group cache).
  Communicator& comm(const DeviceMesh& mesh, int dim) { return comms_.get(mesh, dim); }
  Communicator& comm(const DeviceMesh& mesh, std::string_view dim) {
    return comms_.get(mesh, mesh.dim_index(dim));
  }
  // check_mesh_agreement exchanges mesh_parts over the world communicator (a collective every
  // rank calls); on a disagreement the run stops with a "mesh" diagnosis naming the ranks that
  // differ from the majority (or from `expected`) and the parts that differ.
  void check_mesh_agreement(const DeviceMesh& mesh, std::optional<MeshParts> expected = {});
  // fail stops the run with a diagnosis naming this rank (kind check by default).
  [[noreturn]] void fail(const std::string& message, DiagnosisKind kind = DiagnosisKind::kCheck);
  // sleep_for sleeps unless the run is aborted first (then throws Aborted).
  void sleep_for(std::chrono::milliseconds d);
  // exit_abruptly ends this rank the way a crash does, without unwinding its collectives: a
  // rank that is a whole process exits at once (status 86, after flushing stdout and stderr); a
  // rank thread over Gloo drops its connections and tells the store it exited, as a killed
  // process would; a rank thread over shared memory stops with an "exit" diagnosis.
  [[noreturn]] void exit_abruptly();
  // process_rank: this rank is the only rank of its process (launched).
  bool process_rank() const { return process_rank_; }

 private:
  std::shared_ptr<SpmdBackend> backend_;
  int64_t rank_;
  bool process_rank_ = false;
  std::shared_ptr<Communicator> world_;
  MeshCommunicators comms_;
};

// RankStatus is how one rank ended: ok, failed (at fault), aborted (stopped because another
// rank failed) or stuck (still running after the grace period). to_string: "ok", "failed",
// "aborted", "stuck".
enum class RankStatus { kOk, kFailed, kAborted, kStuck };
std::string_view to_string(RankStatus status);

struct RankReport {
  int64_t rank = 0;
  RankStatus status = RankStatus::kOk;
  std::string message;
};

struct RunReport {
  bool ok = true;
  std::string backend;
  // failures: one per rank at fault; of one diagnosis, the first kDetailedFailures carry its
  // waiting and missing lists (O(world) each), the others leave them empty.
  static constexpr std::size_t kDetailedFailures = 64;
  std::vector<Diagnosis> failures;
  std::vector<RankReport> ranks;
  int64_t collectives = 0;
  // progress: arrivals and completions the backend counted; steps: the bookkeeping records it
  // visited on the way (SpmdBackend::steps, -1 where it does not count). steps / progress is
  // the work per arrival.
  int64_t progress = 0;
  int64_t steps = -1;
  double seconds = 0;
  double connect_seconds = 0;  // gloo: time spent connecting groups, summed over local ranks
  // backend: kept alive for a run whose ranks are spread over processes, so this process keeps
  // its connections open until its peers are done too (release it after a store barrier);
  // null otherwise.
  std::shared_ptr<SpmdBackend> backend_keepalive;
  // summary: "8 ranks ok" or one line per failure.
  std::string summary() const;
};

RunReport run_spmd(const SpmdOptions& options, std::function<void(RankContext&)> fn);

// SpmdResults is a run whose ranks each produce a result: results[i] is rank placement.first_rank + i's
// (of the ranks run here), as far as it got: whole when the rank returned, partial when it
// failed or was aborted midway; nullopt for a rank still running (stuck).
template <class R>
struct SpmdResults {
  RunReport report;
  std::vector<std::optional<R>> results;
};

// run_spmd_results runs fn(ctx, result) on every rank like run_spmd; each rank fills only its
// own `result` (no lock, no table shared between ranks), and what it filled is kept even if the
// rank fails later (a count of checks passed before a fault). A stuck rank's is never read.
template <class R>
SpmdResults<R> run_spmd_results(const SpmdOptions& options, std::function<void(RankContext&, R&)> fn) {
  const int64_t first = options.placement.first_rank;
  const int64_t count = options.placement.ranks_here(options.world_size);
  // Sized only for a count run_spmd accepts (it refuses the others before any rank runs). The
  // slots are shared with the ranks: a stuck rank may still write its own after this returns.
  const bool valid = count >= 1 && count <= options.world_size && options.world_size <= kMaxSpmdWorld;
  auto slots = std::make_shared<std::vector<R>>(valid ? static_cast<std::size_t>(count) : 0);
  SpmdResults<R> out;
  out.report = run_spmd(options, [slots, first, fn = std::move(fn)](RankContext& ctx) {
    fn(ctx, (*slots)[static_cast<std::size_t>(ctx.rank() - first)]);
  });
  out.results.resize(slots->size());
  for (const RankReport& r : out.report.ranks) {
    const auto i = static_cast<std::size_t>(r.rank - first);
    if (r.status != RankStatus::kStuck) out.results[i] = std::move((*slots)[i]);
  }
  return out;
}

}  // namespace meshsim
