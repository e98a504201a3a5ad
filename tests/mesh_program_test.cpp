// The `mesh.program` and `mesh.equal` query ops: fields, handles, rank view, typed errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "meshsim/query.hpp"

namespace {

using Json = nlohmann::json;

Json ask(const Json& req) { return Json::parse(meshsim::query::answer_line(req.dump())); }

Json program(Json ops, Json want = nullptr, int64_t world = 8) {
  Json p = {{"op", "mesh.program"},
            {"world_size", world},
            {"build", {{"init_device_mesh",
                        {{"mesh_shape", {2, 2, 2}}, {"mesh_dim_names", {"dp", "cp", "tp"}}}}}},
            {"ops", std::move(ops)}};
  if (!want.is_null()) p["want"] = std::move(want);
  return p;
}

std::string error_type(const Json& answer) {
  EXPECT_FALSE(answer.at("ok").get<bool>()) << answer.dump();
  return answer.contains("error") ? answer["error"]["type"].get<std::string>() : "";
}

TEST(MeshProgram, DefaultFieldsOmitRankScopedOnes) {
  Json a = ask(program(Json::array()));
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  for (const char* f : {"mesh_dim_names", "layout", "shape", "ndim", "size", "rank_map",
                        "mesh_by_rank", "coordinate_by_rank", "groups_by_dim",
                        "local_rank_by_rank"}) {
    EXPECT_TRUE(a["result"].contains(f)) << f;
  }
  EXPECT_FALSE(a["result"].contains("my_groups"));
}

TEST(MeshProgram, RankScopedFieldsDescribeTheGivenRank) {
  Json req = program(Json::array({{{"slice", {"dp", "tp"}}}}),
                     {"coordinate", "local_rank", "my_groups"});
  req["rank"] = 6;
  Json a = ask(req);
  EXPECT_EQ(a["result"], Json::parse(R"({"coordinate": [1, 0], "local_rank": [1, 0],
                                         "my_groups": {"dp": [2, 6], "tp": [6, 7]}})"));
}

TEST(MeshProgram, HandlesLetOnAndResult) {
  Json ops = Json::parse(R"([{"let": "s", "slice": ["dp", "cp"]},
                             {"on": "s", "flatten": null, "let": "f"},
                             {"on": "root", "slice": "tp", "let": "t"},
                             {"concatenate": ["f", "t"], "let": "c"},
                             {"on": "c", "unflatten": {"dim": "dp_cp", "sizes": [2, 2],
                                                       "names": ["a", "b"]}}])");
  Json req = program(ops, {"mesh_dim_names", "layout"});
  Json a = ask(req);
  EXPECT_EQ(a["result"]["mesh_dim_names"], Json::parse(R"(["a", "b", "tp"])"));
  EXPECT_EQ(a["result"]["layout"], Json::parse(R"({"shape": [2, 2, 2], "stride": [4, 2, 1]})"));
  req["result"] = "c";
  EXPECT_EQ(ask(req)["result"]["mesh_dim_names"], Json::parse(R"(["dp_cp", "tp"])"));
  req["result"] = "nope";
  EXPECT_EQ(error_type(ask(req)), "NotFound");
}

TEST(MeshProgram, ExplicitRankOutsideASlicedMeshFailsAsInPyTorch) {
  Json req = Json::parse(R"({"op": "mesh.program", "world_size": 16, "rank": 3,
      "build": {"DeviceMesh": {"mesh": [[8, 9], [10, 11]], "mesh_dim_names": ["a", "b"]}},
      "ops": [{"slice": "b"}]})");
  Json a = ask(req);
  EXPECT_EQ(error_type(a), "FailedPrecondition");
  EXPECT_NE(a["error"]["message"].get<std::string>().find("needs to contain the local rank"),
            std::string::npos);
  req["rank"] = 9;
  EXPECT_TRUE(ask(req)["ok"].get<bool>());
  req.erase("rank");  // no rank: every rank's view, the outsiders left out
  EXPECT_EQ(ask(req)["result"]["mesh_by_rank"].size(), 4u);
}

