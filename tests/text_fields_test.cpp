// The house's small vocabulary (meshsim/text_fields.hpp): the one case folding, checked
// arithmetic, KIND@RANK reader and --format rule every subcommand's flags go through.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

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
