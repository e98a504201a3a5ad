// meshsim/check_meshes.hpp — the main job as a library call: every rank builds the recipe's
// meshes and checks, for every dim of every mesh, its group against all_gather of ranks and an
// all_reduce of known values over that dim's communicator, then a global agreement step.
//
//   check::Job job{.recipe = recipe_from_flags({.mesh = "dp=2,cp=2,tp=4"}), .engine = "threaded"};
//   (a bad recipe is refused by check_meshes, of its error's type, naming `origin` when given)
//   job.faults = check::parse_faults({"stall@3"}, job.recipe.world_size);
//   check::MeshCheckReport r = check::check_meshes(job);   // r.ok, r.failures, r.seen
//
// The check program is written once (check/src/program.hpp) and run by one of two engines: the
// per-rank SPMD engine over any registered backend (a thread, fiber or process per rank), and
// LocalWorld (`local`: every rank at once in one thread, up to 2^24 ranks). Both are entries of
// one name table (engines()), which --help, errors and Python read.
//
// Planted faults (Fault) exercise every diagnostic: throw (the rank throws mid-run), skip (the
// rank skips its last collective), mismatch (the rank issues a different count), mesh (the rank
// builds a different mesh), stall (the rank sleeps past the timeout outside any collective),
// exit (the rank's thread or process ends abruptly), reorder (the rank creates its process groups
// in another order than PyTorch's DeviceMesh does: its first two dims' creations swapped).
//
// Launched (a backend that spans processes, and a launcher's variables in the environment): this
// process runs its one rank, joins the job's store, and the processes exchange their typed
// results; rank 0's report is the whole job's, the others report their own groups.
//
// Thread safety: check_meshes may be called from any thread, one at a time per process when
// launched (it claims the process's rank in the store). A report with stuck ranks leaves their
// threads running (they hold what they use); the caller decides whether the process ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshsim/device_mesh.hpp"
#include "meshsim/placement.hpp"
#include "meshsim/query.hpp"
#include "meshsim/recipe.hpp"
#include "meshsim/spmd.hpp"

namespace meshsim::check {

// ---- engines ----

struct EngineEntry {
  std::string name;
  std::string description;     // one line, for --help and errors
  bool lockstep = false;       // every rank at once in one thread (local): no stall or exit
  bool spans_processes = false;
  int64_t max_ranks = 0;       // ranks one process runs at most
};

// engines: every registered backend (the SPMD engine over it), then `local`.
std::vector<EngineEntry> engines();
// find_engine: the entry of `name`, or nullopt.
std::optional<EngineEntry> find_engine(std::string_view name);
// engine_names_text: "threaded, gloo, fiber, nccl, local".
std::string engine_names_text();

// ---- faults ----

enum class FaultKind { kThrow, kSkip, kMismatch, kMesh, kStall, kExit, kReorder };

struct Fault {
  FaultKind kind = FaultKind::kThrow;
  int64_t rank = 0;
  bool operator==(const Fault&) const = default;
};

// to_string: "throw", "skip", "mismatch", "mesh", "stall", "exit", "reorder".
std::string_view to_string(FaultKind k);

// parse_faults reads "KIND@RANK" specs (--fault) for a world of `world` ranks: InvalidArgument
// naming the spec for a bad kind or rank, OutOfRange for a rank past the world, and for a fault
// no peer could observe with one rank.
std::vector<Fault> parse_faults(const std::vector<std::string>& specs, int64_t world);

// ---- the job and its report ----

// kShownGroups is how many groups per dim a summary keeps (Job::every_group false); kListedRanks
// how many ranks a report lists for one diagnosis, the rest counted.
inline constexpr int64_t kShownGroups = 8;
inline constexpr std::size_t kListedRanks = 64;

struct Job {
  MeshRecipe recipe;
  // origin names the recipe in its errors ("--recipe 'f.json'": recipe_origin), or "".
  std::string origin;
  std::string engine = "threaded";  // an entry of engines()
  std::vector<Fault> faults;
  std::chrono::milliseconds timeout{30000};
  // hosts: groups on hosts and the rules each group must keep (placement::from_flags); none:
  // not placed.
  std::optional<placement::Hosts> hosts;
  // every_group: the report keeps every group of every dim (refused, ResourceExhausted, when
  // that is over max_elements); false: the first kShownGroups per dim.
  bool every_group = false;
  int64_t max_elements = query::kDefaultMaxAnswerElements;
  std::size_t stack_bytes = 0;  // each rank thread's or fiber's stack; 0: the engine's default
  // interrupted, when set, is polled while the ranks run; once true the job ends failed,
  // "interrupted: ...", within about a second.
  std::function<bool()> interrupted;
};

struct MeshCheckReport {
  bool ok = true;
  std::string engine;
  int64_t world_size = 0;
  std::vector<Diagnosis> failures;  // one per rank at fault
  std::vector<RankReport> stuck;    // ranks still running after the grace
  int64_t checks = 0;               // checks passed (this rank's own when `own`)
  int64_t expected_checks = 0;      // what the recipe predicts (this rank's own when launched and not the reporter)
  int64_t collectives = 0;
  double seconds = 0;
  // meshes: the root, then one per step; step_names[k]: step k+1's `let` name, if any.
  std::vector<DeviceMesh> meshes;
  std::vector<std::optional<std::string>> step_names;
  std::vector<View> views;
  // seen[mesh][dim]: the groups as gathered over the backend, in the dim's group order (the
  // first kShownGroups, or every group), when ok.
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> seen;
  std::optional<placement::Hosts> hosts;
  std::vector<std::string> misplaced;  // broken placement rules, one line each
  std::vector<std::string> warnings;   // the recipe's (BuiltMeshes::warnings), in step order
  // Launched: this process's rank and launcher; own: this report lists the rank's own groups
  // only (rank 0 reports the whole job).
  std::optional<int64_t> rank;
  std::string launcher;
  bool own = false;

  bool passed() const { return ok && misplaced.empty(); }
};

// check_meshes runs the job. Bad input (recipe, faults, engine, limits) throws meshsim::Error
// before any rank starts; a check or rank that fails is in the report.
MeshCheckReport check_meshes(const Job& job);

// report_json is the report as one JSON tree: ok, backend, world_size, meshes (each with
// groups_by_dim, and placement when placed), views, checks, collectives, seconds, failures (at
// most kListedRanks, failures_count says how many), rank (a launched rank's own report),
// placement_failures (when placed). `meshsim run --format json` prints it; meshsim.run returns it.
nlohmann::json report_json(const MeshCheckReport& r);

// write_error_file writes `message` to `path` in the JSON form torchrun reads from
// TORCHELASTIC_ERROR_FILE, so its "Root Cause" report shows meshsim's diagnosis, dated at
// `timestamp` (Unix seconds; default now). A failure to write is reported on stderr.
void write_error_file(const std::string& path, const std::string& message,
                      std::optional<int64_t> timestamp = std::nullopt);

}  // namespace meshsim::check
