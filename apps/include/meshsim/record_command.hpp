// record_command.hpp — `meshsim record -n N -- python SCRIPT ARGS...`: the user's own program run
// once per rank over PyTorch's `fake` backend (each rank a process forked from one interpreter
// that has imported torch, with the environment torchrun gives it), every rank's process groups
// and collectives written as a Flight Recorder dump, and the dumps checked across ranks as
// `meshsim trace check` checks them. python/meshsim/_record.py is the runner (built into the tool).
//
//   meshsim record -n 8 -- python train.py --steps 1
//   meshsim record -n 64 --jobs 2 --out rec --timeout 120 -- .venv/bin/python -m mypkg.train
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace meshsim::record_command {

struct Options {
  int64_t nprocs = 0;                       // the world size
  std::optional<std::string> ranks;         // the ranks recorded ("0-3,7"; default every rank)
  std::optional<int64_t> jobs;              // ranks run at once (default: the machine's cores)
  std::optional<std::string> out;           // the dumps' directory (default: a new one under $TMPDIR)
  double timeout_seconds = 300;             // each rank's deadline
  std::optional<int64_t> nproc_per_node;    // LOCAL_WORLD_SIZE (default: the world, one node)
  std::vector<std::string> preload;         // modules imported before the fork
  bool fake_tensors = false;                // run the program under FakeTensorMode
  std::string format = "text";              // or "json"
  std::vector<std::string> program;         // python SCRIPT ARGS... (or python -m MODULE ...)
};

// run records and checks; prints the report; returns 0 (every rank ended well and the check
// found nothing) or 1. Bad flags, a program that is not `python ...`, or a runner that could not
// start throw meshsim::Error.
int run(const Options& o, std::ostream& out, std::ostream& err);

// runner_source: the runner's Python source, as built into the tool.
const char* runner_source();

}  // namespace meshsim::record_command
