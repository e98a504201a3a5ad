// json_codec.hpp — JSON forms of meshsim values for `meshsim query`.
//
// IntTuple: a JSON integer or a non-empty array of IntTuples (an array is a tuple, so `4` and
// `[4]` differ). Layout: {"shape": S, "stride": D} (PyTorch's {"sizes", "strides"} too) or CuTe's
// text form "((2,2),4):((1,8),2)". Malformed values throw meshsim::ParseError / InvalidArgument
// naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "meshsim/algebra.hpp"
#include "meshsim/int_tuple.hpp"
#include "meshsim/layout.hpp"

namespace meshsim::json {

using Json = nlohmann::json;

// NullAs says what a JSON null becomes inside an IntTuple: an error, or the integer 0
// (coordinates and profiles, where null means 0 / "the whole mode").
enum class NullAs { kError, kZero };

int64_t to_int(const Json& j, std::string_view field);
IntTuple to_int_tuple(const Json& j, std::string_view field, NullAs nulls = NullAs::kError);
Layout to_layout(const Json& j, std::string_view field);
// to_tiler reads an array of null | int n (n:1) | layout.
Tiler to_tiler(const Json& j, std::string_view field);
std::vector<int64_t> to_int_list(const Json& j, std::string_view field);

Json from_int_tuple(const IntTuple& t);
Json from_layout(const Layout& l);

// max_nesting is the deepest bracket nesting in raw JSON text (strings skipped): lets the engine
// reject absurdly nested input before handing it to the JSON parser.
int max_nesting(std::string_view text);

}  // namespace meshsim::json
