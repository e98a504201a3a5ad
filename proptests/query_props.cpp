// Hostile mesh.program / mesh.equal requests: random JSON built from the ops' own vocabulary
// (so it reaches deep into the program runner) mixed with junk values. Every line must get a
// well-formed answer; a refusal must be a typed meshsim error, never Internal (an escaped
// exception) and never a crash or hang.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <vector>

#include "meshsim/int_tuple.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/query.hpp"

namespace {

using Json = nlohmann::json;

const std::vector<std::string>& vocabulary() {
  static const std::vector<std::string> v{
      "slice", "flatten", "unflatten", "concatenate", "on", "let", "dim", "sizes", "names",
      "mesh_shape", "mesh_dim_names", "mesh", "init_device_mesh", "DeviceMesh", "world_size",
      "rank", "build", "ops", "result", "want", "backend_override", "device_type", "dp", "tp",
      "cp", "root", "_last", "coordinate", "my_groups", "groups_by_dim", "mesh_by_rank", "0",
      "timeout_ms", "backend", "a", "b", "same_root"};
  return v;
}

rc::Gen<int64_t> any_int() {
  return rc::gen::oneOf(rc::gen::inRange<int64_t>(-3, 9),
                        rc::gen::element<int64_t>(INT64_MAX, INT64_MIN, int64_t{1} << 62,
                                                  int64_t{1} << 31, 4096, -1));
}

Json junk(int depth) {
  const int kind = *rc::gen::inRange(0, depth > 3 ? 5 : 8);
  switch (kind) {
    case 0: return Json(*any_int());
    case 1: return Json(*rc::gen::elementOf(vocabulary()));
    case 2: return Json(nullptr);
    case 3: return Json(*rc::gen::arbitrary<bool>());
    case 4: return Json(1.5);
    case 5:
    case 6: {
      Json a = Json::array();
      const int n = *rc::gen::inRange(0, 4);
      for (int i = 0; i < n; ++i) a.push_back(junk(depth + 1));
      return a;
    }
    default: {
      Json o = Json::object();
      const int n = *rc::gen::inRange(0, 4);
      for (int i = 0; i < n; ++i) o[*rc::gen::elementOf(vocabulary())] = junk(depth + 1);
      return o;
    }
  }
}

Json program() {
  Json p = Json::object();
  p["world_size"] = *rc::gen::weightedElement<int64_t>({{6, 8}, {2, 16}, {1, 0}, {1, INT64_MAX}});
  if (*rc::gen::arbitrary<bool>()) {
    p["build"] = Json{{"init_device_mesh", {{"mesh_shape", {2, 2, 2}},
                                            {"mesh_dim_names", {"dp", "cp", "tp"}}}}};
  } else {
    p["build"] = junk(1);
  }
  Json ops = Json::array();
  const int n = *rc::gen::inRange(0, 5);
  for (int i = 0; i < n; ++i) {
    Json step = Json::object();
    const std::string kind = *rc::gen::elementOf(
        std::vector<std::string>{"slice", "flatten", "unflatten", "concatenate"});
    const std::vector<std::string> names{"dp", "cp", "tp", "dp_cp", "x"};
    Json value = junk(2);
    if (*rc::gen::arbitrary<bool>()) {  // plausible arguments reach the mesh rules
      if (kind == "slice") {
        value = Json{*rc::gen::elementOf(names), *rc::gen::elementOf(names)};
      } else if (kind == "flatten") {
        value = *rc::gen::arbitrary<bool>() ? Json(nullptr) : Json(*rc::gen::elementOf(names));
      } else if (kind == "unflatten") {
        value = Json{{"dim", *rc::gen::inRange(-1, 3)},
                     {"sizes", {*rc::gen::inRange(0, 5), *rc::gen::inRange(1, 3)}},
                     {"names", {"u" + std::to_string(i), *rc::gen::elementOf(names)}}};
      } else {
        value = Json{"root", "_last"};
      }
    }
    step[kind] = value;
    if (*rc::gen::arbitrary<bool>()) step["on"] = junk(3);
    if (*rc::gen::arbitrary<bool>()) step["let"] = junk(3);
    ops.push_back(step);
  }
  p["ops"] = *rc::gen::weightedElement<int>({{5, 1}, {1, 0}}) ? ops : junk(1);
  if (*rc::gen::arbitrary<bool>()) p["want"] = junk(1);
  if (*rc::gen::arbitrary<bool>()) p["rank"] = junk(3);
  if (*rc::gen::arbitrary<bool>()) p["result"] = junk(3);
  return p;
}

void check_answer(const std::string& line) {
  Json a = Json::parse(meshsim::query::answer_line(line));
  RC_ASSERT(a.is_object());
  RC_ASSERT(a.at("ok").is_boolean());
  RC_TAG(a["ok"].get<bool>() ? std::string("ok") : a["error"]["type"].get<std::string>());
  if (!a["ok"].get<bool>()) {
    RC_ASSERT(a.at("error").at("type").get<std::string>() != "Internal");
    RC_ASSERT(!a["error"]["message"].get<std::string>().empty());
  }
}

RC_GTEST_PROP(QueryProps, HostileMeshProgramsGetTypedAnswers, ()) {
  Json req = program();
  req["op"] = "mesh.program";
  check_answer(req.dump());
}

RC_GTEST_PROP(QueryProps, HostileMeshEqualRequestsGetTypedAnswers, ()) {
  Json req = {{"op", "mesh.equal"}, {"a", program()}, {"b", program()}, {"same_root", junk(3)}};
  check_answer(req.dump());
}

RC_GTEST_PROP(QueryProps, TruncatedRequestsGetTypedAnswers, ()) {
  Json req = program();
  req["op"] = "mesh.program";
  const std::string text = req.dump();
  const auto cut = *rc::gen::inRange<std::size_t>(0, text.size() + 1);
  check_answer(text.substr(0, cut));
}

// ---- the limits policy: one cap on nodes per tuple, one element budget per answer, every id
// echoed exactly, each with random sizes around the limits.

Json ask(const Json& req) { return Json::parse(meshsim::query::answer_line(req.dump())); }

Json flat(int n, int64_t v) { return Json(std::vector<int64_t>(static_cast<std::size_t>(n), v)); }

RC_GTEST_PROP(QueryLimits, LayoutsPastTheNodeCapAreRefusedAndBelowItAnswered, ()) {
  // A flat tuple of n leaves has n + 1 nodes.
  const int n = *rc::gen::inRange(1, 2 * meshsim::kMaxNodes);
  const std::string op = *rc::gen::element<std::string>("mesh_remap_to_tensor", "filter_profile",
                                                        "coalesce_profile", "idx2crd", "crd2idx");
  Json req = {{"id", 1}, {"op", op}};
  const Json layout = {{"shape", flat(n, 1)}, {"stride", flat(n, 1)}};
  if (op == "mesh_remap_to_tensor") req.update({{"layout", layout}, {"rank_map", {0}}});
  if (op == "filter_profile" || op == "coalesce_profile") req.update({{"layout", layout}, {"profile", flat(n, 0)}});
  if (op == "idx2crd") req.update({{"shape", flat(n, 1)}, {"indices", {0, 0}}});
  if (op == "crd2idx") req.update({{"layout", layout}, {"coords", {flat(n, 0)}}});
  const Json a = ask(req);
  RC_TAG(n + 1 > meshsim::kMaxNodes ? "over the cap" : "under the cap");
  if (n + 1 > meshsim::kMaxNodes) {
    RC_ASSERT(a["ok"] == false);
    RC_ASSERT(a["error"]["type"] == "InvalidArgument");
    RC_ASSERT(a["error"]["message"].get<std::string>().find("nodes") != std::string::npos);
  } else {
    RC_ASSERT(a["ok"] == true);
  }
}

RC_GTEST_PROP(QueryLimits, AnswersOverTheElementBudgetAreRefusedBeforeTheyAreBuilt, ()) {
  // A small budget keeps the requests small; the policy is the same at any budget.
  const int64_t budget = *rc::gen::inRange<int64_t>(1, 1 << 14);
  const int kind = *rc::gen::inRange(0, 3);
  Json req = {{"id", 7}};
  int64_t elements = 0;
  if (kind == 0) {  // idx2crd: indices x (modes + 1)
    const int modes = *rc::gen::inRange(1, 4000);
    const int64_t indices = *rc::gen::inRange<int64_t>(1, 3 * budget / (modes + 1) + 2);
    req.update({{"op", "idx2crd"}, {"shape", flat(modes, 1)}, {"indices", flat(static_cast<int>(indices), 0)}});
    elements = indices * (modes + 1);
  } else if (kind == 1) {  // a broadcast layout over a small rank map: size x copies
    const int log2 = *rc::gen::inRange(0, 17);
    const int64_t ranks = *rc::gen::inRange<int64_t>(1, 5);
    req.update({{"op", "mesh_remap_to_tensor"}, {"layout", {{"shape", int64_t{1} << log2}, {"stride", 0}}},
                {"rank_map", flat(static_cast<int>(ranks), 3)}});
    elements = (int64_t{1} << log2) * ranks;
  } else {  // all ranks of a compact layout
    const int log2 = *rc::gen::inRange(0, 17);
    req.update({{"op", "mesh_all_ranks_from_zero"}, {"layout", {{"shape", {int64_t{1} << (log2 / 2), int64_t{1} << (log2 - log2 / 2)}}, {"stride", {1, int64_t{1} << (log2 / 2)}}}}});
    elements = int64_t{1} << log2;
  }
  const Json a = Json::parse(meshsim::query::answer_line(req.dump(), budget));
  RC_TAG(elements > budget ? "over the budget" : "within the budget");
  if (elements > budget) {
    RC_ASSERT(a["ok"] == false);
    RC_ASSERT(a["error"]["type"] == "ResourceExhausted");
  } else {
    RC_ASSERT(a["ok"] == true);
  }
}

RC_GTEST_PROP(QueryLimits, EveryNumericIdIsEchoedExactly, ()) {
  // Any JSON number: long integers (past int64 and uint64), fractions, exponents.
  std::string id = *rc::gen::element<std::string>("", "-");
  const int digits = *rc::gen::inRange(1, 60);
  id += std::to_string(*rc::gen::inRange(1, 10));
  for (int i = 1; i < digits; ++i) id += std::to_string(*rc::gen::inRange(0, 10));
  if (*rc::gen::arbitrary<bool>()) id += "." + std::to_string(*rc::gen::inRange(0, 100000));
  if (*rc::gen::arbitrary<bool>()) {
    id += *rc::gen::element<std::string>("e", "E", "e+", "e-") + std::to_string(*rc::gen::inRange(0, 400));
  }
  const std::string ok = R"({"id":)" + id + R"(,"op":"size","layout":{"shape":2,"stride":1}})";
  const std::string bad = R"({"op":"nope","id":)" + id + "}";
  for (const std::string& line : {ok, bad}) {
    const std::string answer = meshsim::query::answer_line(line);
    if (answer.find("\"id\":" + id + ",") == std::string::npos) RC_FAIL(line + " -> " + answer);
  }
}

}  // namespace

