// json_depth.hpp (private to meshsim::json) — the deepest bracket nesting of raw JSON text (strings
// skipped), so readers can refuse absurdly nested input before a parser sees it.
#pragma once

#include <algorithm>
#include <string_view>

namespace meshsim::detail {

inline int json_depth(std::string_view text) {
  int depth = 0;
  int best = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      best = std::max(best, ++depth);
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return best;
}

}  // namespace meshsim::detail
