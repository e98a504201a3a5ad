// The `meshsim query` contract (docs/query-and-show.md), in-process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <atomic>
#include <fstream>
#include <thread>
#include <vector>
#include <sstream>

#include "meshsim/error.hpp"
#include "meshsim/query.hpp"

namespace {

using Json = nlohmann::json;

Json ask(const std::string& line) { return Json::parse(meshsim::query::answer_line(line)); }

TEST(Query, AnswersWithIdOkAndResult) {
  Json a = ask(R"J({"id": 7, "op": "size", "layout": {"shape": [2, 4], "stride": [4, 1]}})J");
  EXPECT_EQ(a, Json::parse(R"J({"id": 7, "ok": true, "result": 8})J"));
}

TEST(Query, ErrorsQuoteALongValueClippedWithItsLength) {
  const std::string op(1 << 20, 'z');
  const std::string answer = meshsim::query::answer_line(R"({"id":1,"op":")" + op + R"("})");
  EXPECT_LT(answer.size(), 400u);
  Json a = Json::parse(answer);
  EXPECT_EQ(a["error"]["type"], "NotFound");
  EXPECT_EQ(a["error"]["message"], "unknown op '" + std::string(meshsim::kQuotedLimit, 'z') + "...' (1048576 bytes)");
}

TEST(Query, EachRequestCarriesItsOwnAnswerBudget) {
  // The budget is an argument, not process state: calls with different budgets, at once, each
  // answer by their own (mesh.program charges its rank_map as 8 elements).
  const std::string all = R"J({"id": 1, "op": "mesh_all_ranks_from_zero", "layout": {"shape": 64, "stride": 1}})J";
  const std::string prog = R"J({"id": 2, "op": "mesh.program", "world_size": 8,
      "build": {"init_device_mesh": {"mesh_shape": [2, 4], "mesh_dim_names": ["dp", "tp"]}}, "want": ["rank_map"]})J";
  std::vector<std::thread> ts;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      const int64_t budget = t % 2 ? 63 : 64;
      for (int i = 0; i < 200; ++i) {
        const Json a = Json::parse(meshsim::query::answer_line(all, budget));
        if (a["ok"] != (budget == 64)) ++wrong;
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(Json::parse(meshsim::query::answer_line(prog, 8))["ok"], true);
  const Json small = Json::parse(meshsim::query::answer_line(prog, 7));
  ASSERT_TRUE(small.contains("error")) << small.dump();
  EXPECT_EQ(small["error"]["type"], "ResourceExhausted") << small.dump();
  EXPECT_NE(small["error"]["message"].get<std::string>().find("budget of 7"), std::string::npos) << small.dump();
  const Json none = Json::parse(meshsim::query::answer_line(all, 0));
  ASSERT_TRUE(none.contains("error")) << none.dump();
  EXPECT_EQ(none["error"]["type"], "InvalidArgument") << none.dump();
}

TEST(Query, ShapeDivAnswersAndRefuses) {
  Json a = ask(R"J({"id": 1, "op": "shape_div", "a": [6, [[3, 4], 6]], "b": 36})J");
  EXPECT_EQ(a["result"], Json::parse("[1, [[1, 2], 6]]")) << a.dump();
  Json b = ask(R"J({"id": 2, "op": "shape_div", "a": 6, "b": 4})J");
  EXPECT_EQ(b["error"]["type"], "InvalidArgument") << b.dump();
}

TEST(Query, CheckOrthogonalAndNonOverlapAnswerDifferentQuestions) {
  // (3,2):(2,3) reaches {0,3,2,5,4,7}: no rank twice, but its modes do not nest (3 % 6 != 0).
  EXPECT_EQ(ask(R"J({"op": "mesh_check_non_overlap", "layout": "(3,2):(2,3)"})J")["result"], true);
  EXPECT_EQ(ask(R"J({"op": "mesh_check_orthogonal", "layout": "(3,2):(2,3)"})J")["result"], false);
  EXPECT_EQ(ask(R"J({"op": "mesh_check_orthogonal", "layout": {"shape": [2, 3], "stride": [6, 1]}})J")["result"], true);
  EXPECT_EQ(ask(R"J({"op": "mesh_check_orthogonal", "convention": "cute", "layout": "4:1"})J")["ok"], false);
}

TEST(Query, NumericIdsAreEchoedExactly) {
  for (const std::string id : {"123456789012345678901234567890", "-9223372036854775809", "1.50",
                               "1e400", "2E-7", "18446744073709551615", "7"}) {
    const std::string answer = meshsim::query::answer_line(
        R"({"id":)" + id + R"(,"op":"size","layout":{"shape":2,"stride":1}})");
    EXPECT_NE(answer.find("\"id\":" + id + ","), std::string::npos) << answer;
  }
}

