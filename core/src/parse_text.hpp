// parse_text.hpp (core-private) — the CuTe text reader (parse_text.cpp), behind
// parse_int_tuple and layout.cpp's parse_layout.
#pragma once

#include <optional>
#include <string_view>
#include <utility>

#include "meshsim/int_tuple.hpp"

namespace meshsim::detail {

// parse_layout_text reads "S:D" (shape and stride) or "S" (shape only); ParseError naming the
// position otherwise.
std::pair<IntTuple, std::optional<IntTuple>> parse_layout_text(std::string_view text);

// parse_int_tuple_text is parse_int_tuple's full reader (ParseError naming the position).
IntTuple parse_int_tuple_text(std::string_view text);

// read_plain_layout_text is the same reader for the common case, writing the preorder nodes of
// the shape and the stride straight into `shape` and `stride` (cleared first): kShapeStride for
// "S:D", kShape for "S" (stride left empty), and kNotPlain for anything it leaves to
// parse_layout_text: every error, and text past its own small limits (256 nodes a tree; integers
// past int64 included). Whatever it accepts, parse_layout_text reads as the same trees.
enum class PlainText { kNotPlain, kShape, kShapeStride };
PlainText read_plain_layout_text(std::string_view text, IntTuple::Storage& shape,
                                 IntTuple::Storage& stride);
// read_plain_int_tuple is the same for parse_int_tuple's text (one value, nothing after it).
bool read_plain_int_tuple(std::string_view text, IntTuple::Storage& out);

}  // namespace meshsim::detail
