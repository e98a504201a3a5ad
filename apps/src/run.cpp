// run.cpp — `meshsim run`'s front: its flags to a check::Job, the report to text or JSON, and
// the process's end when a rank is left stuck. The job itself is check::check_meshes.
#include "meshsim/run.hpp"
#include "meshsim/json_codec.hpp"

#include <cstdlib>
#include <iostream>
#include <map>
#include <ostream>
#include <nlohmann/json.hpp>

#include "meshsim/check_meshes.hpp"
#include "meshsim/error.hpp"
#include "meshsim/job_store.hpp"

namespace meshsim::run {

namespace {

using Json = nlohmann::json;
using check::kListedRanks;
using check::kShownGroups;

}  // namespace

void print_report(const Options& o, const check::MeshCheckReport& r, std::ostream& out) {
  const int64_t world = r.world_size;
  const std::vector<DeviceMesh>& meshes = r.meshes;
  const bool lockstep = check::find_engine(r.engine).value_or(check::EngineEntry{}).lockstep;
  if (o.format == "json") {
    out << json::output_text(check::report_json(r)) << "\n";
  } else {
    if (r.own) {
      out << "meshsim run: rank " << *r.rank << " of " << world << " over the " << r.engine
          << " backend (launched by " << r.launcher << "; its own groups)";
    } else if (r.rank) {
      out << "meshsim run: " << world << " ranks over the " << r.engine << " backend, one per process (launched by "
          << r.launcher << "; rank " << *r.rank << " reports)";
    } else {
      out << "meshsim run: " << world << " ranks over the " << r.engine << " backend";
    }
    if (!lockstep) out << ", timeout " << o.timeout_seconds << " s";
    out << "\n";
    for (std::size_t i = 0; i < meshes.size(); ++i) {
      const DeviceMesh& m = meshes[i];
      const auto& let = i == 0 ? std::optional<std::string>() : r.step_names[i - 1];
      out << (i == 0 ? "  root " : "  step " + std::to_string(i) + (let ? " (" + *let + ")" : std::string()) + " ")
          << m.to_string() << "\n";
      for (int d = 0; d < m.ndim(); ++d) {
        // The first groups only: listing every group of a 2^24-rank dim is not a summary.
        const int64_t count = m.rank_map_size() / m.size(d);
        out << "    " << m.dim_name(d) << ": " << count << (count == 1 ? " group of " : " groups of ") << m.size(d);
        if (r.ok) {
          const auto& rows = r.seen[i][static_cast<std::size_t>(d)];
          for (std::size_t k = 0; k < rows.size() && k < kShownGroups; ++k) out << " " << format_ranks(rows[k]);
          if (!r.own && count > std::min<int64_t>(static_cast<int64_t>(rows.size()), kShownGroups)) out << " ...";
        }
        if (r.hosts) {
          const placement::DimPlacement p = placement::place(m, d, *r.hosts);
          out << "; spans <= " << p.max_hosts << (p.max_hosts == 1 ? " host" : " hosts") << " (" << p.max_domains
              << (p.max_domains == 1 ? " domain" : " domains") << "), " << p.groups_crossing_hosts
              << (p.groups_crossing_hosts == 1 ? " group crosses a host" : " groups cross a host");
        }
        out << "\n";
      }
    }
    out << "checks passed: " << r.checks << " of " << r.expected_checks << "; collectives: "
        << r.collectives << "; wall time " << r.seconds << " s\n";
    if (r.ok) {
      out << "OK: every rank's groups match the mesh on every dim\n";
    } else {
      // One line per rank at fault, up to kListedRanks lines of one diagnosis; the rest of its
      // ranks are counted on one line (a stall of thousands of ranks is not thousands of lines).
      std::map<std::string, std::size_t> shown;
      std::map<std::string, std::pair<DiagnosisKind, std::vector<int64_t>>> more;
      for (const Diagnosis& d : r.failures) {
        if (shown[d.message]++ >= kListedRanks) {
          auto& m = more[d.message];
          m.first = d.kind;
          m.second.insert(m.second.end(), d.ranks.begin(), d.ranks.end());
          continue;
        }
        // A failure no rank caused (a lost store) names none.
        out << "FAILED " << (d.ranks.empty() ? "" : "rank " + std::to_string(d.ranks[0]) + " ") << "[" << to_string(d.kind)
            << "]: " << d.message << "\n";
      }
      for (const auto& [message, m] : more) {
        out << "FAILED ranks " << format_ranks(m.second) << " [" << to_string(m.first) << "]: the same diagnosis as the "
            << kListedRanks << " lines above it\n";
      }
      std::size_t stuck = 0;
      for (const RankReport& s : r.stuck) {
        if (stuck++ < kListedRanks) out << "STUCK rank " << s.rank << ": " << s.message << "\n";
      }
      if (r.stuck.size() > kListedRanks) out << "STUCK: " << r.stuck.size() - kListedRanks << " more ranks\n";
    }
    for (const std::string& b : r.misplaced) out << "FAILED placement: " << b << "\n";
  }
  out.flush();
}


int run(const Options& o, std::ostream& out) {
  const check::MeshCheckReport r = check::check_meshes(job_of(o));
  // Warnings go to stderr (the JSON report carries them too), so stdout stays the report.
  // Under a launcher only the reporting rank says it (every rank applied the same recipe).
  if (!r.rank || *r.rank == 0) {
    for (const std::string& w : shown_warnings(r.warnings)) std::cerr << "meshsim run: warning: " << w << "\n";
  }
  print_report(o, r, out);
  const int code = r.passed() ? 0 : 1;
  // Detached rank threads must not outlive main's destructors: the tool ends here. A library
  // caller (Python) keeps its process; the stuck threads hold what they use.
  if (!r.stuck.empty() && o.end_process_if_stuck) std::_Exit(code);
  return code;
}

void write_error_file(const std::string& path, const std::string& message, std::optional<int64_t> timestamp) {
  check::write_error_file(path, message, timestamp);
}

}  // namespace meshsim::run
