// The house's small vocabulary (meshsim/text_fields.hpp): the one case folding, checked
// arithmetic, KIND@RANK reader and --format rule every subcommand's flags go through.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "meshsim/error.hpp"
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

}  // namespace
}  // namespace meshsim::text
