#include "meshsim/int_tuple.hpp"

#include "meshsim/error.hpp"
#include "test_util.hpp"

namespace meshsim {
namespace {
using testing::T;
using testing::expect_throws_with;

TEST(IntTuple, IntAndOneTupleAreDifferentValues) {
  IntTuple four = 4;
  IntTuple one_tuple = IntTuple::tuple({4});
  EXPECT_NE(four, one_tuple);
  EXPECT_EQ(four.rank(), 1);
  EXPECT_EQ(one_tuple.rank(), 1);
  EXPECT_EQ(four.depth(), 0);
  EXPECT_EQ(one_tuple.depth(), 1);
  EXPECT_EQ(to_string(four), "4");
  EXPECT_EQ(to_string(one_tuple), "(4)");
  EXPECT_NE(four.hash(), one_tuple.hash());
}

TEST(IntTuple, RankDepthSizeOfNestedTuple) {
  IntTuple t = IntTuple::tuple({IntTuple::tuple({2, 2}), 4});
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.depth(), 2);
  EXPECT_EQ(size(t), 16);
  EXPECT_EQ(t[0], IntTuple::tuple({2, 2}));
  EXPECT_EQ(t[1], IntTuple(4));
  EXPECT_EQ(t.leaf_count(), 3);
  EXPECT_EQ(T("(((2)),3)").depth(), 3);
}

TEST(IntTuple, ParsePrintRoundTrip) {
  for (const char* s : {"4", "(4)", "((2,2),4)", "(1,(2,(3,(4))),5)", "9223372036854775807"}) {
    EXPECT_EQ(to_string(T(s)), s);
  }
}

TEST(IntTuple, ParseAcceptsSpacesAndPythonOneTuple) {
  EXPECT_EQ(T(" ( 2 , ( 3 ,4) ) "), T("(2,(3,4))"));
  EXPECT_EQ(T("(4,)"), IntTuple::tuple({4}));
}

TEST(IntTuple, ParseRejectsMalformedText) {
  for (const char* s : {"", "(", "()", "(2,", "(2 3)", "2)", "x", "(2,,3)", "-1", "(1.5)",
                        "99999999999999999999"}) {
    EXPECT_THROW(T(s), ParseError) << s;
  }
}

TEST(IntTuple, ParseRejectsAbsurdNestingWithoutRecursingDeeply) {
  std::string deep(100000, '(');
  deep += "1";
  deep += std::string(100000, ')');
  testing::expect_throws_with<ParseError>([&] { T(deep); }, "nesting deeper than");
}

TEST(Errors, QuoteInputKeepsShortValuesWholeAndClipsLongOnesAroundTheOffset) {
  EXPECT_EQ(quote_input("tp"), "'tp'");
  const std::string limit(kQuotedLimit, 'a');
  EXPECT_EQ(quote_input(limit), "'" + limit + "'");
  // Longer: kQuotedLimit bytes from the start, then "..." and the whole length.
  std::string text(1000, 'a');
  EXPECT_EQ(quote_input(text), "'" + std::string(kQuotedLimit, 'a') + "...' (1000 bytes)");
  // Around an offset: the byte there is shown, with "..." on both sides.
  text[700] = 'X';
  const std::string near = quote_input(text, 700);
  EXPECT_EQ(near, "'..." + std::string(100, 'a') + "X" + std::string(99, 'a') + "...' (1000 bytes)");
  // An offset near the end shows the last kQuotedLimit bytes; one past the end is clamped.
  EXPECT_EQ(quote_input(text, 999), "'..." + std::string(kQuotedLimit, 'a') + "' (1000 bytes)");
  EXPECT_EQ(quote_input(text, std::string::npos), quote_input(text, 999));
  // Cuts fall between UTF-8 characters: 'é' is two bytes, and no cut splits one.
  std::string accents;
  for (int i = 0; i < 301; ++i) accents += "\xC3\xA9";
  for (std::size_t at : {std::size_t{0}, std::size_t{301}, std::size_t{302}, std::size_t{601}}) {
    const std::string q = quote_input(accents, at);
    const std::size_t open = q.find("\xC3"), close = q.rfind("\xA9");
    ASSERT_NE(open, std::string::npos);
    EXPECT_EQ((close + 1 - open) % 2, 0u) << at;
    EXPECT_EQ(q.find('\xA9'), open + 1) << at;  // the first character shown is whole
    EXPECT_LE(q.size(), kQuotedLimit + 32) << at;
  }
  // Bytes that are all continuations (invalid UTF-8) still give a bounded quote.
  EXPECT_LE(quote_input(std::string(100000, '\x80'), 50000).size(), kQuotedLimit + 32);
}

TEST(IntTuple, ParseErrorsOnLongTextQuoteAroundTheOffset) {
  std::string deep(100000, '(');
  deep += "1";
  deep += std::string(100000, ')');
  try {
    T(deep);
    ADD_FAILURE() << "expected ParseError";
  } catch (const ParseError& e) {
    const std::string m = e.what();
    EXPECT_LT(m.size(), 400u) << m.substr(0, 400);
    EXPECT_NE(m.find("(200001 bytes) at offset 32: nesting deeper than 32"), std::string::npos) << m;
  }
}

TEST(IntTuple, SizeOverflowIsReported) {
  IntTuple t = IntTuple::tuple({int64_t{1} << 32, int64_t{1} << 32});
  testing::expect_throws_with<OverflowError>([&] { size(t); }, "overflows");
}

TEST(IntTuple, IndexOutOfRangeIsReported) {
  EXPECT_THROW(T("(1,2)")[2], OutOfRange);
  EXPECT_THROW(T("(1,2)")[-1], OutOfRange);
  EXPECT_THROW(T("3")[1], OutOfRange);
  EXPECT_EQ(T("3")[0], IntTuple(3));
}

TEST(IntTuple, FlattenAndCongruence) {
  EXPECT_EQ(flatten(T("((2,2),(3,(4)))")), T("(2,2,3,4)"));
  EXPECT_EQ(flatten(T("4")), T("(4)"));
  EXPECT_TRUE(congruent(T("((2,2),4)"), T("((1,8),2)")));
  EXPECT_FALSE(congruent(T("(2,2)"), T("((2),2)")));
  EXPECT_FALSE(congruent(T("4"), T("(4)")));
}

TEST(IntTuple, ShapeDivMatchesPycutesCases) {
  // CUTLASS's pycute test_int_tuple cases, and each branch of the definition.
  EXPECT_EQ(shape_div(T("(3,4)"), T("6")), T("(1,2)"));
  EXPECT_EQ(shape_div(T("(3,4)"), T("12")), T("(1,1)"));
  EXPECT_EQ(shape_div(T("(3,4)"), T("36")), T("(1,1)"));
  EXPECT_EQ(shape_div(T("((3,4),6)"), T("36")), T("((1,1),2)"));
  EXPECT_EQ(shape_div(T("(6,((3,4),6))"), T("36")), T("(1,((1,2),6))"));
  EXPECT_EQ(shape_div(T("12"), T("4")), T("3"));
  EXPECT_EQ(shape_div(T("4"), T("12")), T("1"));          // ceil(4 / 12)
  EXPECT_EQ(shape_div(T("12"), T("(2,3)")), T("2"));      // int / tuple: by its size
  EXPECT_EQ(shape_div(T("(8,9)"), T("(2,3)")), T("(4,3)"));  // mode by mode
  EXPECT_EQ(shape_div(T("(4)"), T("2")), T("(2)"));
  EXPECT_EQ(shape_div(T("0"), T("5")), T("0"));
}

TEST(IntTuple, ShapeDivRejectsWhatIsNotDivisibleEitherWay) {
  expect_throws_with<InvalidArgument>([] { shape_div(T("6"), T("4")); },
                                      "neither of 6 and 4 divides the other");
  expect_throws_with<InvalidArgument>([] { shape_div(T("(2,3)"), T("(2,3,4)")); },
                                      "different ranks");
  expect_throws_with<InvalidArgument>([] { shape_div(T("4"), T("0")); }, "needs a >= 0 and b >= 1");
  expect_throws_with<InvalidArgument>([] { shape_div(IntTuple(-4), T("2")); }, "needs a >= 0 and b >= 1");
  // Inside a tuple the first mode already fails: neither of 4 and 6 divides the other.
  expect_throws_with<InvalidArgument>([] { shape_div(T("(4,3)"), T("6")); }, "divides the other");
  EXPECT_THROW(shape_div(T("((4611686018427387904,4),3)"), T("2")), OverflowError);
}

}  // namespace
}  // namespace meshsim
