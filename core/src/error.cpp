#include "meshsim/error.hpp"

#include <algorithm>

namespace meshsim {

namespace {
// A UTF-8 continuation byte (10xxxxxx) never starts a character.
bool continues(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }
}  // namespace

std::string quote_input(std::string_view text, std::size_t at) {
  if (text.size() <= kQuotedLimit) return "'" + std::string(text) + "'";
  const std::size_t centre = std::min(at, text.size());
  std::size_t begin = std::min(centre > kQuotedLimit / 2 ? centre - kQuotedLimit / 2 : 0,
                               text.size() - kQuotedLimit);
  std::size_t end = begin + kQuotedLimit;
  // A character has at most three continuation bytes; invalid text may have more in a row.
  for (int i = 0; i < 3 && begin > 0 && continues(text[begin]); ++i) --begin;
  for (int i = 0; i < 3 && end < text.size() && continues(text[end]); ++i) --end;
  std::string out = "'";
  if (begin > 0) out += "...";
  out.append(text.substr(begin, end - begin));
  if (end < text.size()) out += "...";
  out += "' (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace meshsim
