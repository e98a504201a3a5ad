// The check's report (fr_report.hpp): as text and as JSON; the rank-range formatter.
#include "meshsim/fr_report.hpp"

#include <map>
#include <set>
#include <sstream>

#include "fr_checker.hpp"
#include "meshsim/fr_check.hpp"

namespace meshsim::trace {

namespace {

constexpr std::string_view kProblemKindNames[kProblemKinds] = {
    "membership", "missing-dump", "unknown-group", "never-issued", "absent",        "type",
    "size",       "dtype",        "state",         "p2p",          "unmatched-p2p", "wait-cycle",
    "group-name"};

}  // namespace

std::string_view problem_kind_name(ProblemKind k) { return kProblemKindNames[static_cast<int>(k)]; }

std::optional<ProblemKind> parse_problem_kind(std::string_view name) {
  for (int k = 0; k < kProblemKinds; ++k) {
    if (kProblemKindNames[k] == name) return static_cast<ProblemKind>(k);
  }
  return std::nullopt;
}

std::string report_text(const CheckReport& r, const DumpSet& set) {
  std::ostringstream out;
  std::string formats, versions;
  std::set<std::string> fs, vs;
  for (const auto& d : set.dumps) {
    fs.insert(d.format);
    vs.insert(d.version);
  }
  for (const auto& f : fs) formats += (formats.empty() ? "" : "+") + f;
  for (const auto& v : vs) versions += (versions.empty() ? "" : ", ") + v.substr(0, 20);
  out << "meshsim trace check: " << r.dumps << " dumps in '" << set.dir << "' (prefix '" << set.prefix << "', " << formats
      << ", version " << versions << "): " << r.groups << " groups, " << r.entries << " records; " << r.collectives_checked
      << " collectives and " << r.p2p_checked << " send/recv pairs checked\n";
  for (const auto& p : r.problems) {
    out << "FAILED " << problem_kind_name(p.kind) << ": " << p.message;
    if (p.repeats > 0) out << " (and the same at " << p.repeats << " more collectives, to #" << p.last_seq << ")";
    out << "\n";
  }
  for (const auto& c : r.culprits) out << "culprit: rank " << c.rank << ": " << c.why << "\n";
  for (const auto& n : r.notes) out << "note: " << n << "\n";
  if (r.ok) {
    out << "OK\n";
  } else {
    std::vector<int64_t> cs;
    for (const auto& c : r.culprits) cs.push_back(c.rank);
    out << "FAILED: " << r.problems.size() << (r.problems.size() == 1 ? " problem" : " problems")
        << (cs.empty() ? std::string() : "; culprits: " + detail::who(cs)) << "\n";
  }
  return out.str();
}

nlohmann::json report_json(const CheckReport& r, const DumpSet& set) {
  nlohmann::json j{{"ok", r.ok},
                   {"dir", set.dir},
                   {"prefix", set.prefix},
                   {"dumps", r.dumps},
                   {"groups", r.groups},
                   {"records", r.entries},
                   {"collectives_checked", r.collectives_checked},
                   {"p2p_checked", r.p2p_checked}};
  auto& ps = j["problems"] = nlohmann::json::array();
  nlohmann::json lists = nlohmann::json::array();
  std::map<const std::vector<int64_t>*, std::size_t> listed;
  for (const auto& p : r.problems) {
    nlohmann::json q{{"kind", problem_kind_name(p.kind)}, {"ranks", p.ranks}, {"message", p.message}};
    if (p.group_ranks) {
      // As the text report bounds it (a problem of a 10^6-rank group is not 10^6 ranks long);
      // every group's whole list is in "group_list", once.
      q["group"] = p.group;
      q["desc"] = p.desc;
      q["group_size"] = p.group_ranks->size();
      q["group_ranks"] = format_rank_runs(*p.group_ranks, 64);
      if (listed.emplace(p.group_ranks.get(), lists.size()).second) {
        lists.push_back({{"group", p.group}, {"desc", p.desc}, {"size", p.group_ranks->size()},
                         {"ranks", format_rank_runs(*p.group_ranks, SIZE_MAX)}});
      }
      q["group_list_index"] = listed.at(p.group_ranks.get());
    }
    if (p.seq >= 0) q["seq"] = p.seq;
    if (p.repeats > 0) {
      q["repeats"] = p.repeats;
      q["last_seq"] = p.last_seq;
    }
    ps.push_back(std::move(q));
  }
  j["group_list"] = std::move(lists);
  auto& cs = j["culprits"] = nlohmann::json::array();
  for (const auto& c : r.culprits) cs.push_back({{"rank", c.rank}, {"why", c.why}});
  j["notes"] = r.notes;
  return j;
}

}  // namespace meshsim::trace
