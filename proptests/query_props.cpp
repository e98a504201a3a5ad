// Hostile mesh.program / mesh.equal requests: random JSON built from the ops' own vocabulary
// (so it reaches deep into the program runner) mixed with junk values. Every line must get a
// well-formed answer; a refusal must be a typed meshsim error, never Internal (an escaped
// exception) and never a crash or hang.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

}  // namespace
