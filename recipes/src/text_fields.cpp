#include "meshsim/text_fields.hpp"

#include <cctype>
#include <sstream>

#include "meshsim/error.hpp"

namespace meshsim::text {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  std::size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::out_of_range&) {
    throw OverflowError(what + ": " + quote_input(s) + " does not fit in a 64-bit signed integer");
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || std::isspace(static_cast<unsigned char>(s[0]))) {
    throw InvalidArgument(what + ": " + quote_input(s) + " is not an integer");
  }
  return v;
}

std::string lower_case(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw OverflowError(what + " overflows 64-bit arithmetic");
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw OverflowError(what + " overflows 64-bit arithmetic");
  return r;
}

KindAtRank kind_at_rank(std::string_view text, const std::string& flag, const std::string& kinds) {
  const std::string where = flag + " " + quote_input(text);
  const auto at = text.find('@');
  if (at == std::string_view::npos || at == 0 || at + 1 >= text.size()) {
    throw InvalidArgument(where + ": expected KIND@RANK (" + kinds + ")");
  }
  KindAtRank out;
  out.kind = std::string(text.substr(0, at));
  const std::string_view digits = text.substr(at + 1);
  for (char c : digits) {
    if (c < '0' || c > '9') throw InvalidArgument(where + ": the rank " + quote_input(digits) + " is not a number >= 0");
    if (__builtin_mul_overflow(out.rank, 10, &out.rank) || __builtin_add_overflow(out.rank, c - '0', &out.rank)) {
      throw OverflowError(where + ": the rank " + quote_input(digits) + " does not fit in 64 bits");
    }
  }
  return out;
}

void check_format(const std::string& format) {
  if (format != "text" && format != "json") throw InvalidArgument("--format must be text or json, not " + quote_input(format));
}

}  // namespace meshsim::text
