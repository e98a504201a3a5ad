#include "meshsim/plan_check.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "meshsim/error.hpp"
#include "meshsim/step_program.hpp"

namespace meshsim::trace {

namespace {

using step::Dim;
using step::Event;
using step::Op;

// The operation a record names, in the plan's terms; "" when it is not a step event.
std::string_view op_kind(const std::string& op) {
  auto has = [&](const char* s) { return op.find(s) != std::string::npos; };
  if (op == "send" || op == "recv") return op;
  if (has("barrier") || op == "coalesced") return "";
  if (has("all_gather") || has("allgather")) return "all_gather";
  if (has("reduce_scatter")) return "reduce_scatter";
  if (has("all_reduce") || has("allreduce")) return "all_reduce";
  if (has("all_to_all") || has("alltoall")) return "all_to_all";
  return op;  // broadcast, reduce, gather, ...: compared by name (the plan has none)
}

int64_t dtype_bytes(const std::string& d) {
  if (d == "BFloat16" || d == "Half" || d == "Short") return 2;
  if (d == "Float" || d == "Int") return 4;
  if (d == "Double" || d == "Long") return 8;
  if (d == "Byte" || d == "Char" || d == "Bool") return 1;
  return 0;
}

std::string_view plan_dtype(step::DType t) {
  switch (t) {
    case step::DType::kBF16: return "BFloat16";
    case step::DType::kF32: return "Float";
    case step::DType::kI64: return "Long";
    case step::DType::kI32: return "Int";
  }
  return "?";
}

int64_t bytes_of(const std::vector<std::vector<int64_t>>& sizes, const std::vector<std::string>& dtypes) {
  int64_t total = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    int64_t n = 1;
    for (int64_t d : sizes[k]) {
      if (d != 0 && n > INT64_MAX / d) return -1;
      n *= d;
    }
    const int64_t w = dtype_bytes(k < dtypes.size() ? dtypes[k] : (dtypes.empty() ? "" : dtypes.back()));
    if (w == 0 || n > INT64_MAX / w || total > INT64_MAX - n * w) return -1;
    total += n * w;
  }
  return total;
}

const std::vector<int64_t> kNoRanks;

// A record reduced to what the plan fixes. Groups are pointers into the dump's pg_config and the
// plan's per-dim lists, names views of the record's and the plan's own: a record or event of a
// 2^22-rank group copies nothing, and no text is made unless the record is reported.
struct Rec {
  const Entry* e = nullptr;
  std::string_view op;  // op_kind
  const std::vector<int64_t>* group = &kNoRanks;  // members (collectives): the dump's pg_config list, shared
  int64_t peer = -1;    // send/recv: the peer's global rank
  std::string_view dtype;
  int64_t bytes = -1;
  bool gloo = false;  // a Gloo record
};

struct Planned {
  const Event* e = nullptr;
  std::string_view op;
  const std::vector<int64_t>* group = &kNoRanks;
  int64_t peer = -1;
  std::string_view dtype;
};

// Same: whether a record is a planned event; two lists of members are compared once.
class Same {
 public:
  bool operator()(const Rec& r, const Planned& p) {
    const bool op = r.op == p.op || (r.gloo && r.op == "all_reduce" && p.op == "reduce_scatter");
    // A routed all-to-all's bytes are the tokens the router sent: any count is the plan's.
    if (!op || r.dtype != p.dtype || (p.e->routed ? r.bytes < 0 : r.bytes != p.e->bytes)) return false;
    if (r.op == "send" || r.op == "recv") return r.peer == p.peer;
    if (r.group == p.group) return true;
    if (r.group->size() != p.group->size()) return false;
    auto [it, fresh] = equal_.try_emplace({r.group, p.group}, false);
    if (fresh) it->second = *r.group == *p.group;
    return it->second;
  }

 private:
  std::map<std::pair<const std::vector<int64_t>*, const std::vector<int64_t>*>, bool> equal_;
};

std::string members_text(const std::vector<int64_t>& g) {
  std::string s = "[";
  for (std::size_t k = 0; k < g.size() && k < 16; ++k) s += (k ? ", " : "") + std::to_string(g[k]);
  if (g.size() > 16) s += ", ... (" + std::to_string(g.size()) + " ranks)";
  return s + "]";
}

std::string group_text(const Rec& r) {
  const Entry& e = *r.e;
  return "group '" + e.group.substr(0, 40) + "'" + (e.desc.empty() ? "" : " (" + e.desc.substr(0, 40) + ")") + " " +
         members_text(*r.group);
}

// config_of: the group of that name the dump lists (the last, as a dict keeps), or null. A dump
// lists a few groups: looked up in place, no index built per dump.
const GroupConfig* config_of(const Dump& d, const std::string& name) {
  for (auto g = d.groups.rbegin(); g != d.groups.rend(); ++g) {
    if (g->name == name) return &*g;
  }
  return nullptr;
}

}  // namespace

