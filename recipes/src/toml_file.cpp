#include "toml_file.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::detail {

namespace {

// kMaxKeyParts bounds the parts of one dotted key or table header: toml++ nests a table per
// part and frees them recursively, so 40,000 parts overflow the stack (its own nesting limit
// covers arrays and inline tables only).
constexpr std::size_t kMaxKeyParts = 64;

// check_key_parts refuses, before the TOML parser sees it, a dotted key or a table header of
// more than kMaxKeyParts parts. It follows TOML's lexical structure only as far as it must:
// strings (all four kinds), comments, and whether a position holds a key (a statement's start,
// a header, an inline table's key) or a value (where a float's dot is not a key's).
void check_key_parts(const std::string& text, const std::string& where) {
  std::size_t parts = 1, line = 1;
  bool in_value = false;                    // after a top-level '=', until the end of the line
  std::vector<std::pair<char, bool>> open;  // '[' or '{' of a value, and whether a key comes next
  auto key_position = [&] { return open.empty() ? !in_value : open.back().first == '{' && open.back().second; };
  auto counted_dot = [&] {
    if (++parts > kMaxKeyParts) {
      throw InvalidArgument(where + ": the key or table header at line " + std::to_string(line) + " has over " +
                            std::to_string(kMaxKeyParts) + " dotted parts");
    }
  };
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '"' || c == '\'') {
      const bool triple = i + 2 < n && text[i + 1] == c && text[i + 2] == c;
      std::size_t j = i + (triple ? 3 : 1);
      for (; j < n; ++j) {
        if (text[j] == '\n') ++line;
        if (c == '"' && text[j] == '\\') {
          if (j + 1 < n && text[j + 1] == '\n') ++line;
          ++j;
          continue;
        }
        if (text[j] == c && (!triple || (j + 2 < n && text[j + 1] == c && text[j + 2] == c))) break;
        if (!triple && text[j] == '\n') break;  // an unterminated one-line string: the parser says so
      }
      i = triple ? std::min(n, j + 2) : j;
      continue;
    }
    if (c == '#') {
      while (i + 1 < n && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '\n') {
      ++line;
      if (open.empty()) in_value = false;
      parts = 1;
      continue;
    }
    if (open.empty() && !in_value && c == '[') {
      // A table header: [a.b] or [[a.b]], to its closing bracket (quoted parts skipped above
      // only between statements, so they are skipped here too).
      parts = 1;
      for (++i; i < n && text[i] != ']' && text[i] != '\n'; ++i) {
        if (text[i] == '"' || text[i] == '\'') {
          const char q = text[i];
          for (++i; i < n && text[i] != q && text[i] != '\n'; ++i) {
            if (q == '"' && text[i] == '\\') ++i;
          }
        } else if (text[i] == '.') {
          counted_dot();
        }
      }
      while (i + 1 < n && text[i + 1] == ']') ++i;
      parts = 1;
      continue;
    }
    if (key_position()) {
      if (c == '.') counted_dot();
      if (c == '=') {
        parts = 1;
        if (open.empty()) in_value = true;
        else open.back().second = false;
      }
      continue;
    }
    if (c == '[' || c == '{') open.emplace_back(c, c == '{');
    else if ((c == ']' || c == '}') && !open.empty()) open.pop_back();
    else if (c == ',' && !open.empty() && open.back().first == '{') open.back().second = true;
  }
}

}  // namespace

toml::table parse_toml_file(const std::string& path, std::size_t max_bytes, const std::string& what,
                            const std::string& where) {
  const std::string text = read_text_file(path, max_bytes, what);
  check_key_parts(text, where);
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ParseError(where + " is not TOML: " + std::string(e.description()) + " at line " +
                     std::to_string(e.source().begin.line) + ", column " + std::to_string(e.source().begin.column));
  }
}


}  // namespace meshsim::detail
