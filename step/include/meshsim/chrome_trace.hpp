// meshsim/chrome_trace.hpp — a checked step's programs as Chrome/Perfetto trace JSON (loads in
// ui.perfetto.dev and chrome://tracing): a thread per rank, an event per collective, send or
// receive in program order, with its group, view, dim, bytes, dtype, phase and place in the step.
//
//   nlohmann::json t = trace_json(run, traced_ranks(run));   // what `meshsim step --trace` writes
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace meshsim::step {

struct StepRun;

// trace_json is Chrome/Perfetto trace JSON of `ranks`' programs (at most kMaxTracedRanks ranks
// and kMaxTracedEvents events in all; ResourceExhausted past them; OutOfRange for a rank
// outside the world).
inline constexpr int64_t kMaxTracedRanks = 4096;
inline constexpr int64_t kMaxTracedEvents = int64_t{1} << 18;
nlohmann::json trace_json(const StepRun& run, const std::vector<int64_t>& ranks);
// traced_ranks: --ranks (every rank for "all"), else the reported rank.
std::vector<int64_t> traced_ranks(const StepRun& run);

}  // namespace meshsim::step
