// fr_report.hpp — the cross-rank check's report, as text and as JSON, and the rank-range
// formatter the trace reports use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshsim/dump_reader.hpp"
#include "meshsim/fr_check.hpp"

namespace meshsim::trace {

// report_text: "meshsim trace check: N dumps ..." then one FAILED line per problem, the
// culprits, notes, and OK or FAILED. report_json: the same as fields.
std::string report_text(const CheckReport& r, const DumpSet& set);
nlohmann::json report_json(const CheckReport& r, const DumpSet& set);

// format_ranks: "0-7,16,18-19" (ranges of consecutive ranks), at most `max_runs` runs then
// ",... (N ranks)"; four or more ranks a constant stride > 1 apart as "5,13,...,253 (32 ranks,
// stride 8)".
std::string format_ranks(const std::vector<int64_t>& sorted_ranks, std::size_t max_runs = 64);

}  // namespace meshsim::trace
