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
#include "meshsim/rank_text.hpp"

namespace meshsim::trace {

// report_text: "meshsim trace check: N dumps ..." then one FAILED line per problem, the
// culprits, notes, and OK or FAILED. report_json: the same as fields.
std::string report_text(const CheckReport& r, const DumpSet& set);
nlohmann::json report_json(const CheckReport& r, const DumpSet& set);

}  // namespace meshsim::trace