// ---- the fast reader: answer_line reads plain requests with the tape (json_tape.hpp) and the
// rest with nlohmann; whatever the text, the answer must be the one nlohmann's path alone gives.

namespace fast {

// Raw JSON text, so whitespace, repeated keys, escapes, non-ASCII and odd numbers all occur.
std::string ws() { return *rc::gen::weightedElement<std::string>({{12, ""}, {2, " "}, {1, " \t "}, {1, "\r\n"}}); }

std::string number() {
  return *rc::gen::weightedElement<std::string>(
      {{20, std::to_string(*rc::gen::inRange(-3, 17))},
       {3, std::to_string(*rc::gen::inRange<int64_t>(-70000, 70000))},
       {1, "9223372036854775807"}, {1, "-9223372036854775808"}, {1, "9223372036854775808"},
       {1, "18446744073709551616"}, {1, "-0"}, {1, "1.5"}, {1, "2e3"}, {1, "1E400"},
       {1, "4611686018427387904"}, {1, "00"}, {1, "-"}});
}

std::string string_value() {
  return *rc::gen::weightedElement<std::string>(
      {{6, R"J("(2,4):(4,1)")J"}, {4, R"J("8:1")J"}, {3, R"J("((2,2),4):((1,8),2)")J"}, {2, R"J("(2,2):(1,4)")J"},
       {2, R"J("4")J"}, {1, R"J("(4,8):(8,1)")J"}, {1, R"J("2:1")J"}, {1, R"J("(2,3):(0,1)")J"},
       {1, R"J("garbage")J"}, {1, R"J("(2,\u0034):(1,2)")J"}, {1, "\"(2,4):(4,1)\xc3\xa9\""},
       {1, R"J("")J"}, {1, R"J("a\"b")J"}, {1, "\"\xff\""}, {1, R"J("\ud800")J"}, {1, R"J("x y")J"}});
}