TEST(MeshProgram, RuleBreakingProgramsGetTypedErrors) {
  auto with_build = [](const char* build, int64_t world = 8) {
    return Json{{"op", "mesh.program"}, {"world_size", world}, {"build", Json::parse(build)}};
  };
  EXPECT_EQ(error_type(ask(with_build(R"({"init_device_mesh": {"mesh_shape": [4, 4]}})"))),
            "InvalidArgument");  // larger than the world
  EXPECT_EQ(error_type(ask(with_build(R"({"DeviceMesh": {"mesh": [0, 1, 1]}})"))),
            "InvalidArgument");  // duplicate rank
  EXPECT_EQ(error_type(ask(with_build(R"({"DeviceMesh": {"mesh": [0, 9]}})"))), "OutOfRange");
  EXPECT_EQ(error_type(ask(with_build(R"({"DeviceMesh": {"mesh": [[0, 1], [2]]}})"))),
            "InvalidArgument");  // ragged
  EXPECT_EQ(error_type(ask(with_build(R"({"DeviceMesh": {"mesh": [[0, 1], 2]}})"))),
            "InvalidArgument");
  EXPECT_EQ(error_type(ask(with_build(R"({"DeviceMesh": {"mesh": []}})"))), "InvalidArgument");
  EXPECT_EQ(error_type(ask(with_build(R"({"DeviceMesh": {"mesh": [1.5]}})"))), "InvalidArgument");
  EXPECT_EQ(error_type(ask(with_build(R"({"init_device_mesh": {"mesh_shape": [2],
      "mesh_dim_names": [7]}})"))), "InvalidArgument");
  EXPECT_EQ(error_type(ask(with_build(R"({"nope": {}})"))), "InvalidArgument");
  EXPECT_EQ(error_type(ask(with_build(R"({"init_device_mesh": {"mesh_shape": [2]}})", 0))),
            "InvalidArgument");
  EXPECT_EQ(error_type(ask(with_build(
                R"({"init_device_mesh": {"mesh_shape": [4611686018427387904, 4]}})",
                INT64_MAX))),
            "OverflowError");
  EXPECT_EQ(error_type(ask(program(Json::parse(R"([{"slice": "pp"}])")))), "NotFound");
  EXPECT_EQ(error_type(ask(program(Json::parse(R"([{"slice": ["cp", "dp"]}])")))),
            "InvalidArgument");
  EXPECT_EQ(error_type(ask(program(Json::parse(R"([{"slice": "tp", "flatten": null}])")))),
            "InvalidArgument");  // two ops in one step
  EXPECT_EQ(error_type(ask(program(Json::parse(R"([{"reshape": [8]}])")))), "InvalidArgument");
  EXPECT_EQ(error_type(ask(program(Json::parse(R"([{"slice": "tp", "let": "root"}])")))),
            "InvalidArgument");
  EXPECT_EQ(error_type(ask(program(Json::parse(
                R"([{"unflatten": {"dim": 0, "sizes": [3], "names": ["x"]}}])")))),
            "InvalidArgument");
  EXPECT_EQ(error_type(ask(program(Json::array(), {"bogus"}))), "InvalidArgument");
  EXPECT_EQ(error_type(ask(program(Json::array(), nullptr, int64_t{1} << 40))),
            "ResourceExhausted");  // per-rank maps over 2^40 ranks
  EXPECT_TRUE(ask(program(Json::array(), {"groups_by_dim"}, int64_t{1} << 40))["ok"].get<bool>());
}

TEST(MeshEqual, SameRootDifferentRootsAndEquivalence) {
  Json a = Json::parse(R"({"world_size": 8, "build": {"init_device_mesh": {"mesh_shape": [2, 4],
      "mesh_dim_names": ["dp", "tp"]}}, "ops": [{"slice": "tp"}]})");
  Json b = a;
  b["ops"] = Json::parse(R"([{"slice": ["dp", "tp"]}, {"on": "_last", "slice": "tp"}])");
  Json req = {{"op", "mesh.equal"}, {"a", a}, {"b", b}, {"same_root", true}};
  EXPECT_EQ(ask(req)["result"],
            Json::parse(R"({"equal": true, "hash_equal": true, "equivalent": true})"));
  req["same_root"] = false;
  EXPECT_EQ(ask(req)["result"]["equal"], false);
  EXPECT_EQ(ask(req)["result"]["equivalent"], true);
  req["b"]["ops"] = Json::parse(R"([{"slice": "dp"}])");
  EXPECT_EQ(ask(req)["result"]["equivalent"], false);
  req["same_root"] = "yes";
  EXPECT_EQ(error_type(ask(req)), "InvalidArgument");
}

TEST(MeshProgram, BackendOverrideByIndexOrNameWithPyTorchErrors) {
  auto build = [](const char* override_json) {
    Json req = Json::parse(R"({"op": "mesh.program", "world_size": 8, "want": ["backend_by_dim"],
        "build": {"init_device_mesh": {"mesh_shape": [2, 4], "mesh_dim_names": ["dp", "tp"]}}})");
    req["build"]["init_device_mesh"]["backend_override"] = Json::parse(override_json);
    return ask(req);
  };
  EXPECT_EQ(build(R"({"0": "gloo", "tp": {"backend": "nccl", "timeout_ms": 500}})")["result"],
            Json::parse(R"J({"backend_by_dim": {"dp": "gloo", "tp": "nccl(timeout=500ms)"}})J"));
  Json a = build(R"({"0": "gloo", "dp": "nccl"})");
  EXPECT_EQ(error_type(a), "InvalidArgument");
  EXPECT_NE(a["error"]["message"].get<std::string>().find(
                "Found redundant dim index 0 and name dp in backend_override"),
            std::string::npos);
  Json b = build(R"({"pp": "gloo", "5": "nccl"})");
  EXPECT_NE(b["error"]["message"].get<std::string>().find(
                "Found invalid keys in backend_override: got [5, 'pp'], expected integers in "
                "range [0, 2) or one of ('dp', 'tp')"),
            std::string::npos)
      << b.dump();
  EXPECT_EQ(error_type(build(R"({"0": 3})")), "InvalidArgument");
  EXPECT_EQ(error_type(build(R"({"0": {"timeout_ms": -1}})")), "InvalidArgument");
}

}  // namespace
