// The `mesh.program` and `mesh.equal` query ops: fields, handles, rank view, typed errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "meshsim/error.hpp"
#include "meshsim/query.hpp"
#include "meshsim/recipe.hpp"

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

TEST(MeshProgram, FindFlattenedBindsTheFlattenedMeshByItsDims) {
  // dp_cp and cp_tp hold 4 ranks each; over strides (4, 2, 1) dp_cp is {0,2,4,6},{1,3,5,7}.
  const Json flattens = Json::array({{{"slice", {"dp", "cp"}}, {"let", "a"}}, {{"on", "a"}, {"flatten", "dp_cp"}},
                                     {{"slice", {"cp", "tp"}}, {"let", "b"}}, {{"on", "b"}, {"flatten", "cp_tp"}}});
  Json ops = flattens;
  ops.push_back({{"on", "root"}, {"find_flattened", {"dp", "cp"}}, {"let", "f"}});
  Json a = ask(program(ops, {"mesh_dim_names", "groups_by_dim", "warnings"}));
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  EXPECT_EQ(a["result"]["mesh_dim_names"], Json({"dp_cp"}));
  EXPECT_EQ(a["result"]["groups_by_dim"]["dp_cp"], Json::parse("[[0,2,4,6],[1,3,5,7]]"));
  EXPECT_EQ(a["result"]["warnings"], Json::array());  // the safe way warns of nothing
  // From a view, by the view's own dims.
  ops = flattens;
  ops.push_back({{"on", "b"}, {"find_flattened", {"cp", "tp"}}});
  a = ask(program(ops, {"groups_by_dim"}));
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  EXPECT_EQ(a["result"]["groups_by_dim"]["cp_tp"], Json::parse("[[0,1,2,3],[4,5,6,7]]"));
  // Never flattened: NotFound naming the dims; dims out of order: slice's error.
  EXPECT_EQ(error_type(ask(program(Json::array({{{"find_flattened", {"dp", "tp"}}}})))), "NotFound");
  EXPECT_EQ(error_type(ask(program(Json::array({{{"find_flattened", {"tp", "dp"}}}})))), "NotFound");  // PyTorch's KeyError
  EXPECT_EQ(error_type(ask(program(Json::array({{{"find_flattened", 3}}})))), "InvalidArgument");
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
            "NotFound");  // out of order: PyTorch's KeyError
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

// PyTorch's get_group through the query: every dim by name, a root's flattened names, and the
// group cache counting each request (a slice reuses its parent's groups).
TEST(MeshProgramGroups, GetGroupAnswersEveryDimAndTheRootsFlattenedNames) {
  Json req = program(Json::array({{{"slice", {"dp", "cp"}}}, {{"on", "_last"}, {"flatten", nullptr}}}),
                     {"get_group", "get_all_groups", "cache_stats"});
  req["rank"] = 5;
  req["result"] = "root";
  Json a = ask(req);
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  const Json& g = a["result"]["get_group"];
  EXPECT_EQ(g["dp"]["ranks"], Json({1, 5}));
  EXPECT_EQ(g["cp"]["ranks"], Json({5, 7}));
  EXPECT_EQ(g["tp"]["ranks"], Json({4, 5}));
  EXPECT_EQ(g["dp_cp"]["ranks"], Json({1, 3, 5, 7}));
  EXPECT_EQ(g["dp_cp"]["group_desc"], "mesh_dp_cp");
  EXPECT_EQ(g["tp"]["group_desc"], "mesh_tp");
  ASSERT_EQ(a["result"]["get_all_groups"].size(), 3u);  // the dims only, in order
  EXPECT_EQ(a["result"]["get_all_groups"][2], g["tp"]);
  // get_group built 4 records; get_all_groups found 3 of them again.
  EXPECT_EQ(a["result"]["cache_stats"], Json({{"hits", 3}, {"misses", 4}, {"size", 4}}));

  Json views = program(Json::array({{{"slice", {"dp", "tp"}}, {"let", "s"}}}), {"get_group_by_view", "cache_stats"});
  Json v = ask(views);
  ASSERT_TRUE(v["ok"].get<bool>()) << v.dump();
  EXPECT_EQ(v["result"]["get_group_by_view"]["s"]["tp"]["name"], v["result"]["get_group_by_view"]["root"]["tp"]["name"]);
  EXPECT_EQ(v["result"]["cache_stats"], Json({{"hits", 2}, {"misses", 3}, {"size", 3}}));
}