std::string value(int depth);

std::string tuple(int depth) {
  if (depth > 3 || *rc::gen::weightedElement<int>({{3, 0}, {2, 1}})) {
    return *rc::gen::weightedElement<std::string>({{12, std::to_string(*rc::gen::inRange(1, 9))},
                                                   {1, "0"}, {1, "null"}, {1, number()}});
  }
  std::string s = "[" + ws();
  const int n = *rc::gen::weightedElement<int>({{1, 0}, {6, 1}, {8, 2}, {6, 3}, {1, 5}});
  for (int i = 0; i < n; ++i) s += (i ? "," + ws() : "") + tuple(depth + 1) + ws();
  return s + "]";
}

std::string layout() {
  const int kind = *rc::gen::inRange(0, 5);
  if (kind < 2) return string_value();
  if (kind == 4) return value(2);
  const std::string t = tuple(1);
  // A congruent stride most of the time: the shape's text with each leaf replaced.
  std::string stride = t;
  for (char& c : stride) {
    if (c >= '1' && c <= '9') c = static_cast<char>('0' + *rc::gen::inRange(0, 10));
  }
  if (*rc::gen::arbitrary<bool>()) stride = tuple(1);
  const bool torch_names = *rc::gen::weightedElement<bool>({{5, false}, {1, true}});
  std::string s = "{" + ws() + (torch_names ? R"J("sizes")J" : R"J("shape")J") + ":" + t + "," + ws() +
                  (torch_names ? R"J("strides")J" : R"J("stride")J") + ":" + stride;
  if (*rc::gen::weightedElement<bool>({{8, false}, {1, true}})) s += R"J(,"shape":)J" + tuple(1);
  return s + ws() + "}";
}

