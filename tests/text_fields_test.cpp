// The house's small vocabulary (meshsim/text_fields.hpp): the one case folding, checked
// arithmetic, KIND@RANK reader and --format rule every subcommand's flags go through.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "meshsim/decimal.hpp"
#include "meshsim/error.hpp"
#include "meshsim/rank_text.hpp"
#include "meshsim/text_fields.hpp"

namespace meshsim::text {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(TextFields, LowerCaseFoldsAsciiOnly) {
  EXPECT_EQ(lower_case("Interleaved1F1B"), "interleaved1f1b");
  EXPECT_EQ(lower_case(""), "");
  EXPECT_EQ(lower_case("\xC3\x89-ZBV"), "\xC3\x89-zbv");  // bytes past ASCII kept as they are
}

TEST(TextFields, CheckedArithmeticRefusesOverflowNamingWhat) {
  EXPECT_EQ(checked_mul(int64_t{3037000499}, int64_t{3037000499}, "x"), int64_t{9223372030926249001});
  EXPECT_EQ(checked_add(kMax - 1, 1, "x"), kMax);
  EXPECT_EQ(checked_mul(kMin, 1, "x"), kMin);
  for (auto [a, b] : {std::pair{int64_t{3037000500}, int64_t{3037000500}}, std::pair{kMin, int64_t{-1}},
                      std::pair{kMax, int64_t{2}}}) {
    try {
      checked_mul(a, b, "the world size");
      ADD_FAILURE() << a << " x " << b;
    } catch (const OverflowError& e) {
      EXPECT_NE(std::string(e.what()).find("the world size overflows 64-bit arithmetic"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(checked_add(kMax, 1, "x"), OverflowError);
  EXPECT_THROW(checked_add(kMin, -1, "x"), OverflowError);
}

TEST(TextFields, KindAtRankReadsTheKindAndADecimalRank) {
  const KindAtRank a = kind_at_rank("wrong-peer@17", "--fault", "k");
  EXPECT_EQ(a.kind, "wrong-peer");
  EXPECT_EQ(a.rank, 17);
  EXPECT_EQ(kind_at_rank("skip@9223372036854775807", "--fault", "k").rank, kMax);
  for (const char* bad : {"", "skip", "@3", "skip@", "skip@-1", "skip@+1", "skip@ 1", "skip@1x", "a@b@0", "skip@0x10"}) {
    try {
      kind_at_rank(bad, "--fault", "skip, swap");
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("--fault '" + std::string(bad) + "'"), std::string::npos) << w;
    }
  }
  EXPECT_THROW(kind_at_rank("skip@9223372036854775808", "--fault", "k"), OverflowError);
  EXPECT_THROW(kind_at_rank("skip@" + std::string(400, '9'), "--fault", "k"), OverflowError);
  try {
    kind_at_rank("skip", "--fault", "skip, swap");
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expected KIND@RANK (skip, swap)"), std::string::npos) << e.what();
  }
}

TEST(TextFields, RankListReadsRanksAndRangesAscendingAndUnique) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(rank_list("0,3,8-11", 16, "--ranks", 100), (V{0, 3, 8, 9, 10, 11}));
  EXPECT_EQ(rank_list("9-10,2,9,2-3", 16, "--ranks", 100), (V{2, 3, 9, 10}));  // sorted, duplicates gone
  EXPECT_EQ(rank_list("15", 16, "--ranks", 100), V{15});
  EXPECT_EQ(rank_list("", 16, "--ranks", 100), V{});
  // A brute-force reading of random lists: every item's ranks, in a set.
  uint64_t seed = 12345;
  auto next = [&](int64_t n) { seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; return static_cast<int64_t>((seed >> 33) % static_cast<uint64_t>(n)); };
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    std::vector<bool> want(64, false);
    for (int64_t k = 0, items = 1 + next(5); k < items; ++k) {
      const int64_t a = next(64), b = std::min<int64_t>(63, a + next(4));
      text += (k ? "," : "") + std::to_string(a) + (b != a || next(2) ? "-" + std::to_string(b) : "");
      for (int64_t r = a; r <= b; ++r) want[static_cast<std::size_t>(r)] = true;
    }
    V expect;
    for (int64_t r = 0; r < 64; ++r) if (want[static_cast<std::size_t>(r)]) expect.push_back(r);
    EXPECT_EQ(rank_list(text, 64, "--ranks", 1000), expect) << text;
  }
  for (const char* bad : {",", "0,", ",0", "0,,1", "-3", "3-", "a", "1-x", "+1", " 1", "1 ", "0x10", "1--2", "5-3"}) {
    try {
      rank_list(bad, 16, "--ranks", 100);
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--ranks '" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(rank_list("16", 16, "--ranks", 100), OutOfRange);
  EXPECT_THROW(rank_list("0-9223372036854775807", 16, "--ranks", 100), OutOfRange);
  EXPECT_THROW(rank_list("9223372036854775808", kMax, "--ranks", 100), OverflowError);
  EXPECT_THROW(rank_list("0-" + std::string(400, '9'), kMax, "--ranks", 100), OverflowError);
  // The bound counts ranks before they are listed: a range of 2^62 costs nothing.
  EXPECT_THROW(rank_list("0-4611686018427387904", kMax, "--ranks", 100), ResourceExhausted);
  EXPECT_THROW(rank_list("0-50,51-100", 1000, "--ranks", 100), ResourceExhausted);
  EXPECT_EQ(rank_list("0-49,50-99", 1000, "--ranks", 100).size(), 100u);
}

// The one decimal reader under every number read from text: against a brute-force reading of
// random texts of digits and a few other characters, the int64 edges and overflow told apart.
TEST(TextFields, ReadDecimalIsTheWholeTextOrNothing) {
  std::mt19937_64 rng(20261128);
  const std::string alphabet = "0123456789-+ x";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string t;
    const int n = static_cast<int>(rng() % 22);
    for (int i = 0; i < n; ++i) t += alphabet[rng() % (trial % 2 ? 10 : alphabet.size())];
    // brute force: '-'? digits+, the value accumulated in 128 bits
    std::size_t at = !t.empty() && t[0] == '-' ? 1 : 0;
    bool digits = at < t.size();
    __int128 v = 0;
    for (std::size_t i = at; i < t.size(); ++i) {
      if (t[i] < '0' || t[i] > '9') digits = false;
      else if (v <= (__int128{1} << 70)) v = v * 10 + (t[i] - '0');
    }
    if (at == 1) v = -v;
    const bool fits = digits && v >= kMin && v <= kMax;
    bool overflow = true;
    const std::optional<int64_t> got = read_decimal(t, &overflow);
    ASSERT_EQ(got.has_value(), fits) << "'" << t << "'";
    if (fits) EXPECT_EQ(*got, static_cast<int64_t>(v)) << t;
    EXPECT_EQ(overflow, digits && !fits) << "'" << t << "'";
  }
  EXPECT_EQ(read_decimal("9223372036854775807"), kMax);
  EXPECT_EQ(read_decimal("-9223372036854775808"), kMin);
  bool over = false;
  EXPECT_FALSE(read_decimal("-9223372036854775809", &over));
  EXPECT_TRUE(over);
  EXPECT_FALSE(read_decimal("+1"));
  EXPECT_FALSE(read_decimal(" 1"));
  // The flag reader built on it takes one '+', as CLI11 does, and names what it read.
  EXPECT_EQ(parse_int("+12", "--x"), 12);
  EXPECT_THROW(parse_int("+-12", "--x"), InvalidArgument);
  EXPECT_THROW(parse_int("92233720368547758070", "--x"), OverflowError);
}

// Rank sets written from one home: the list form and the runs form.
TEST(TextFields, RankSetsAreWrittenInTheirTwoForms) {
  const std::vector<int64_t> first{0, 1, 2, 3};
  EXPECT_EQ(format_ranks(first), "[0, 1, 2, 3]");
  EXPECT_EQ(format_ranks(first, 2), "[0, 1, ... (4 ranks)]");
  EXPECT_EQ(format_ranks(first, 16, 1024), "[0, 1, 2, 3, ... (1024 ranks)]");
  EXPECT_EQ(format_rank_runs({0, 1, 2, 3, 5, 7, 8}), "0-3,5,7-8");
  EXPECT_EQ(format_rank_runs({5, 13, 21, 29, 37, 45}), "5,13,...,45 (6 ranks, stride 8)");
}

TEST(TextFields, FormatIsTextOrJson) {
  EXPECT_NO_THROW(check_format("text"));
  EXPECT_NO_THROW(check_format("json"));
  for (const char* bad : {"", "JSON", "xml", "json "}) {
    try {
      check_format(bad);
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--format must be text or json, not '" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

// shell_words: the words a POSIX shell makes of a line (as `sh -c 'printf "[%s]" ...'` prints
// them), for the flags that take a command line's words (--against, --megatron-args).
TEST(ShellWords, SplitsAsAPosixShellDoesWithoutExpansions) {
  using W = std::vector<std::string>;
  const std::vector<std::pair<std::string, W>> cases{
      {"", W{}},
      {"  \t\n ", W{}},
      {"--a 1  --b\t2\n", W{"--a", "1", "--b", "2"}},
      {"--megatron-args '--tp 2 --pp 4'", W{"--megatron-args", "--tp 2 --pp 4"}},
      {"x\"a b\"y", W{"xa by"}},
      {R"("a \"b\" \\ \$ \x")", W{R"(a "b" \ $ \x)"}},
      {R"('a \n b')", W{R"(a \n b)"}},
      {R"(a\ b c)", W{"a b", "c"}},
      {"--a 1 \\\n --b 2", W{"--a", "1", "--b", "2"}},
      {"--a 1 # a comment\n--b 2", W{"--a", "1", "--b", "2"}},
      {"a#b", W{"a#b"}},
      {"''", W{""}},
      {"\"\"x", W{"x"}},
  };
  for (const auto& [line, want] : cases) EXPECT_EQ(shell_words(line, "--flag", 100), want) << line;
  for (const std::string& bad : {std::string("'open"), std::string("\"open"), std::string("a 'b")}) {
    try {
      shell_words(bad, "--flag", 100);
      ADD_FAILURE() << bad << " was split";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--flag: an unclosed"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(shell_words("a b c", "--flag", 2), ResourceExhausted);
}

}  // namespace
}  // namespace meshsim::text
