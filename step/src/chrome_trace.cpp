// The Chrome/Perfetto writer (chrome_trace.hpp): the traced ranks' programs, faults applied,
// as trace events.
#include "meshsim/chrome_trace.hpp"

#include <map>
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/step_job.hpp"
#include "meshsim/step_program.hpp"

namespace meshsim::step {

namespace {

// members_of: "tp [16, 17]", the first 16 members of a larger group then its size.
std::string members_of(const Job& job, Dim d, int64_t rank) {
  const Parallel& p = job.parallel;
  const int64_t n = dim_size(p, d);
  std::string s = std::string(dim_label(job, d)) + " [";
  for (int64_t k = 0; k < n && k < 16; ++k) s += (k ? ", " : "") + std::to_string(group_member(p, d, rank, k));
  if (n > 16) s += ", ... (" + std::to_string(n) + " ranks)";
  return s + "]";
}

}  // namespace

std::vector<int64_t> traced_ranks(const StepRun& run) {
  std::vector<int64_t> traced = run.options.ranks;
  const int64_t world = run.report.world_size;
  if (run.options.all_ranks) {
    if (world > kMaxTracedRanks) {
      throw ResourceExhausted("--trace with --ranks all over " + std::to_string(world) + " ranks: name at most " +
                              std::to_string(kMaxTracedRanks));
    }
    for (int64_t i = 0; i < world; ++i) traced.push_back(i);
  }
  if (traced.empty()) traced.push_back(run.options.rank);
  return traced;
}

nlohmann::json trace_json(const StepRun& run, const std::vector<int64_t>& ranks) {
  if (static_cast<int64_t>(ranks.size()) > kMaxTracedRanks) {
    throw ResourceExhausted("--trace of " + std::to_string(ranks.size()) + " ranks: name at most " +
                            std::to_string(kMaxTracedRanks));
  }
  const Job& job = run.job;
  // The programs by pp coordinate (a rank's is its coordinate's, a fault aside), counted first.
  std::map<int64_t, std::vector<Event>> by_pp;
  int64_t total = 0;
  for (int64_t rank : ranks) {
    if (rank < 0 || rank >= run.report.world_size) {
      throw OutOfRange("traced rank " + std::to_string(rank) + " is out of range [0, " + std::to_string(run.report.world_size) + ")");
    }
    const int64_t pp = pp_coordinate(job.parallel, rank);
    auto it = by_pp.find(pp);
    if (it == by_pp.end()) it = by_pp.emplace(pp, program(job, run.report.layout, pp)).first;
    total += static_cast<int64_t>(it->second.size());
    if (total > kMaxTracedEvents) {
      throw ResourceExhausted("--trace of " + std::to_string(ranks.size()) + " ranks holds over " +
                              std::to_string(kMaxTracedEvents) + " events: trace fewer ranks");
    }
  }
  nlohmann::json events = nlohmann::json::array();
  for (int64_t rank : ranks) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", rank},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
    std::vector<Event> prog = by_pp.at(pp_coordinate(job.parallel, rank));
    for (const Fault& f : run.options.faults) {
      if (f.rank == rank) apply_fault(job, f, prog);
    }
    const auto pipeline = group_members(job.parallel, Dim::kPp, rank);
    std::map<Dim, std::string> group_text;  // this rank's group on each dim, named once
    auto group_of = [&](Dim d) -> const std::string& {
      auto it = group_text.find(d);
      if (it == group_text.end()) it = group_text.emplace(d, members_of(job, d, rank)).first;
      return it->second;
    };
    int64_t ts = 0;
    for (const Event& e : prog) {
      nlohmann::json args{{"group", group_of(e.dim)}, {"view", std::string(view_name(e.dim))},
                          {"dim", std::string(dim_label(job, e.dim))}, {"bytes", e.bytes},
                          {"dtype", std::string(dtype_name(e.dtype))}, {"phase", std::string(phase_name(e.phase))},
                          {"what", e.what}};
      if (e.stage >= 0) args["stage"] = e.stage;
      if (e.layer >= 0) args["layer"] = e.layer;
      if (e.microbatch >= 0) args["microbatch"] = e.microbatch;
      if (e.peer >= 0) args["peer"] = pipeline[static_cast<std::size_t>(e.peer)];
      if (e.recompute) args["recompute"] = true;
      if (e.routed) args["routed"] = true;  // the bytes follow the routing: the balanced share
      if (e.batch >= 0) args["batch"] = e.batch;  // posted with the rank's other events of this batch
      events.push_back({{"name", std::string(op_name(e.op)) + " " + std::string(dim_label(job, e.dim))},
                        {"cat", std::string(phase_name(e.phase))}, {"ph", "X"}, {"ts", ts++}, {"dur", 1},
                        {"pid", 0}, {"tid", rank}, {"args", std::move(args)}});
    }
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

}  // namespace meshsim::step