TEST(Query, AcceptsCuteTextLayoutsAndAnyIdType) {
  Json a = ask(R"J({"id": "x", "op": "complement_bound", "layout": "(2,2):(4,1)", "bound": 16})J");
  EXPECT_EQ(a["id"], "x");
  EXPECT_EQ(a["result"], Json::parse(R"J({"shape": [2, 2], "stride": [8, 2]})J"));
}

TEST(Query, ConventionSelectsCute) {
  Json a = ask(R"J({"op": "complement_bound", "convention": "cute",
                   "layout": {"shape": [2, 2], "stride": [1, 4]}, "bound": 16})J");
  EXPECT_EQ(a["result"], Json::parse(R"J({"shape": [2, 2], "stride": [2, 8]})J"));
  EXPECT_EQ(a["id"], nullptr);
}

TEST(Query, ScalarAndOneTupleResultsStayDistinct) {
  EXPECT_EQ(ask(R"J({"op": "coalesce", "layout": "(8):(1)"})J")["result"],
            Json::parse(R"J({"shape": 8, "stride": 1})J"));
  EXPECT_EQ(ask(R"J({"op": "mesh_nest", "layout": "8:1"})J")["result"],
            Json::parse(R"J({"shape": [8], "stride": [1]})J"));
}

TEST(Query, TypedErrorsForBadInput) {
  struct Bad {
    const char* line;
    const char* type;
  };
  for (const Bad& b : {
           Bad{"not json", "ParseError"},
           Bad{"[1,2]", "ParseError"},
           Bad{R"J({"op": "size"})J", "InvalidArgument"},
           Bad{R"J({"op": "nope", "layout": "4:1"})J", "NotFound"},
           Bad{R"J({"op": 3})J", "InvalidArgument"},
           Bad{R"J({"op": "size", "layout": {"shape": [2, 2], "stride": [1]}})J", "InvalidArgument"},
           Bad{R"J({"op": "size", "layout": {"shape": [], "stride": []}})J", "InvalidArgument"},
           Bad{R"J({"op": "size", "layout": {"shape": 2.5, "stride": 1}})J", "InvalidArgument"},
           Bad{R"J({"op": "size", "layout": {"shape": 18446744073709551615, "stride": 1}})J",
               "OverflowError"},
           Bad{R"J({"op": "size", "layout": {"shape": [4294967296, 4294967296], "stride": [1, 1]}})J",
               "OverflowError"},
           Bad{R"J({"op": "size", "convention": "colex", "layout": "4:1"})J", "InvalidArgument"},
           Bad{R"J({"op": "mesh_flatten", "convention": "cute", "layout": "4:1"})J",
               "InvalidArgument"},
           Bad{R"J({"op": "composition", "convention": "cute", "a": "(3,4):(1,5)", "b": "4:1"})J",
               "InvalidArgument"},
           Bad{R"J({"op": "mesh_all_ranks_from_zero", "layout": "(1048576,1048576):(1048576,1)"})J",
               "ResourceExhausted"},
       }) {
    Json a = ask(b.line);
    EXPECT_FALSE(a["ok"].get<bool>()) << b.line;
    EXPECT_EQ(a["error"]["type"], b.type) << b.line << " -> " << a.dump();
    EXPECT_FALSE(a["error"]["message"].get<std::string>().empty());
  }
}

TEST(Query, AbsurdNestingIsRejectedNotRecursed) {
  std::string deep = R"J({"op": "size", "layout": {"shape": )J" + std::string(200000, '[') + "1" +
                     std::string(200000, ']') + R"J(, "stride": 1}})J";
  Json a = ask(deep);
  EXPECT_FALSE(a["ok"].get<bool>());
  EXPECT_EQ(a["error"]["type"], "ParseError");
}

TEST(Query, InvalidUtf8IsAnsweredNotThrown) {
  Json a = ask("{\"op\": \"\xff\xfe\"}");
  EXPECT_FALSE(a["ok"].get<bool>());
}

