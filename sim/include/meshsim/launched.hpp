// meshsim/launched.hpp — how one process of a launched SPMD run (one rank per process, meeting
// through a Store) ends: it publishes its rank's result, meets every other process at a store
// barrier before it closes its connections, and rank 0 gathers every rank's result.
//
//   SpmdResults<std::string> run = run_spmd_results<std::string>(options, program);  // one rank here
//   LaunchedEnd end = finish_launched({.store = store, .prefix = options.placement.prefix,
//                                      .world_size = n, .rank = rank, .timeout = t},
//                                     run.report, run.results[0]);
//   // end.ok, end.failures; end.results: every rank's on rank 0, this rank's own elsewhere.
//
// Keys: "<prefix>/result/<rank>", "<prefix>/done" (a counter), "<prefix>/all_done",
// "<prefix>/left" (a counter the process serving the store may wait on), and the run's
// "<prefix>/failure" (the diagnosis a backend published), which every waiting process adopts.
//
// Every wait is bounded: the barrier by 2 × timeout + 5 s (longer than a collective's deadline
// plus the peers' census, so a rank that skipped a collective hears the peers' diagnosis rather
// than timing out here), each result read by `timeout`.
//
// Thread safety: call from one thread per process, after run_spmd returned.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/spmd.hpp"
#include "meshsim/store.hpp"

namespace meshsim {

struct LaunchedJob {
  std::shared_ptr<Store> store;
  std::string prefix;  // the run's keys (SpmdOptions::placement.prefix)
  int64_t world_size = 1;
  int64_t rank = 0;  // this process's rank
  std::chrono::milliseconds timeout{30000};
  // on_done runs once this rank's work is done, before the barrier (e.g. to withdraw a crash
  // will: an exit from there on is no crash).
  std::function<void()> on_done;
};

struct LaunchedEnd {
  bool ok = true;
  std::vector<Diagnosis> failures;  // this process's report's, or the run's published diagnosis
  // When ok: on rank 0 every rank's result in rank order; on the others, this rank's only.
  std::vector<std::string> results;
};

// finish_launched ends this process's part of the run whose report is `report` (its
// backend_keepalive is released once every process is past its collectives); `result` is what
// this rank publishes (nullopt: none, the run failed here).
LaunchedEnd finish_launched(const LaunchedJob& job, RunReport& report, const std::optional<std::string>& result);

}  // namespace meshsim
