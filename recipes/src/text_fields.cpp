#include "meshsim/text_fields.hpp"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "meshsim/decimal.hpp"
#include "meshsim/error.hpp"

namespace meshsim::text {

std::vector<std::string> shell_words(const std::string& text, const std::string& flag, std::size_t max_words) {
  std::vector<std::string> words;
  std::string w;
  bool in_word = false;
  auto end_word = [&] {
    if (!in_word) return;
    if (words.size() >= max_words) {
      throw ResourceExhausted(flag + " holds over " + std::to_string(max_words) + " words");
    }
    words.push_back(std::move(w));
    w.clear();
    in_word = false;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      end_word();
      continue;
    }
    if (c == '#' && !in_word) {
      while (i < text.size() && text[i] != '\n') ++i;
      continue;
    }
    if (c == '\'') {
      const std::size_t end = text.find('\'', i + 1);
      if (end == std::string::npos) throw InvalidArgument(flag + ": an unclosed ' quote, opened at byte " + std::to_string(i));
      w.append(text, i + 1, end - i - 1);
      in_word = true;
      i = end;
    } else if (c == '"') {
      std::size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() && std::string_view("\"\\$`\n").find(text[j + 1]) != std::string_view::npos) {
          if (text[++j] == '\n') continue;
        }
        w += text[j];
      }
      if (j >= text.size()) throw InvalidArgument(flag + ": an unclosed \" quote, opened at byte " + std::to_string(i));
      in_word = true;
      i = j;
    } else if (c == '\\') {
      if (i + 1 < text.size() && text[i + 1] == '\n') {
        ++i;  // a line continued
        continue;
      }
      if (i + 1 < text.size()) w += text[++i];
      in_word = true;
    } else {
      w += c;
      in_word = true;
    }
  }
  end_word();
  return words;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  // One leading '+' is taken, as CLI11 takes it in a flag's value.
  const std::string_view digits = s.size() > 1 && s[0] == '+' && s[1] != '-' ? std::string_view(s).substr(1) : std::string_view(s);
  bool overflow = false;
  const std::optional<int64_t> v = read_decimal(digits, &overflow);
  if (overflow) throw OverflowError(what + ": " + quote_input(s) + " does not fit in a 64-bit signed integer");
  if (!v) throw InvalidArgument(what + ": " + quote_input(s) + " is not an integer");
  return *v;
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

namespace {

// rank_number reads a rank written as decimal digits only (no sign, no space): InvalidArgument
// "<where>: the rank 'X' is not a number >= 0", OverflowError past 64 bits.
int64_t rank_number(std::string_view digits, const std::string& where) {
  if (digits.empty()) throw InvalidArgument(where + ": a rank is missing");
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') throw InvalidArgument(where + ": the rank " + quote_input(digits) + " is not a number >= 0");
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v)) {
      throw OverflowError(where + ": the rank " + quote_input(digits) + " does not fit in 64 bits");
    }
  }
  return v;
}

}  // namespace

std::vector<int64_t> rank_list(std::string_view text, int64_t world, const std::string& flag, int64_t max_ranks) {
  const std::string where = flag + " " + quote_input(text);
  std::vector<int64_t> out;
  std::size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view part = text.substr(at, comma - at);
    if (part.empty()) throw InvalidArgument(where + ": expected ranks like 0,3,8-15 (an empty item)");
    const std::size_t dash = part.find('-');
    const int64_t a = rank_number(part.substr(0, dash), where);
    const int64_t b = dash == std::string_view::npos ? a : rank_number(part.substr(dash + 1), where);
    if (b < a) throw InvalidArgument(where + ": the range " + std::to_string(a) + "-" + std::to_string(b) + " is empty");
    if (b >= world) {
      throw OutOfRange(where + ": rank " + std::to_string(b) + " is out of range [0, " + std::to_string(world) + ")");
    }
    if (b - a >= max_ranks - static_cast<int64_t>(out.size())) {
      throw ResourceExhausted(where + " names over " + std::to_string(max_ranks) + " ranks");
    }
    for (int64_t r = a; r <= b; ++r) out.push_back(r);
    at = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

KindAtRank kind_at_rank(std::string_view text, const std::string& flag, const std::string& kinds) {
  const std::string where = flag + " " + quote_input(text);
  const auto at = text.find('@');
  if (at == std::string_view::npos || at == 0 || at + 1 >= text.size()) {
    throw InvalidArgument(where + ": expected KIND@RANK (" + kinds + ")");
  }
  KindAtRank out;
  out.kind = std::string(text.substr(0, at));
  out.rank = rank_number(text.substr(at + 1), where);
  return out;
}

void check_format(const std::string& format) {
  if (format != "text" && format != "json") throw InvalidArgument("--format must be text or json, not " + quote_input(format));
}

}  // namespace meshsim::text
