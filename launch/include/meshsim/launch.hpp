// meshsim/launch.hpp — `meshsim launch`: start (or join) a store and N processes of one program.
//
//   meshsim launch -n 4 -- ./my_trainer --steps 10
//   meshsim launch -n 8 --store 10.0.0.1:29500 --world 16 --rank-offset 8 -- ./my_trainer   # host 2
//
// Each process gets MESHSIM_RANK, MESHSIM_WORLD_SIZE, MESHSIM_LOCAL_RANK and MESHSIM_STORE
// (host:port), and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, in its
// environment (MESHSIM_STORE_TOKEN too with --token-file). Its output lines are prefixed with
// "[rank R] ". When one process fails (a non-zero exit or a signal), the others get
// report_seconds to end by themselves (meshsim's ranks notice the failure and print a
// diagnosis naming the rank), then are stopped (SIGTERM, then SIGKILL after a grace period);
// the launcher exits non-zero naming the first rank that failed.
// Without --store, the launcher serves the store itself on 127.0.0.1 for the job's lifetime.
//
// Thread safety: run installs process-wide handlers for SIGINT, SIGTERM and SIGHUP while it runs
// (restored on return): one run per process at a time.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace meshsim::launch {

struct Options {
  int64_t nprocs = 1;
  std::string store;                 // host:port to join; empty: serve one on 127.0.0.1
  std::optional<int64_t> world;      // default: nprocs
  int64_t rank_offset = 0;
  std::string token_file;
  double timeout_seconds = 0;        // 0: none
  double report_seconds = 10;        // first failure to SIGTERM: the others report and end first
  double grace_seconds = 5;          // SIGTERM to SIGKILL
  std::vector<std::string> program;  // argv
};

// run starts the job and waits for it; returns the exit code (0 when every process exited 0).
// Bad usage throws meshsim::Error (exit 2).
int run(const Options& o, std::ostream& out, std::ostream& err);

}  // namespace meshsim::launch