PlanReport check_against_plan(const std::vector<Dump>& dumps, const step::StepRun& plan) {
  const step::Job& job = plan.job;
  const step::Parallel& par = job.parallel;
  const int64_t world = plan.report.world_size;
  PlanReport out;
  std::map<int64_t, std::vector<Event>> by_pp;
  // Groups no pg_config lists (Gloo's dumps): members from the dumps whose records name them,
  // the default group over the plan's world (as the cross-rank check infers them).
  std::map<std::string, std::vector<int64_t>> unlisted;
  {
    std::map<std::string, std::set<int64_t>> named;
    for (const Dump& d : dumps) {
      const Text* last = nullptr;  // a dump's records name few groups, mostly one after another alike
      for (const Entry& e : d.entries) {
        if (last && *last == e.group) continue;
        last = &e.group;
        if (!config_of(d, e.group)) named[e.group].insert(d.rank);
      }
    }
    for (auto& [name, ranks] : named) {
      auto& v = unlisted[name];
      if (name == "0") {
        for (int64_t r = 0; r < world; ++r) v.push_back(r);
      } else {
        v.assign(ranks.begin(), ranks.end());
      }
    }
  }
  // Gloo's Flight Recorder records no send or receive (batch_isend_irecv's): when no dump holds
  // one, the plan's are not compared.
  const bool p2p_recorded = std::any_of(dumps.begin(), dumps.end(), [](const Dump& d) {
    return std::any_of(d.entries.begin(), d.entries.end(), [](const Entry& e) { return e.op == "send" || e.op == "recv"; });
  });
  bool p2p_planned = false;
  for (const Dump& d : dumps) {
    if (d.rank >= world) {
      throw OutOfRange("dump '" + d.path + "' is rank " + std::to_string(d.rank) + ", outside the plan's " +
                       std::to_string(world) + " ranks");
    }
    const int64_t pp = step::pp_coordinate(par, d.rank);
    auto it = by_pp.find(pp);
    if (it == by_pp.end()) it = by_pp.emplace(pp, step::program(job, plan.report.layout, pp)).first;
    const std::vector<Event>& prog = it->second;
    if (prog.empty()) continue;
    // The plan, each event with its group's members (or its peer).
    std::map<Dim, std::vector<int64_t>> groups;
    std::vector<Planned> planned;
    planned.reserve(prog.size());
    const auto pipeline = step::group_members(par, Dim::kPp, d.rank);
    for (const Event& e : prog) {
      if (!p2p_recorded && (e.op == Op::kSend || e.op == Op::kRecv)) {
        p2p_planned = true;
        continue;
      }
      Planned p;
      p.e = &e;
      p.op = step::op_name(e.op);
      p.dtype = plan_dtype(e.dtype);
      if (e.op == Op::kSend || e.op == Op::kRecv) {
        p.peer = pipeline.at(static_cast<std::size_t>(e.peer));
      } else {
        auto g = groups.find(e.dim);
        if (g == groups.end()) g = groups.emplace(e.dim, step::group_members(par, e.dim, d.rank)).first;
        p.group = &g->second;
      }
      planned.push_back(std::move(p));
    }
    // The records, reduced; group members from the rank's own pg_config.
    std::vector<Rec> recs;
    recs.reserve(d.entries.size());
    const Text* last_name = nullptr;
    const std::vector<int64_t>* last_group = &kNoRanks;
    for (const Entry& e : d.entries) {
      Rec r;
      r.e = &e;
      r.op = op_kind(e.op);
      if (r.op.empty()) continue;
      if (!last_name || *last_name != e.group) {
        last_name = &e.group;
        last_group = &kNoRanks;
        if (const GroupConfig* c = config_of(d, e.group)) {
          last_group = &c->ranks.get();
        } else if (auto u = unlisted.find(e.group); u != unlisted.end()) {
          last_group = &u->second;
        }
      }
      r.group = last_group;
      // Gloo runs a reduce-scatter as an all-reduce of the whole input and records it so
      // (profiling name gloo:all_reduce): it may stand for a planned reduce-scatter of those bytes.
      r.gloo = e.profiling_name.rfind("gloo:", 0) == 0;
      if (r.op == "send" || r.op == "recv") {
        const int64_t local = r.op == "send" ? e.dst : e.src;
        if (local >= 0 && local < static_cast<int64_t>(r.group->size())) r.peer = (*r.group)[static_cast<std::size_t>(local)];
        const DtypeList& dts = r.op == "send" ? e.input_dtypes : e.output_dtypes;
        r.dtype = dts.empty() ? std::string_view() : std::string_view(dts[0]);
        r.bytes = r.op == "send" ? bytes_of(e.input_sizes, e.input_dtypes) : bytes_of(e.output_sizes, e.output_dtypes);
      } else {
        // An all-gather by its input times the group's size: Gloo records the output of a
        // functional all_gather_into_tensor as [1, input...].
        const bool by_input = r.op == "reduce_scatter" || r.op == "all_to_all" || r.op == "all_gather";
        const auto& sizes = by_input ? e.input_sizes : e.output_sizes;
        const auto& dts = by_input ? e.input_dtypes : e.output_dtypes;
        r.dtype = dts.empty() ? std::string_view() : std::string_view(dts[0]);
        r.bytes = bytes_of(sizes, dts);
        if (r.op == "all_gather" && r.bytes >= 0) {
          const auto n = static_cast<int64_t>(r.group->size());
          r.bytes = n > 0 && r.bytes <= INT64_MAX / n ? r.bytes * n : -1;
        }
      }
      recs.push_back(std::move(r));
    }
    ++out.ranks_compared;
    if (recs.empty()) continue;
    // Align: the (first record, plan position) where the longest run agrees, the plan taken as
    // repeating step after step. Leading records that agree with nothing are setup; at most
    // kMaxSetup of them are passed over before the oldest record is called the divergence.
    constexpr std::size_t kMaxSetup = 64;
    Same same;
    const std::size_t m = planned.size();
    std::size_t best_start = recs.size(), best_k = 0, best_len = 0;
    for (std::size_t s0 = 0; s0 < recs.size() && s0 < kMaxSetup && best_len < recs.size() - s0; ++s0) {
      for (std::size_t k = 0; k < m; ++k) {
        if (!same(recs[s0], planned[k])) continue;
        std::size_t len = 0;
        while (s0 + len < recs.size() && same(recs[s0 + len], planned[(k + len) % m])) ++len;
        if (len > best_len) {
          best_len = len;
          best_start = s0;
          best_k = k;
        }
        if (s0 + len == recs.size()) break;
      }
      if (best_len > 0 && best_start == s0) break;  // the earliest start that agrees at all
    }
    out.records_compared += static_cast<int64_t>(recs.size());
    if (best_len == 0) {
      const Rec& r = recs.front();
      out.divergences.push_back(PlanDivergence{
          d.rank, r.e->record_id,
          "rank " + std::to_string(d.rank) + ": none of its " + std::to_string(recs.size()) +
              " kept records agrees with its planned program; the oldest: " + r.e->profiling_name.substr(0, 60) + " #" +
              std::to_string(r.e->collective_seq_id) + " on " + group_text(r) + " " + std::string(r.dtype) + " " + std::to_string(r.bytes) +
              " B, where the plan's first event is " + step::describe(*planned.front().e)});
      continue;
    }
    if (best_start > 0) {
      out.notes.push_back("rank " + std::to_string(d.rank) + ": its " + std::to_string(best_start) +
                          " oldest kept records (before the first planned one) are not compared");
    }
    const std::size_t at = best_start + best_len;
    if (at == recs.size()) continue;
    const Rec& r = recs[at];
    const std::size_t k = (best_k + best_len) % m;
    const Planned& p = planned[k];
    std::string planned_group =
        p.op == "send" || p.op == "recv" ? "peer rank " + std::to_string(p.peer)
                                         : std::string(step::dim_label(job, p.e->dim)) + " " + members_text(*p.group);
    std::string issued = r.e->profiling_name.substr(0, 60) + (r.e->is_p2p ? "" : " #" + std::to_string(r.e->collective_seq_id)) +
                         " on " + group_text(r) + " (" + std::string(r.dtype) + ", " + std::to_string(r.bytes) + " B, record " +
                         std::to_string(r.e->record_id) + ")";
    out.divergences.push_back(PlanDivergence{
        d.rank, r.e->record_id,
        "rank " + std::to_string(d.rank) + " issued " + issued + " where the plan has " + std::string(step::op_name(p.e->op)) +
            " on " + planned_group + " (" + step::describe(*p.e) + ", event " + std::to_string(k) + " of the step's " +
            std::to_string(m) + ")"});
  }
  out.ok = out.divergences.empty();
  if (p2p_planned) {
    out.notes.push_back("no dump records a send or a receive (Gloo's Flight Recorder records none): the plan's are not compared");
  }
  return out;
}

}  // namespace meshsim::trace
