// JsonTape: the fast reader reads its subset exactly and refuses everything else, so the query
// engine can hand those lines to nlohmann.
#include "meshsim/json_tape.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/json_codec.hpp"
#include "meshsim/query.hpp"

namespace {

using meshsim::json::JsonTape;
using meshsim::json::TapeValue;

TEST(JsonTape, ReadsObjectsArraysAndScalars) {
  const std::string text = R"J( { "a" : [1, -2, [3]], "b":"x y", "c":null, "d":true, "e":{} } )J";
  JsonTape tape;
  ASSERT_TRUE(tape.read(text));
  const TapeValue root = tape.root();
  ASSERT_TRUE(root.is_object());
  EXPECT_EQ(root.size(), 5u);
  const auto a = root.member("a");
  ASSERT_TRUE(a && a->is_array());
  EXPECT_EQ(a->size(), 3u);
  std::vector<std::string> elements;
  for (const TapeValue& e : *a) elements.push_back(e.dump());
  EXPECT_EQ(elements, (std::vector<std::string>{"1", "-2", "[3]"}));
  EXPECT_EQ(root.member("b")->string_value(), "x y");  // points into the text
  EXPECT_TRUE(root.member("c")->is_null());
  EXPECT_TRUE(root.member("d")->bool_value());
  EXPECT_TRUE(root.member("e")->is_object());
  EXPECT_TRUE(root.member("e")->empty());
  EXPECT_FALSE(root.member("f").has_value());
  EXPECT_FALSE(a->member("a").has_value());  // not an object
  EXPECT_EQ(root.dump(), R"J({"a":[1,-2,[3]],"b":"x y","c":null,"d":true,"e":{}})J");
}

TEST(JsonTape, IteratesAnObjectsValuesInOrder) {
  JsonTape tape;
  ASSERT_TRUE(tape.read(R"J({"x":[1,2],"y":3,"z":{"w":4}})J"));
  std::vector<std::string> values;
  for (const TapeValue& v : tape.root()) values.push_back(v.dump());
  EXPECT_EQ(values, (std::vector<std::string>{"[1,2]", "3", R"J({"w":4})J"}));
}

TEST(JsonTape, IntegersCoverInt64AndMinusZeroIsZero) {
  JsonTape tape;
  ASSERT_TRUE(tape.read("[9223372036854775807,-9223372036854775808,-0,0]"));
  std::vector<int64_t> v;
  for (const TapeValue& e : tape.root()) v.push_back(e.int_value());
  EXPECT_EQ(v, (std::vector<int64_t>{INT64_MAX, INT64_MIN, 0, 0}));
  EXPECT_TRUE(TapeValue(tape, 1).is_number_unsigned());
  EXPECT_FALSE(TapeValue(tape, 2).is_number_unsigned());
}

TEST(JsonTape, ReadsUpToItsDepthAndMemberLimits) {
  JsonTape tape;
  const int d = meshsim::json::kMaxTapeDepth;
  EXPECT_TRUE(tape.read(std::string(d, '[') + std::string(d, ']')));
  std::string members = "{";
  for (int i = 0; i < 32; ++i) members += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  EXPECT_TRUE(tape.read(members + "}"));
  EXPECT_FALSE(tape.read(members + ",\"k32\":1}"));
  // The array itself is a node: n - 1 elements fit, n do not.
  const std::size_t n = meshsim::json::kMaxTapeNodes;
  auto zeros = [](std::size_t k) {
    std::string s = "[0";
    for (std::size_t i = 1; i < k; ++i) s += ",0";
    return s + "]";
  };
  EXPECT_TRUE(tape.read(zeros(n - 1)));
  EXPECT_FALSE(tape.read(zeros(n)));
}

// Each text is either not JSON or JSON outside the subset: read() must refuse it.
TEST(JsonTape, RefusesWhatItCannotReadExactly) {
  const int d = meshsim::json::kMaxTapeDepth + 1;
  const std::vector<std::string> refused = {
      "",
      "   ",
      R"J({"a":"\u0041"})J",            // an escape
      R"J({"a":"\\"})J",                // an escaped backslash
      "{\"a\":\"\xc3\xa9\"}",         // non-ASCII (UTF-8)
      "{\"a\":\"\xff\"}",             // a byte that is not UTF-8
      "\xef\xbb\xbf{}",               // a byte-order mark (nlohmann skips it)
      "{\"a\":\"x\ty\"}",             // a raw tab inside a string
      R"J({"a":1.5})J",                 // a fraction
      R"J({"a":1e2})J",                 // an exponent
      R"J({"a":9223372036854775808})J", // past int64 (nlohmann keeps it as uint64)
      R"J({"a":-9223372036854775809})J",
      R"J({"a":1e400})J",
      R"J({"a":1,"a":2})J",             // a repeated key (nlohmann keeps the last)
      R"J({"a":{"b":1,"b":1}})J",
      R"J({"a":1} x)J",                 // trailing text
      R"J({"a":1,})J",
      R"J({"a":01})J",
      R"J([1 2])J",
      std::string(d, '[') + std::string(d, ']'),
  };
  JsonTape tape;
  for (const std::string& t : refused) EXPECT_FALSE(tape.read(t)) << t;
}

TEST(JsonTape, ReadersGiveTheSameValuesAsOverNlohmann) {
  const std::vector<std::string> layouts = {
      R"J({"shape":[2,[3,4]],"stride":[12,[4,1]]})J", R"J({"sizes":8,"strides":0})J",
      R"J("((2,2),4):((1,8),2)")J", R"J({"shape":[2],"stride":[1]})J"};
  for (const std::string& text : layouts) {
    JsonTape tape;
    ASSERT_TRUE(tape.read(text)) << text;
    EXPECT_EQ(meshsim::json::to_layout(tape.root(), "l"),
              meshsim::json::to_layout(nlohmann::json::parse(text), "l"))
        << text;
  }
  JsonTape tape;
  ASSERT_TRUE(tape.read("[null,[1,null],3]"));
  EXPECT_EQ(meshsim::json::to_int_tuple(tape.root(), "t", meshsim::json::NullAs::kZero),
            meshsim::parse_int_tuple("(0,(1,0),3)"));
  EXPECT_THROW(meshsim::json::to_int_tuple(tape.root(), "t"), meshsim::InvalidArgument);
}

// The engine's fast path is live for plain requests (and gives nlohmann's answer), and leaves
// unusual ones to nlohmann.
TEST(QueryFastPath, AnswersPlainRequestsAsNlohmannWould) {
  const std::vector<std::string> plain = {
      R"J({"id":1,"op":"composition","a":{"shape":[2,4,8],"stride":[32,8,1]},"b":{"shape":[2,4],"stride":[8,1]}})J",
      R"J({"id":"q-2","op":"complement_bound","layout":"(2,4):(8,1)","bound":64})J",
      R"J({"op":"mesh_unflatten","layout":"64:1","dim":0,"sizes":[2,4,8]})J",
      R"J({"id":-4,"op":"coalesce","convention":"cute","layout":"((2,2),4,8):((1,2),4,16)"})J",
      R"J({"id":5,"op":"crd2idx","coords":[37,[1,null,2]],"layout":"(2,4,8):(32,8,1)"})J",
      R"J({"id":6,"op":"idx2crd","shape":[2,[3,4]],"indices":[0,23]})J",
      R"J({"id":7,"op":"mesh_global_ranks","layout":"(2,2):(1,4)","world_size":16})J",
      R"J({"id":8,"op":"mesh_remap_to_tensor","layout":"(2,2):(2,1)","rank_map":[5,6,7,8]})J",
      R"J({"id":9,"op":"mesh_disjoint","layouts":["2:1","2:2"]})J",
      R"J({"id":10,"op":"logical_divide_tiler","a":"(4,8):(8,1)","tiler":[2,null]})J"};
  for (const std::string& line : plain) {
    const auto fast = meshsim::query::detail::fast_answer(line);
    ASSERT_TRUE(fast.has_value()) << line;
    EXPECT_EQ(*fast, meshsim::query::answer_line_nlohmann(line)) << line;
    EXPECT_EQ(nlohmann::json::parse(*fast)["ok"], true) << *fast;
  }
  std::vector<std::string> left = {
      R"J({"id":1.5,"op":"size","layout":"4:1"})J",               // a float id is echoed as sent
      R"J({"id":[1],"op":"size","layout":"4:1"})J",
      R"J({"id":"\u00e9","op":"size","layout":"4:1"})J",
      R"J({"op":"size","layout":"4:1","op":"rank"})J",
      R"J({"op":"size","layout":"4:3:1"})J",                      // an error
      R"J({"op":"mesh_flatten","convention":"cute","layout":"4:1"})J",
      R"J({"op":"mesh.program","world_size":8,"build":{"init_device_mesh":{"mesh_shape":[8]}}})J"};
  std::string big = R"J({"id":11,"op":"size","layout":"4:1","rank_map":[0)J";
  for (std::size_t i = 0; i < meshsim::json::kMaxTapeNodes; ++i) big += ",0";
  left.push_back(big + "]}");  // past the tape's node cap: answered from nlohmann's tree
  for (const std::string& line : left) {
    EXPECT_FALSE(meshsim::query::detail::fast_answer(line).has_value()) << line.substr(0, 80);
    EXPECT_EQ(meshsim::query::answer_line(line), meshsim::query::answer_line_nlohmann(line));
  }
  EXPECT_EQ(meshsim::query::answer_line(left.back()), R"J({"id":11,"ok":true,"result":4})J");
}

// A request whose op fails, after every argument was read, is refused on the fast path with
// nlohmann's words (those errors come from the algebra, on the values both readers read alike);
// one that fails while its arguments are read is left to nlohmann, whose words may differ.
TEST(QueryFastPath, RefusesOpErrorsItselfAndLeavesReadErrorsToNlohmann) {
  const std::vector<std::string> op_errors = {
      R"J({"id":4,"op":"mesh_getitem","layout":"(2,4):(4,1)","index":5})J",
      R"J({"id":"u","op":"mesh_unflatten","layout":"64:1","dim":0,"sizes":[2,4,4]})J",
      R"J({"op":"crd2idx","coords":[[1,2,3]],"layout":"(2,4):(4,1)"})J"};
  for (const std::string& line : op_errors) {
    const auto fast = meshsim::query::detail::fast_answer(line);
    ASSERT_TRUE(fast.has_value()) << line;
    EXPECT_EQ(*fast, meshsim::query::answer_line_nlohmann(line)) << line;
    EXPECT_EQ(nlohmann::json::parse(*fast)["ok"], false) << *fast;
  }
  const std::vector<std::string> read_errors = {
      R"J({"id":6,"op":"size","layout":{"stride":[1,2],"shape":[2]}})J",  // not congruent
      R"J({"op":"size","layout":{"stride":true,"shape":[2]}})J",
      R"J({"op":"complement_bound","layout":"(2,4):(8,1)"})J"};  // no bound
  for (const std::string& line : read_errors) {
    EXPECT_FALSE(meshsim::query::detail::fast_answer(line).has_value()) << line;
    EXPECT_EQ(meshsim::query::answer_line(line), meshsim::query::answer_line_nlohmann(line));
  }
}

}  // namespace
