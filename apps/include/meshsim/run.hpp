// meshsim/run.hpp — `meshsim run`, the main job's front: its flags become a check::Job (the job
// itself is check::check_meshes, check_meshes.hpp), its report is printed as text or JSON.
//
//   meshsim run --mesh dp=2,cp=2,tp=4 [--rank-map ..] [--slice ..] [--fault stall@3] [--format json]
//
// Planted faults (--fault KIND@RANK, repeatable) exercise every diagnostic: throw (the rank
// throws mid-run), skip (the rank skips its last collective), mismatch (the rank issues a
// different count), mesh (the rank builds a different mesh), stall (the rank sleeps past the
// timeout outside any collective).
//
// Thread safety: run may be called from any thread, one at a time per process when launched (it
// claims the process's rank in the store); a run with a stuck rank ends the process (_Exit)
// unless Options::end_process_if_stuck is false.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/check_meshes.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/placement.hpp"
#include "meshsim/recipe.hpp"

namespace meshsim::run {

struct Options {
  RecipeFlags recipe;
  std::string backend = "threaded";
  double timeout_seconds = 30;
  std::string format = "text";
  std::vector<std::string> faults;  // "KIND@RANK"
  placement::Flags placement;       // --gpus-per-host, --nvlink-domain, --require
  // --max-elements: the JSON report's element budget (the query's policy and default); a
  // report that would list more is refused before any rank starts.
  int64_t max_elements = query::kDefaultMaxAnswerElements;
  // --rank-stack-kib: each rank thread's or fiber's stack in KiB, [64, 1048576]; 0: the
  // runner's default (512).
  int64_t rank_stack_kib = 0;
  // end_process_if_stuck: a run that leaves a rank stuck (still running after the grace) ends
  // the process with its exit code once the report is written, as the tool must (a detached
  // thread may not outlive main's destructors). false keeps the process (Python): the stuck
  // threads hold the job and the backend, and the report lists them.
  bool end_process_if_stuck = true;
  // interrupted, when set, is polled while the ranks run (SpmdOptions::interrupted; local mode
  // between dims); once true the run ends failed, "interrupted: ...", within about a second.
  std::function<bool()> interrupted;
};

// run executes the job and prints its report on `out`; returns the exit code (0 every check
// passed, 1 a check or a rank failed, or a --require placement is broken: "FAILED placement:
// ..."). Bad usage or input throws meshsim::Error (exit 2).
int run(const Options& o, std::ostream& out);

// job_of is the job `o` asks for: InvalidArgument (exit 2) naming the flag for a bad one.
check::Job job_of(const Options& o);

// print_report writes `r` as `o.format` asks (text, or one JSON line).
void print_report(const Options& o, const check::MeshCheckReport& r, std::ostream& out);

// write_error_file (check::write_error_file) writes `message` to `path` in the JSON form torchrun reads from
// TORCHELASTIC_ERROR_FILE, so its "Root Cause" report shows meshsim's diagnosis, dated at
// `timestamp` (Unix seconds; default now). A failure to write is reported on stderr; the run's
// exit code stands.
void write_error_file(const std::string& path, const std::string& message,
                      std::optional<int64_t> timestamp = std::nullopt);

}  // namespace meshsim::run
