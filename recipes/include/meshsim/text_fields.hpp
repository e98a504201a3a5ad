// meshsim/text_fields.hpp — the house's small vocabulary for a flag's text (--mesh dp=2,tp=4, a
// preset's "pp=2,dp=4", --fault skip@3): one cutter, one integer reader, one case folding, one
// KIND@RANK reader and the checked arithmetic of sizes, so every flag words a bad value the same.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshsim::text {

// split cuts `s` at every `sep` (a trailing separator gives a last empty part).
std::vector<std::string> split(const std::string& s, char sep);

// shell_words splits `text` into words as a POSIX shell does, without expansions: blanks
// separate words; '...' keeps everything literally; "..." keeps everything but a backslash
// before " \ $ ` or a newline; an unquoted backslash keeps the next character, and a
// backslash-newline joins lines; a '#' that starts a word comments out the rest of its line.
// InvalidArgument naming `flag` for an unclosed quote (and its byte); ResourceExhausted past
// `max_words` words.
std::vector<std::string> shell_words(const std::string& text, const std::string& flag, std::size_t max_words);

// parse_int reads a whole decimal int64: InvalidArgument "<what>: 'S' is not an integer", or
// OverflowError when it does not fit.
int64_t parse_int(const std::string& s, const std::string& what);

// lower_case folds ASCII letters (names the user may write in any case: schedules, models,
// policies).
std::string lower_case(std::string_view s);

// checked_mul / checked_add: a * b and a + b, or OverflowError "<what> overflows 64-bit
// arithmetic" (sizes and products built from user input).
int64_t checked_mul(int64_t a, int64_t b, const std::string& what);
int64_t checked_add(int64_t a, int64_t b, const std::string& what);

// rank_list reads a list of ranks and inclusive ranges, "0,3,8-15", each below `world`, at most
// `max_ranks` of them (counted before duplicates go), and returns them ascending and unique.
// Errors name `flag` and the text: InvalidArgument for an empty item, a rank that is not decimal
// digits, or an empty range (8-3); OutOfRange for a rank >= world; OverflowError past 64 bits;
// ResourceExhausted past max_ranks. "" is the empty list.
std::vector<int64_t> rank_list(std::string_view text, int64_t world, const std::string& flag, int64_t max_ranks);

// KindAtRank is a `--fault KIND@RANK` value cut at its '@': InvalidArgument naming `flag`, the
// value and the form (with `kinds`, the known kinds, in the message) when there is no '@', no
// kind or no rank; a rank that is not a decimal number >= 0, or past 64 bits, is refused by name.
struct KindAtRank {
  std::string kind;
  int64_t rank = 0;
};
KindAtRank kind_at_rank(std::string_view text, const std::string& flag, const std::string& kinds);

// check_format: the one --format rule of the tool's subcommands: text or json, else
// InvalidArgument "--format must be text or json, not 'X'".
void check_format(const std::string& format);

}  // namespace meshsim::text
