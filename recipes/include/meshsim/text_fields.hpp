// meshsim/text_fields.hpp — the pieces of a flag's text (--mesh dp=2,tp=4, a preset's
// "pp=2,dp=4"): one cutter and one integer reader, so every flag words a bad value the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshsim::text {

// split cuts `s` at every `sep` (a trailing separator gives a last empty part).
std::vector<std::string> split(const std::string& s, char sep);

// parse_int reads a whole decimal int64: InvalidArgument "<what>: 'S' is not an integer", or
// OverflowError when it does not fit.
int64_t parse_int(const std::string& s, const std::string& what);

}  // namespace meshsim::text
