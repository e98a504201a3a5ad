// Runs every reference vector (CUTLASS pycute for cute, PyTorch _pycute/_MeshLayout for torch)
// through the query engine and scores it as tests/data/README.md says: exact structural match
// for results, an error for reference exceptions, and for "undefined" cases (the reference broke
// its own postcondition) either an error or exactly the reference's value.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "meshsim/query.hpp"

namespace {

using Json = nlohmann::json;

Json load_cases() {
  std::ifstream in(MESHSIM_TEST_DATA "/layout_vectors_public.json");
  if (!in) throw std::runtime_error("cannot open the reference vectors");
  return Json::parse(in).at("cases");
}

TEST(ReferenceVectors, EveryCaseAgrees) {
  Json cases = load_cases();
  ASSERT_GT(cases.size(), 1000u);
  int failures = 0;
  for (const Json& c : cases) {
    Json req = c.at("input");
    std::string op = c.at("op");
    req["op"] = op == "mesh_check_overlap" ? "mesh_disjoint" : op;
    req["convention"] = c.at("conv");
    req["id"] = c.at("id");
    Json answer = Json::parse(meshsim::query::answer_line(req.dump()));
    ASSERT_EQ(answer.at("id"), c.at("id"));
    bool ok;
    if (!c.at("error").get<bool>()) {
      ok = answer.at("ok").get<bool>() && answer.at("result") == c.at("output");
    } else if (c.at("error_kind") == "exception") {
      ok = !answer.at("ok").get<bool>();
    } else {
      ok = !answer.at("ok").get<bool>() || answer.at("result") == c.at("reference_output");
    }
    if (!ok && ++failures <= 20) {
      ADD_FAILURE() << c.at("id") << " input " << c.at("input").dump() << "\n  expected "
                    << (c.contains("output") ? c["output"].dump() : c.value("error_kind", ""))
                    << "\n  got " << answer.dump();
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(ReferenceVectors, CoverEveryQueryOpOfTheAlgebra) {
  Json cases = load_cases();
  std::set<std::string> seen;
  for (const Json& c : cases) seen.insert(c.at("op"));
  for (const std::string& op : meshsim::query::ops()) {
    if (op == "mesh_disjoint") continue;     // vectors call it mesh_check_overlap
    if (op.rfind("mesh.", 0) == 0) continue;  // DeviceMesh ops: mesh_vectors_test.cpp
    if (op == "shape_div") continue;  // no vectors yet: pycute's own cases in int_tuple_test.cpp
    // Newer PyTorch only (the vectors come from 1.13 and pycute): PyTorch's own examples in
    // mesh_layout_test.cpp, a second writing of the rule against random layouts in
    // algebra_props.cpp.
    if (op == "mesh_check_orthogonal") continue;
    EXPECT_TRUE(seen.count(op)) << op << " has no reference vector";
  }
}

}  // namespace