TEST(MeshProgramGroups, PyTorchsErrorsAndTheWorldsDefaultBackend) {
  Json no_dim = program(Json::array(), {"get_group"});
  no_dim["build"]["init_device_mesh"]["_init_backend"] = false;
  Json a = ask(no_dim);
  EXPECT_EQ(error_type(a), "FailedPrecondition");
  EXPECT_EQ(a["error"]["message"], "DeviceMesh process groups not initialized!");
  Json gloo = program(Json::array(), {"get_group"});
  gloo["build"]["init_device_mesh"]["default_backend"] = "gloo";
  gloo["build"]["init_device_mesh"]["backend_override"] = {{"tp", {{"timeout_ms", 1500}}}, {"cp", "nccl"}};
  Json b = ask(gloo);
  ASSERT_TRUE(b["ok"].get<bool>()) << b.dump();
  EXPECT_EQ(b["result"]["get_group"]["dp"]["backend"], "gloo");
  EXPECT_EQ(b["result"]["get_group"]["cp"]["backend"], "nccl");
  EXPECT_EQ(b["result"]["get_group"]["tp"]["backend"], "gloo");  // options alone keep the default
  EXPECT_EQ(b["result"]["get_group"]["tp"]["timeout_ms"], 1500);
  // An options object alone keeps the default backend; its keys, unknown ones too, come back.
  Json opts = program(Json::array(), {"get_group", "backend_by_dim"});
  opts["build"]["init_device_mesh"]["default_backend"] = "gloo";
  opts["build"]["init_device_mesh"]["backend_override"] = {
      {"dp", {{"options", {{"timeout_ms", 2500}, {"fake_option", 42}, {"name", "x"}, {"f", 0.25}, {"b", true}}}}}};
  Json c = ask(opts);
  ASSERT_TRUE(c["ok"].get<bool>()) << c.dump();
  const Json& dp = c["result"]["get_group"]["dp"];
  EXPECT_EQ(dp["backend"], "gloo");
  EXPECT_EQ(dp["timeout_ms"], 2500);
  EXPECT_EQ(dp["options"], Json::parse(R"({"fake_option": 42, "name": "x", "f": 0.25, "b": true})"));
  EXPECT_EQ(c["result"]["get_group"]["tp"]["options"], Json::object());
  Json nested = opts;
  nested["build"]["init_device_mesh"]["backend_override"]["dp"]["options"]["deep"] = Json::array({1});
  EXPECT_EQ(error_type(ask(nested)), "InvalidArgument");
  Json bad = program(Json::array(), {"get_group"});
  bad["build"]["init_device_mesh"]["_init_backend"] = "yes";
  EXPECT_EQ(error_type(ask(bad)), "InvalidArgument");
}

// from_logical as PyTorch builds it: on 'meta', without process groups.
TEST(MeshProgramGroups, FromLogicalIsMetaWithoutGroups) {
  const Json logical = {{"world_size", 4}, {"build", {{"from_logical", {{"mesh_shape", {4}}}}}}};
  Json meta = logical;
  meta["build"]["from_logical"]["device_type"] = "meta";
  Json eq = ask({{"op", "mesh.equal"}, {"a", logical}, {"b", meta}});
  EXPECT_EQ(eq["result"]["equivalent"], true) << eq.dump();
  Json req = logical;
  req["op"] = "mesh.program";
  req["want"] = {"device_type", "coordinate"};
  Json a = ask(req);
  EXPECT_EQ(a["result"]["device_type"], "meta") << a.dump();
  EXPECT_EQ(a["result"]["coordinate"], Json({0}));
  req["want"] = {"get_group"};
  Json g = ask(req);
  EXPECT_EQ(error_type(g), "FailedPrecondition");
  EXPECT_EQ(g["error"]["message"], "DeviceMesh process groups not initialized!");
  req["build"]["from_logical"]["_init_backend"] = true;
  EXPECT_EQ(error_type(ask(req)), "InvalidArgument");
}

