// toml_file.hpp — a TOML file read under the guards every TOML input of meshsim has (torchtitan's
// job files, --model M.toml): its size, the dotted parts of a key or header (toml++ nests a table
// per part and frees them recursively: 40,000 parts overflow the stack), the parser's error in
// meshsim's words. Internal to meshsim::recipes (toml++ is its private dependency).
#pragma once

#include <cstddef>
#include <string>
#include <toml++/toml.h>

namespace meshsim::detail {

// parse_toml_file reads `path` (at most `max_bytes`: a read error names `what` and the path) and
// parses it; a key or table header of over 64 dotted parts is InvalidArgument, and the parser's
// error a ParseError, each after `where` (the flag and the path).
toml::table parse_toml_file(const std::string& path, std::size_t max_bytes, const std::string& what,
                            const std::string& where);

}  // namespace meshsim::detail