TEST(Query, RunAnswersEveryLineInOrderAndSkipsBlankLines) {
  std::istringstream in(
      "{\"id\":1,\"op\":\"rank\",\"layout\":\"(2,3):(3,1)\"}\n"
      "\n"
      "garbage\n"
      "{\"id\":3,\"op\":\"depth\",\"layout\":\"((2,3),4):((3,1),12)\"}\n");
  std::ostringstream out;
  EXPECT_EQ(meshsim::query::run(in, out), 3u);
  std::istringstream lines(out.str());
  std::string l1, l2, l3;
  std::getline(lines, l1);
  std::getline(lines, l2);
  std::getline(lines, l3);
  EXPECT_EQ(Json::parse(l1)["result"], 2);
  EXPECT_FALSE(Json::parse(l2)["ok"].get<bool>());
  EXPECT_EQ(Json::parse(l3)["id"], 3);
  EXPECT_EQ(Json::parse(l3)["result"], 2);
}

// run_lines reads in 64 KiB chunks: lines longer than a chunk, a last line without '\n', NUL
// bytes and blank lines must all come out as with a byte-at-a-time reader.
TEST(Query, RunReadsLinesLongerThanItsChunks) {
  const std::string pad(150000, ' ');
  const std::string big = "{\"id\":1,\"op\":\"size\"," + pad + "\"layout\":\"(2,3):(3,1)\"}";
  std::string nul = "{\"id\":2,\"op\":\"size\"}";
  nul.insert(5, 1, '\0');
  std::istringstream in(big + "\n" + pad + "\n" + nul + "\n" + big + "\n" +
                        "{\"id\":3,\"op\":\"rank\",\"layout\":\"(2,3):(3,1)\"}");
  std::ostringstream out;
  const auto r = meshsim::query::run_lines(in, out);
  EXPECT_TRUE(r.input_ok);
  ASSERT_EQ(r.answers, 4u);
  std::istringstream lines(out.str());
  std::vector<Json> a;
  for (std::string l; std::getline(lines, l);) a.push_back(Json::parse(l));
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a[0]["result"], 6);
  EXPECT_EQ(a[1]["error"]["type"], "ParseError");
  EXPECT_NE(a[1]["error"]["message"].get<std::string>().find("NUL byte at offset 5"), std::string::npos);
  EXPECT_EQ(a[2]["result"], 6);
  EXPECT_EQ(a[3]["id"], 3);
  EXPECT_EQ(a[3]["result"], 2);
}

TEST(Query, RunTakesALineOfTheMaximumLengthAndRefusesALongerOne) {
  using meshsim::query::kMaxLineBytes;
  // A blank line of n bytes, then a request; returns what run_lines did and its one answer.
  auto run = [](std::size_t n) {
    std::istringstream in(std::string(n, ' ') + "\n{\"op\":\"rank\",\"layout\":\"4:1\"}\n");
    std::ostringstream out;
    const auto r = meshsim::query::run_lines(in, out);
    EXPECT_EQ(r.answers, 1u);
    return std::make_pair(r, Json::parse(out.str()));
  };
  const auto [at_limit, answer] = run(kMaxLineBytes);  // skipped as blank; the request answered
  EXPECT_TRUE(at_limit.input_ok);
  EXPECT_EQ(answer["result"], 1);
  const auto [over, refusal] = run(kMaxLineBytes + 1);  // refused; the rest is not read
  EXPECT_FALSE(over.input_ok);
  EXPECT_EQ(refusal["error"]["type"], "ResourceExhausted");
  EXPECT_NE(refusal["error"]["message"].get<std::string>().find("longer than"), std::string::npos);
}

TEST(Query, RunAnswersAReadErrorAndStops) {
  std::ifstream in(MESHSIM_TEST_DATA);  // a directory: it opens, and every read fails
  ASSERT_TRUE(in.is_open());
  std::ostringstream out;
  const auto r = meshsim::query::run_lines(in, out);
  EXPECT_FALSE(r.input_ok);
  EXPECT_EQ(r.answers, 1u);
  const Json a = Json::parse(out.str());
  EXPECT_EQ(a["error"]["type"], "Unavailable");
  EXPECT_NE(a["error"]["message"].get<std::string>().find("reading the input failed"), std::string::npos);
}

TEST(Query, TilerArgument) {
  Json a = ask(R"J({"op": "composition_tiler", "a": "(4,6,8):(48,8,1)",
                   "tiler": [2, null, {"shape": 2, "stride": 2}]})J");
  EXPECT_EQ(a["result"], Json::parse(R"J({"shape": [2, 6, 2], "stride": [48, 8, 2]})J"));
}

TEST(Query, MeshRemapToTensorIsNested) {
  Json a = ask(R"J({"op": "mesh_remap_to_tensor", "layout": {"shape": 2, "stride": 2},
                   "rank_map": [10, 20, 30, 40]})J");
  EXPECT_EQ(a["result"], Json::parse("[[10, 30], [20, 40]]"));
}

}  // namespace
