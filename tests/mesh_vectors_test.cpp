// Runs PyTorch's DeviceMesh reference vectors (tests/data/pytorch_mesh_public.json) through
// `meshsim query`. mesh.program cases compare every expected field exactly, except where
// meshsim differs on purpose: local_rank_by_rank is the coordinate (PyTorch reports the rank
// inside a sorted process group), checked against coordinate_by_rank instead. layout.* cases
// (PyTorch's CuTeLayoutTest) map onto the mesh_* algebra ops.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "meshsim/query.hpp"

namespace {

using Json = nlohmann::json;

Json load_cases() {
  std::ifstream in(MESHSIM_TEST_DATA "/pytorch_mesh_public.json");
  if (!in) throw std::runtime_error("cannot open the DeviceMesh reference vectors");
  return Json::parse(in).at("cases");
}

Json ask(Json req) { return Json::parse(meshsim::query::answer_line(req.dump())); }

// layout converts PyTorch's {sizes, strides} into the query form {shape, stride}.
Json layout(const Json& l) { return Json{{"shape", l.at("sizes")}, {"stride", l.at("strides")}}; }

Json result_of(Json req) {
  Json a = ask(std::move(req));
  EXPECT_TRUE(a.at("ok").get<bool>()) << a.dump();
  return a.value("result", Json());
}

TEST(DeviceMeshVectors, EveryMeshProgramAgrees) {
  int programs = 0;
  int pytorch_local_rank_matches = 0;
  int local_rank_rows = 0;
  for (const Json& c : load_cases()) {
    if (c.at("op") != "mesh.program") continue;
    ++programs;
    SCOPED_TRACE(c.at("id").get<std::string>());
    Json req = c.at("input");
    req["op"] = "mesh.program";
    Json answer = ask(req);
    const Json& want = c.at("expected");
    if (want.contains("raises")) {
      ASSERT_FALSE(answer.at("ok").get<bool>()) << answer.dump();
      const std::string msg = answer.at("error").at("message");
      EXPECT_NE(msg.find(want.at("message_contains").get<std::string>()), std::string::npos)
          << "message: " << msg;
      continue;
    }
    ASSERT_TRUE(answer.at("ok").get<bool>()) << answer.dump();
    const Json& got = answer.at("result");
    for (const char* f : {"mesh_dim_names", "shape", "ndim", "size", "rank_map", "mesh_by_rank",
                          "coordinate_by_rank", "groups_by_dim"}) {
      EXPECT_EQ(got.at(f), want.at(f)) << f;
    }
    EXPECT_EQ(got.at("layout"), layout(want.at("layout")));
    EXPECT_EQ(got.at("local_rank_by_rank"), want.at("coordinate_by_rank"));
    for (const auto& [rank, lr] : want.at("local_rank_by_rank").items()) {
      ++local_rank_rows;
      pytorch_local_rank_matches += got.at("local_rank_by_rank").at(rank) == lr;
    }
  }
  EXPECT_EQ(programs, 18);
  // The difference is real but rare: only the reversed rank map (M10) and ranks 8..15 differ.
  EXPECT_LT(pytorch_local_rank_matches, local_rank_rows);
  EXPECT_GT(pytorch_local_rank_matches, local_rank_rows / 2);
}

TEST(DeviceMeshVectors, EveryLayoutCaseAgrees) {
  int n = 0;
  for (const Json& c : load_cases()) {
    const std::string op = c.at("op");
    if (op.rfind("layout.", 0) != 0) continue;
    ++n;
    SCOPED_TRACE(c.at("id").get<std::string>());
    const Json& in = c.at("input");
    const Json& want = c.at("expected");
    Json l = in.contains("layout") ? layout(in.at("layout")) : Json();
    if (op == "layout.coalesce") {
      EXPECT_EQ(result_of({{"op", "mesh_coalesce"}, {"layout", l}}), layout(want.at("layout")));
    } else if (op == "layout.complement") {
      EXPECT_EQ(result_of({{"op", "complement_bound"}, {"layout", l}, {"bound", in.at("world_size")}}),
                layout(want.at("layout")));
      EXPECT_EQ(result_of({{"op", "mesh_global_ranks"}, {"layout", l},
                           {"world_size", in.at("world_size")}}),
                want.at("global_ranks_of_input"));
    } else if (op == "layout.check_non_overlap") {
      EXPECT_EQ(result_of({{"op", "mesh_check_non_overlap"}, {"layout", l}}), want.at("non_overlap"));
    } else if (op == "layout.check_orthogonal") {
      EXPECT_EQ(result_of({{"op", "mesh_check_non_overlap"}, {"layout", l}}),
                want.at("non_overlap_gen_b"));
    } else if (op == "layout.remap_to_tensor") {
      EXPECT_EQ(result_of({{"op", "mesh_remap_to_tensor"}, {"layout", l}, {"rank_map", in.at("rank_map")}}),
                want.at("tensor"));
    } else if (op == "layout.composition") {
      Json a = ask({{"op", "composition"}, {"a", layout(in.at("left"))}, {"b", layout(in.at("right"))}});
      if (want.contains("raises")) {
        EXPECT_FALSE(a.at("ok").get<bool>()) << a.dump();
      } else {
        EXPECT_EQ(a.at("result"), layout(want.at("layout"))) << a.dump();
      }
    } else if (op == "layout.cosize_numel") {
      EXPECT_EQ(result_of({{"op", "size"}, {"layout", l}}), want.at("numel"));
      EXPECT_EQ(result_of({{"op", "cosize"}, {"layout", l}}), want.at("cosize"));
      EXPECT_EQ(result_of({{"op", "mesh_top_level_sizes"}, {"layout", l}}), want.at("top_level_sizes"));
      EXPECT_EQ(result_of({{"op", "mesh_all_ranks_from_zero"}, {"layout", l}}),
                want.at("all_ranks_from_zero"));
    } else if (op == "layout.nest") {
      EXPECT_EQ(result_of({{"op", "mesh_nest"}, {"layout", l}}), layout(want.at("layout")));
    } else if (op == "layout.getitem") {
      Json a = ask({{"op", "mesh_getitem"}, {"layout", l}, {"index", in.at("index")}});
      if (want.contains("raises")) {
        EXPECT_FALSE(a.at("ok").get<bool>());
      } else {
        EXPECT_EQ(a.at("result"), layout(want.at("layout")));
      }
    } else if (op == "layout.splice") {
      EXPECT_EQ(result_of({{"op", "mesh_splice"}, {"layout", l}, {"start", in.at("start")},
                           {"end", in.at("end")}, {"insert", layout(in.at("insert"))}}),
                layout(want.at("layout")));
    } else if (op == "layout.construct") {
      Json a = ask({{"op", "mesh_construct"}, {"shape", in.at("sizes")}, {"stride", in.at("strides")}});
      EXPECT_FALSE(a.at("ok").get<bool>());
    } else {
      ADD_FAILURE() << "unhandled vector op " << op;
    }
  }
  EXPECT_EQ(n, 48);
}

}  // namespace