std::string value(int depth) {
  const int kind = *rc::gen::inRange(0, depth > 2 ? 5 : 8);
  switch (kind) {
    case 0: return number();
    case 1: return string_value();
    case 2: return *rc::gen::element<std::string>("null", "true", "false");
    case 3: return tuple(depth);
    case 4: return layout();
    case 5: {
      std::string s = "[";
      const int n = *rc::gen::inRange(0, 4);
      for (int i = 0; i < n; ++i) s += (i ? "," : "") + value(depth + 1);
      return s + "]";
    }
    case 6: return "[" + layout() + "," + layout() + "]";
    default: return "{" + std::string(R"J("k":)J") + value(depth + 1) + "}";
  }
}

// argument writes a plausible value of `kind` most of the time, any value otherwise. Kinds:
// L layout, T tuple, I small integer, N count (bound, world size), C coordinates, LS layouts,
// TL tiler, S sizes or a rank map.
std::string argument(char kind) {
  if (*rc::gen::weightedElement<bool>({{1, true}, {8, false}})) return value(1);
  auto list = [](int max, auto element) {
    std::string s = "[";
    const int n = *rc::gen::inRange(0, max);
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + element();
    return s + "]";
  };
  switch (kind) {
    case 'L': return layout();
    case 'T': return tuple(0);
    case 'N': return std::to_string(*rc::gen::inRange(0, 70));
    case 'C': return list(4, [] { return tuple(1); });
    case 'A': return list(4, [] { return layout(); });
    case 'R':
      return list(4, [] {
        return *rc::gen::weightedElement<int>({{2, 0}, {1, 1}, {1, 2}}) == 0
                   ? std::to_string(*rc::gen::inRange(1, 5))
                   : (*rc::gen::arbitrary<bool>() ? std::string("null") : layout());
      });
    case 'S': return list(9, [] { return std::to_string(*rc::gen::inRange(0, 9)); });
    default: return std::to_string(*rc::gen::inRange(-2, 5));  // I: dim, index, start, end
  }
}

// signature is an op's arguments as (field, kind) pairs (see argument()).
std::vector<std::pair<std::string, char>> signature(const std::string& op) {
  static const std::map<std::string, std::vector<std::pair<std::string, char>>> table = {
      {"compact_stride", {{"shape", 'T'}}},
      {"shape_div", {{"a", 'T'}, {"b", 'T'}}},
      {"crd2idx", {{"layout", 'L'}, {"coords", 'C'}}},
      {"idx2crd", {{"shape", 'T'}, {"indices", 'C'}, {"stride", 'T'}}},
      {"coalesce_profile", {{"layout", 'L'}, {"profile", 'T'}}},
      {"filter_profile", {{"layout", 'L'}, {"profile", 'T'}}},
      {"complement_bound", {{"layout", 'L'}, {"bound", 'N'}}},
      {"composition", {{"a", 'L'}, {"b", 'L'}}},
      {"logical_divide", {{"a", 'L'}, {"b", 'L'}}},
      {"logical_product", {{"a", 'L'}, {"b", 'L'}}},
      {"composition_tiler", {{"a", 'L'}, {"tiler", 'R'}}},
      {"logical_divide_tiler", {{"a", 'L'}, {"tiler", 'R'}}},
      {"logical_product_tiler", {{"a", 'L'}, {"tiler", 'R'}}},
      {"mesh_construct", {{"shape", 'T'}, {"stride", 'T'}}},
      {"mesh_getitem", {{"layout", 'L'}, {"index", 'I'}}},
      {"mesh_splice", {{"layout", 'L'}, {"start", 'I'}, {"end", 'I'}, {"insert", 'L'}}},
      {"mesh_unflatten", {{"layout", 'L'}, {"dim", 'I'}, {"sizes", 'S'}}},
      {"mesh_global_ranks", {{"layout", 'L'}, {"world_size", 'N'}}},
      {"mesh_remap_to_tensor", {{"layout", 'L'}, {"rank_map", 'S'}}},
      {"mesh_disjoint", {{"layouts", 'A'}}},
  };
  const auto it = table.find(op);
  if (it != table.end()) return it->second;
  return {{"layout", 'L'}};
}

