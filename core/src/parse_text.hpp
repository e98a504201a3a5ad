// parse_text.hpp (core-private) — the CuTe text reader shared by int_tuple.cpp (which owns the
// parser) and layout.cpp (parse_layout).
#pragma once

#include <optional>
#include <string_view>
#include <utility>

#include "meshsim/int_tuple.hpp"

namespace meshsim::detail {

// parse_layout_text reads "S:D" (shape and stride) or "S" (shape only); ParseError naming the
// position otherwise.
std::pair<IntTuple, std::optional<IntTuple>> parse_layout_text(std::string_view text);

}  // namespace meshsim::detail