TEST(MeshProgramGroups, TransposeAndReshapeOps) {
  Json t = program(Json::array({{{"transpose", {"tp", "dp", "cp"}}}, {{"on", "_last"}, {"flatten", nullptr}}}),
                   {"groups_by_dim"});
  Json a = ask(t);
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  EXPECT_EQ(a["result"]["groups_by_dim"]["tp_dp_cp"], Json({{0, 2, 4, 6, 1, 3, 5, 7}}));  // cp fastest, then dp, then tp
  Json byidx = program(Json::array({{{"transpose", {2, 0, 1}}}}), {"mesh_dim_names"});
  EXPECT_EQ(ask(byidx)["result"]["mesh_dim_names"], Json({"tp", "dp", "cp"}));
  Json r = program(Json::array({{{"reshape", {{"sizes", {4, 2}}, {"names", {"a", "b"}}}}}}), {"groups_by_dim", "shape"});
  Json b = ask(r);
  ASSERT_TRUE(b["ok"].get<bool>()) << b.dump();
  EXPECT_EQ(b["result"]["groups_by_dim"]["b"], Json({{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(error_type(ask(program(Json::array({{{"transpose", {0, 0, 1}}}})))), "InvalidArgument");
  EXPECT_EQ(error_type(ask(program(Json::array({{{"transpose", {"tp", "ep", "dp"}}}})))), "NotFound");
  EXPECT_EQ(error_type(ask(program(Json::array({{{"transpose", {7, 0, 1}}}})))), "InvalidArgument");
  EXPECT_EQ(error_type(ask(program(Json::array({{{"reshape", {{"sizes", {3, 3}}, {"names", {"a", "b"}}}}}})))),
            "InvalidArgument");
}

// test_from_group_with_invalid_mesh and test_from_group_with_mesh_shape_2d, through the query.
TEST(MeshProgramGroups, FromGroupAsPyTorchSpellsIt) {
  auto build = [](Json body, Json want = {"groups_by_dim"}) {
    return ask({{"op", "mesh.program"}, {"world_size", 4}, {"build", {{"from_group", std::move(body)}}}, {"want", want}});
  };
  const std::vector<std::pair<Json, std::string>> refused{
      {{{"group", {0, 1, 2, 3}}, {"mesh", {{0, 1}, {2, 3}}}}, "Invalid mesh [[0, 1], [2, 3]] for ProcessGroup with ranks [0, 1, 2, 3]"},
      {{{"groups", Json::array()}}, "Expects at least one ProcessGroup to be passed"},
      {{{"groups", {{0, 2}, {0, 1}}}}, "Must pass mesh if passing multiple ProcessGroups"},
      {{{"groups", {{0, 2}, {0, 1}}}, {"mesh", {{0, 1}, {2, 3}}}}, "Must pass mesh_dim_names if passing multiple ProcessGroups"},
      {{{"groups", {{0, 2}, {0, 1}}}, {"mesh", {0, 1, 2, 3}}, {"mesh_dim_names", {"dp", "tp"}}},
       "Expects mesh with ndim equal to number of ProcessGroups but got mesh [0, 1, 2, 3] and 2 ProcessGroups"},
  };
  for (const auto& [body, message] : refused) {
    Json a = build(body);
    EXPECT_EQ(error_type(a), "InvalidArgument") << body;
    EXPECT_EQ(a["error"]["message"], message) << body;
  }
  Json one = build({{"group", {3, 1, 2, 0}}, {"mesh", {3, 1, 2, 0}}}, {"groups_by_dim", "get_group"});
  ASSERT_TRUE(one["ok"].get<bool>()) << one.dump();
  EXPECT_EQ(one["result"]["groups_by_dim"]["0"], Json({{3, 1, 2, 0}}));
  Json two = build({{"groups", {{0, 2}, {0, 1}}}, {"mesh", {{0, 1}, {2, 3}}}, {"mesh_dim_names", {"dp", "tp"}}});
  ASSERT_TRUE(two["ok"].get<bool>()) << two.dump();
  EXPECT_EQ(two["result"]["groups_by_dim"], Json::parse(R"({"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]})"));
  // meshsim checks what PyTorch skips: each group is the rank's group along its dim.
  Json wrong = build({{"groups", {{0, 3}, {0, 1}}}, {"mesh", {{0, 1}, {2, 3}}}, {"mesh_dim_names", {"dp", "tp"}}});
  EXPECT_EQ(error_type(wrong), "InvalidArgument");
  EXPECT_EQ(error_type(build({{"group", {0}}, {"groups", {{0}}}})), "InvalidArgument");
}

}  // namespace

namespace {

// A recipe built in code equals the same recipe decoded from a mesh.program request: the same
// views, each the same mesh.
TEST(RecipeBuilder, BuildsWhatTheDecoderReads) {
  const meshsim::MeshRecipe built = meshsim::RecipeBuilder::over_world(16)
                                        .unflatten("root", "world", {2, 2, 4}, {"dp", "cp", "tp"})
                                        .let("dense")
                                        .slice("dense", {"dp", "cp"})
                                        .flatten("_last", "dp_cp")
                                        .let("dp_cp")
                                        .result("dense")
                                        .take();
  const meshsim::MeshRecipe read = meshsim::recipe_from_json(Json::parse(R"({
    "world_size": 16, "build": {"init_device_mesh": {"mesh_shape": [16], "mesh_dim_names": ["world"]}},
    "ops": [{"on": "root", "unflatten": {"dim": "world", "sizes": [2, 2, 4], "names": ["dp", "cp", "tp"]}, "let": "dense"},
            {"on": "dense", "slice": ["dp", "cp"]},
            {"on": "_last", "flatten": "dp_cp", "let": "dp_cp"}],
    "result": "dense"})"));
  const meshsim::BuiltMeshes a = meshsim::apply(built), b = meshsim::apply(read);
  ASSERT_EQ(a.meshes.size(), 3u);
  ASSERT_EQ(a.meshes.size(), b.meshes.size());
  for (std::size_t i = 0; i < a.meshes.size(); ++i) EXPECT_TRUE(equivalent(a.meshes[i], b.meshes[i])) << a.meshes[i].to_string();
  EXPECT_EQ(*a.result.names(), (std::vector<std::string>{"dp", "cp", "tp"}));
  EXPECT_TRUE(a.result == a.meshes[0]);
  EXPECT_EQ(a.meshes[2].group_of(5, 0), (std::vector<int64_t>{1, 5, 9, 13}));
  EXPECT_THROW(meshsim::RecipeBuilder::over_world(4).let("x"), meshsim::InvalidArgument);
}

}  // namespace

// ---- the creation plan: PyTorch's DeviceMesh._init_one_process_group, call by call ----
// Expected calls are written from torch/distributed/device_mesh.py (cyyever/pytorch 2ef3b7f,
// _init_one_process_group and _init_process_groups): a dim's groups are the rows of
// _MeshLayout([dim]).remap_to_tensor(rank_map), in that order, one new_group each on every rank.

namespace creation {

Json plan_of(Json build, Json ops = Json::array(), int64_t world = 8, std::optional<int64_t> rank = std::nullopt) {
  Json p = {{"op", "mesh.program"}, {"world_size", world}, {"build", std::move(build)}, {"ops", std::move(ops)},
            {"want", {"creation_plan"}}};
  if (rank) p["rank"] = *rank;
  return ask(p);
}

Json init(Json shape, Json names, Json extra = Json::object()) {
  Json body = {{"mesh_shape", std::move(shape)}, {"mesh_dim_names", std::move(names)}};
  body.update(extra);
  return {{"init_device_mesh", body}};
}

// calls_text is each call as "kind dim ranks" (split_group: its split_ranks).
std::vector<std::string> calls_text(const Json& answer) {
  std::vector<std::string> out;
  for (const Json& c : answer.at("result").at("creation_plan").at("calls")) {
    std::string t = c["call"].get<std::string>() + " " + c["dim"].get<std::string>();
    if (c.contains("ranks")) t += " " + c["ranks"].dump();
    if (c.contains("split_ranks")) t += " " + c["split_ranks"].dump();
    out.push_back(t);
  }
  return out;
}

using Calls = std::vector<std::string>;

}  // namespace creation

TEST(CreationPlan, EveryGroupOfEveryDimIsANewGroupOnEveryRank) {
  using namespace creation;
  Json a = plan_of(init({2, 4}, {"dp", "tp"}));
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  EXPECT_EQ(calls_text(a), (Calls{"new_group dp [0,4]", "new_group dp [1,5]", "new_group dp [2,6]", "new_group dp [3,7]",
                                  "new_group tp [0,1,2,3]", "new_group tp [4,5,6,7]"}));
  const Json& plan = a["result"]["creation_plan"];
  EXPECT_EQ(plan["options"]["default_backend"], "gloo");  // a cpu mesh's default group
  EXPECT_EQ(plan["calls"][0]["group_desc"], "mesh_dp");
  EXPECT_EQ(plan["calls"][0]["use_local_synchronization"], false);
  EXPECT_EQ(plan["steps"][0]["op"], "init_device_mesh");
  EXPECT_EQ(plan["steps"][0]["created"], 6);
  // Rank 5 makes the same calls: new_group is collective over the world.
  EXPECT_EQ(calls_text(plan_of(init({2, 4}, {"dp", "tp"}), Json::array(), 8, 5)), calls_text(a));
}

TEST(CreationPlan, ABoundDefaultGroupSplitsOncePerDim) {
  using namespace creation;
  Json a = plan_of(init({2, 4}, {"dp", "tp"}, {{"device_type", "cuda"}, {"bound_device", true}}));
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  EXPECT_EQ(calls_text(a), (Calls{"split_group dp [[0,4],[1,5],[2,6],[3,7]]", "split_group tp [[0,1,2,3],[4,5,6,7]]"}));
  EXPECT_EQ(a["result"]["creation_plan"]["calls"][0]["parent"], "default");
  EXPECT_EQ(a["result"]["creation_plan"]["calls"][0]["backend"], "nccl");
  // Without an accelerator the bound device does not matter: new_group per group.
  EXPECT_EQ(calls_text(plan_of(init({2, 4}, {"dp", "tp"}, {{"bound_device", true}}))).size(), 6u);
  // A dim overridden to another backend than the default's is made with new_group.
  Json mixed = plan_of(init({2, 4}, {"dp", "tp"}, {{"device_type", "cuda"}, {"bound_device", true},
                                                   {"backend_override", {{"dp", "gloo"}}}}));
  EXPECT_EQ(calls_text(mixed), (Calls{"new_group dp [0,4]", "new_group dp [1,5]", "new_group dp [2,6]", "new_group dp [3,7]",
                                      "split_group tp [[0,1,2,3],[4,5,6,7]]"}));
  // torchcomms takes the split path without a bound device.
  EXPECT_EQ(calls_text(plan_of(init({2, 4}, {"dp", "tp"}, {{"device_type", "cuda"}, {"use_torchcomms", true}}))).size(), 2u);
}

TEST(CreationPlan, ABackendThatCannotSplitIsRefusedNamingTheDim) {
  using namespace creation;
  Json a = plan_of(init({2, 4}, {"dp", "tp"}, {{"device_type", "xpu"}, {"default_backend", "xccl"}, {"bound_device", true}}));
  EXPECT_EQ(error_type(a), "FailedPrecondition");
  const std::string m = a["error"]["message"].get<std::string>();
  EXPECT_NE(m.find("dim 'dp'"), std::string::npos) << m;
  EXPECT_NE(m.find("'xccl' cannot split"), std::string::npos) << m;
  EXPECT_NE(m.find("does not support splitting"), std::string::npos) << m;
  // new_group_use_split_group splits the default group on every new_group.
  Json b = plan_of(init({2, 4}, {"dp", "tp"}, {{"default_backend", "mpi"}, {"new_group_use_split_group", true}}));
  EXPECT_EQ(error_type(b), "FailedPrecondition");
  Json c = plan_of(init({2, 4}, {"dp", "tp"}, {{"new_group_use_split_group", true}}));
  ASSERT_TRUE(c["ok"].get<bool>()) << c.dump();
  EXPECT_EQ(c["result"]["creation_plan"]["calls"][0]["new_group_use_split_group"], true);
}

TEST(CreationPlan, AWorldSizedDimReusesTheDefaultGroup) {
  using namespace creation;
  EXPECT_EQ(calls_text(plan_of(init({8}, {"world"}))), (Calls{"default world"}));
  // On an accelerator machine whose default backend is gloo: new_group of every rank, "mesh_default".
  Json a = plan_of(init({8}, {"world"}, {{"device_type", "cuda"}, {"default_backend", "gloo"}}));
  EXPECT_EQ(calls_text(a), (Calls{"new_group world [0,1,2,3,4,5,6,7]"}));
  EXPECT_EQ(a["result"]["creation_plan"]["calls"][0]["group_desc"], "mesh_default");
  // With an override the dim is not the default group's.
  EXPECT_EQ(calls_text(plan_of(init({8}, {"world"}, {{"backend_override", {{"world", "gloo"}}}}))),
            (Calls{"new_group world [0,1,2,3,4,5,6,7]"}));
  // Flattening a whole mesh gives a world-sized dim: the default group again.
  Json f = plan_of(init({2, 4}, {"dp", "tp"}), Json::parse(R"([{"flatten": "all"}])"));
  EXPECT_EQ(calls_text(f).back(), "default all");
}

TEST(CreationPlan, FlattenUnflattenSliceAndFromGroupCreateAsPyTorchDoes) {
  using namespace creation;
  // flatten creates its dim; the same name again reuses it; slices create nothing.
  Json a = plan_of(init({2, 2, 2}, {"dp", "cp", "tp"}), Json::parse(R"([
      {"slice": ["dp", "cp"], "let": "dc"}, {"on": "dc", "flatten": "dp_cp", "let": "f1"},
      {"on": "dc", "flatten": "dp_cp", "let": "f2"}, {"on": "f1", "flatten": "dp_cp", "let": "f3"},
      {"on": "root", "slice": "tp", "let": "t"}])"));
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  const Json& steps = a["result"]["creation_plan"]["steps"];
  EXPECT_EQ(steps[1]["created"], 0);   // slice
  EXPECT_EQ(steps[1]["reused"], 8);    // dp and cp: 4 groups each
  EXPECT_EQ(steps[2]["created"], 2);   // [0, 2, 4, 6], [1, 3, 5, 7]
  EXPECT_EQ(steps[3]["created"], 0);   // flattened before with the same layout
  EXPECT_EQ(steps[4]["created"], 0);   // a 1-D mesh into its own name is itself
  EXPECT_EQ(calls_text(a).back(), "new_group dp_cp [1,3,5,7]");
  // unflatten creates its new dims even where the same groups exist.
  Json u = plan_of(init({8}, {"world"}), Json::parse(R"([{"unflatten": {"dim": "world", "sizes": [2, 4], "names": ["dp", "tp"]}},
                                                        {"on": "root", "unflatten": {"dim": "world", "sizes": [2, 4], "names": ["a", "b"]}}])"));
  const Json& us = u["result"]["creation_plan"]["steps"];
  EXPECT_EQ(us[1]["created"], 6);
  EXPECT_EQ(us[1]["created_again"], 0);
  EXPECT_EQ(us[2]["created"], 6);
  EXPECT_EQ(us[2]["created_again"], 6);
  // from_group keeps the handed groups; flattening its mesh creates.
  Json g = plan_of({{"from_group", {{"group", {0, 1, 2, 3}}, {"mesh_dim_names", {"x"}}}}},
                   Json::parse(R"([{"unflatten": {"dim": "x", "sizes": [2, 2], "names": ["a", "b"]}}])"), 4);
  ASSERT_TRUE(g["ok"].get<bool>()) << g.dump();
  EXPECT_EQ(g["result"]["creation_plan"]["steps"][0]["created"], 0);
  EXPECT_EQ(g["result"]["creation_plan"]["steps"][0]["reused"], 1);
  EXPECT_EQ(calls_text(g), (Calls{"new_group a [0,2]", "new_group a [1,3]", "new_group b [0,1]", "new_group b [2,3]"}));
  // A mesh built without groups (_init_backend false) unflattens without creating.
  EXPECT_TRUE(calls_text(plan_of(init({8}, {"world"}, {{"_init_backend", false}}),
                                 Json::parse(R"([{"unflatten": {"dim": "world", "sizes": [2, 4], "names": ["a", "b"]}}])")))
                  .empty());
}

TEST(CreationPlan, FakeDimsUnderTorchcommsSynchronizeLocally) {
  using namespace creation;
  Json build = init({2, 4}, {"dp", "tp"}, {{"device_type", "cuda"}, {"use_torchcomms", true},
                                           {"backend_override", {{"dp", "fake"}}}});
  Json a = plan_of(build, Json::array(), 8, 5);
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  // Members call their own group's new_group only: rank 5 is in [1, 5].
  EXPECT_EQ(calls_text(a), (Calls{"new_group dp [1,5]", "split_group tp [[0,1,2,3],[4,5,6,7]]"}));
  EXPECT_EQ(a["result"]["creation_plan"]["calls"][0]["use_local_synchronization"], true);
}

TEST(CreationPlan, HandedGroupsKeepTheirNamesAndBackends) {
  Json p = {{"op", "mesh.program"}, {"world_size", 4},
            {"build", {{"from_group", {{"groups", Json::parse(R"([{"ranks": [0, 2], "name": "dp_pg"},
                                                                  {"ranks": [0, 1], "name": "tp_pg", "backend": "gloo"}])")},
                                       {"mesh", {{0, 1}, {2, 3}}}, {"mesh_dim_names", {"dp", "tp"}}}}}},
            {"ops", Json::parse(R"([{"slice": "tp", "let": "t"}])")}, {"want", {"get_group_by_view"}}, {"rank", 0}};
  Json a = ask(p);
  ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
  const Json& v = a["result"]["get_group_by_view"];
  EXPECT_EQ(v["root"]["dp"]["name"], "dp_pg");
  EXPECT_EQ(v["root"]["tp"]["name"], "tp_pg");
  EXPECT_EQ(v["root"]["tp"]["backend"], "gloo");
  EXPECT_EQ(v["t"]["tp"]["name"], "tp_pg");
  // A group's own backend and backend_override for the same dim are two answers to one question.
  p["build"]["from_group"]["backend_override"] = {{"tp", "nccl"}};
  EXPECT_EQ(error_type(ask(p)), "InvalidArgument");
}