std::string request() {
  // Any field may also appear with any value.
  static const std::vector<std::string> fields = {
      "layout", "a", "b", "shape", "stride", "profile", "bound", "coords", "indices", "tiler",
      "index", "start", "end", "insert", "sizes", "dim", "world_size", "rank_map", "layouts"};
  std::vector<std::string> ops = meshsim::query::ops();
  ops.push_back("nope");
  std::vector<std::pair<std::string, std::string>> members;
  if (*rc::gen::weightedElement<bool>({{12, true}, {1, false}})) {
    members.emplace_back("op", "\"" + *rc::gen::elementOf(ops) + "\"");
  }
  if (*rc::gen::weightedElement<bool>({{4, true}, {1, false}})) {
    members.emplace_back("id", *rc::gen::weightedElement<std::string>(
                                   {{8, std::to_string(*rc::gen::inRange(-5, 1000))},
                                    {2, R"J("req-7")J"}, {1, "null"}, {1, number()}, {1, "true"},
                                    {1, R"J("a\"b")J"}, {1, R"J("\u00e9")J"}, {1, "[1]"}, {1, "{}"},
                                    {1, R"J("")J"}, {1, "\"\xc3\xa9\""}}));
  }
  if (*rc::gen::weightedElement<bool>({{1, true}, {3, false}})) {
    members.emplace_back("convention", *rc::gen::weightedElement<std::string>(
                                           {{4, R"J("cute")J"}, {3, R"J("torch")J"}, {1, "null"},
                                            {1, R"J("Cute")J"}, {1, "1"}}));
  }
  const std::string op = members.empty() || members[0].first != "op"
                           ? std::string("size")
                           : members[0].second.substr(1, members[0].second.size() - 2);
  for (const auto& [field, kind] : signature(op)) {
    if (*rc::gen::weightedElement<bool>({{12, true}, {1, false}})) {
      members.emplace_back(field, argument(kind));
    }
  }
  if (*rc::gen::weightedElement<bool>({{1, true}, {6, false}})) {
    members.emplace_back(*rc::gen::elementOf(fields), value(1));
  }
  if (*rc::gen::weightedElement<bool>({{1, true}, {10, false}})) members.emplace_back("extra", value(0));
  if (*rc::gen::weightedElement<bool>({{1, true}, {15, false}}) && !members.empty()) {
    members.push_back(*rc::gen::elementOf(members));  // a repeated key
  }
  std::string s = ws() + "{" + ws();
  for (std::size_t i = 0; i < members.size(); ++i) {
    s += (i ? "," + ws() : "") + "\"" + members[i].first + "\"" + ws() + ":" + ws() +
         members[i].second + ws();
  }
  s += "}" + ws();
  return *rc::gen::weightedElement<std::string>(
      {{30, s}, {1, "\xef\xbb\xbf" + s}, {1, s + " x"}, {1, s.substr(0, s.size() / 2)},
       {1, "[" + s + "]"}});
}

}  // namespace fast

RC_GTEST_PROP(QueryFastReader, AnswersAsNlohmannAloneWould, ()) {
  const std::string line = fast::request();
  const std::string expected = meshsim::query::answer_line_nlohmann(line);
  const auto quick = meshsim::query::detail::fast_answer(line);
  // (Not parsed: an id like 1E400 is echoed as sent, which nlohmann cannot read back.)
  RC_TAG(quick ? "fast" : "nlohmann",
         expected.find(",\"ok\":true,") != std::string::npos ? "ok" : "error");
  if (quick && *quick != expected) RC_FAIL(line + "\n fast:     " + *quick + "\n nlohmann: " + expected);
  RC_ASSERT(meshsim::query::answer_line(line) == expected);
}
