// Hostile mesh.program / mesh.equal requests: random JSON built from the ops' own vocabulary
// (so it reaches deep into the program runner) mixed with junk values. Every line must get a
// well-formed answer; a refusal must be a typed meshsim error, never Internal (an escaped
// exception) and never a crash or hang.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <nlohmann/json.hpp>
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
  struct Budget {
    int64_t saved = meshsim::query::max_answer_elements();
    explicit Budget(int64_t b) { meshsim::query::set_max_answer_elements(b); }
    ~Budget() { meshsim::query::set_max_answer_elements(saved); }
  } scoped(*rc::gen::inRange<int64_t>(1, 1 << 14));
  const int64_t budget = meshsim::query::max_answer_elements();
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
  const Json a = ask(req);
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
