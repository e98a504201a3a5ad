// json_codec.hpp — the one JSON reader and writer of meshsim values (target meshsim::json),
// used by the query engine, the mesh recipe and DeviceMesh save/load. One error class per
// condition: a wrong type, a missing or unknown field, a bad tuple: InvalidArgument naming the
// field; an integer past int64 (also when JSON's reader keeps it as a double): OverflowError.
//
// IntTuple: a JSON integer or a non-empty array of IntTuples (an array is a tuple, so `4` and
// `[4]` differ). Layout: {"shape": S, "stride": D} (PyTorch's {"sizes", "strides"} too) or CuTe's
// text form "((2,2),4):((1,8),2)". Malformed values throw meshsim::ParseError / InvalidArgument
// naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/algebra.hpp"
#include "meshsim/int_tuple.hpp"
#include "meshsim/inline_vector.hpp"
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
// to_short_int_list is to_int_list kept inline for up to 16 integers (a request's sizes, say).
using ShortIntList = meshsim::detail::InlineVector<int64_t, 16>;
ShortIntList to_short_int_list(const Json& j, std::string_view field);
// The same readers over the query tool's fast reader (json_tape.hpp, not installed).
// The field readers every JSON decoder of meshsim uses (query engine, recipe): find is null when
// the key is absent (or `obj` is not an object); need throws InvalidArgument naming `where`.
const Json* find(const Json& obj, std::string_view key);
const Json& need(const Json& obj, std::string_view key, std::string_view where);
const Json& need_object(const Json& j, std::string_view where);
std::string to_str(const Json& j, std::string_view field);
std::vector<std::string> to_names(const Json& j, std::string_view field);
// check_keys refuses fields outside `allowed` (a typo must not be silently ignored).
void check_keys(const Json& obj, std::initializer_list<std::string_view> allowed,
                std::string_view where);
// short_dump is a value for an error message: at most ~200 characters, invalid UTF-8 replaced.
std::string short_dump(const Json& j, std::size_t limit = 200);
// output_text is JSON as meshsim writes it (reports, traces, files): a string that is not UTF-8
// (a file name or a dim name of arbitrary bytes) has its invalid bytes replaced by U+FFFD,
// never an exception from the writer.
std::string output_text(const Json& j, int indent = -1);

Json from_int_tuple(const IntTuple& t);
Json from_layout(const Layout& l);

// max_nesting is the deepest bracket nesting in raw JSON text (strings skipped): lets the engine
// reject absurdly nested input before handing it to the JSON parser.
int max_nesting(std::string_view text);

}  // namespace meshsim::json
