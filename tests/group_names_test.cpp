// The creation plan's group names (group_names.hpp) against a brute force that runs PyTorch's
// naming call by call on every rank, for both modelled releases; the parsing of a program's
// own calls; the version option.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "meshsim/creation_plan.hpp"
#include "meshsim/error.hpp"
#include "meshsim/group_names.hpp"
#include "meshsim/recipe.hpp"
#include "meshsim/torch_version.hpp"

namespace meshsim {
namespace {

using Json = nlohmann::json;

// Planned keeps the meshes alive beside their plan (a plan's groups are read from them).
struct Planned {
  BuiltMeshes built;
  CreationPlan plan;
};

Planned planned(const Json& request) {
  const MeshRecipe r = recipe_from_json(request);
  BuiltMeshes built = apply(r);
  CreationPlan plan = creation_plan(r, built);
  return {std::move(built), std::move(plan)};
}

// Brute is PyTorch's naming run literally: each rank on its own, call by call, with its own
// group counter and count of groups held (the default group "0" held from the start).
struct Brute {
  // per rank: per item, the names of its calls as the engine lists them.
  std::vector<std::vector<std::vector<std::optional<std::string>>>> names;
  bool problem = false;
};

Brute brute_force(const CreationPlan& plan) {
  const bool v213 = plan.torch_version == TorchVersion::k2_13;
  const std::vector<ProgramItem> items = group_program_items(plan);
  Brute out;
  out.names.resize(static_cast<std::size_t>(plan.world));
  // (item, group) -> names its members gave; name -> groups holding it.
  std::map<std::pair<std::size_t, int64_t>, std::set<std::string>> by_group;
  std::map<std::string, std::set<std::pair<std::size_t, int64_t>>> by_name;
  for (int64_t r = 0; r < plan.world; ++r) {
    int64_t count = 1, held = 1;
    auto& mine = out.names[static_cast<std::size_t>(r)];
    mine.resize(items.size());
    auto member_of = [r](const std::vector<int64_t>& row) { return std::find(row.begin(), row.end(), r) != row.end(); };
    auto hashed = [&](const std::vector<int64_t>& ranks) {
      const int64_t salt = v213 ? held : count;
      if (!v213) ++count;
      return hashed_group_name(ranks, salt);
    };
    auto note = [&](std::size_t i, int64_t g, const std::string& name) {
      by_group[{i, g}].insert(name);
      by_name[name].insert({i, g});
    };
    for (std::size_t i = 0; i < items.size(); ++i) {
      std::vector<std::vector<int64_t>> rows;
      enum { kSeq, kLocal, kSplit } how = kSeq;
      if (items[i].user) {
        const GroupCallSpec& c = plan.program[items[i].index];
        if (c.kind == GroupCallSpec::Kind::kSplitGroup) {
          rows = c.split_ranks;
          how = kSplit;
        } else {
          std::vector<int64_t> all;
          for (int64_t k = 0; k < plan.world; ++k) all.push_back(k);
          rows = {c.ranks ? *c.ranks : all};
          how = c.local_sync ? kLocal : kSeq;
        }
      } else {
        const CreationBatch& b = plan.batches[items[i].index];
        if (b.kind == CreationBatch::Kind::kDefault) continue;
        if (b.group_desc == "mesh_default") {
          std::vector<int64_t> all;
          for (int64_t k = 0; k < plan.world; ++k) all.push_back(k);
          rows = {all};
        } else {
          rows = b.record->rows();
        }
        how = b.kind == CreationBatch::Kind::kSplitGroup ? kSplit : b.local_sync ? kLocal : kSeq;
      }
      if (how == kSplit) {
        std::size_t mine_at = 0;
        bool in = false;
        for (std::size_t g = 0; g < rows.size(); ++g) {
          if (member_of(rows[g])) {
            mine_at = g;
            in = true;
          }
        }
        const std::string name = hashed(rows[mine_at]);  // a rank in no split names the first
        mine[i].push_back(in ? std::optional<std::string>(name) : std::nullopt);
        if (in) {
          ++held;
          note(i, static_cast<int64_t>(mine_at), name);
        }
        continue;
      }
      for (std::size_t g = 0; g < rows.size(); ++g) {
        std::vector<int64_t> sorted = rows[g];
        std::sort(sorted.begin(), sorted.end());
        const bool in = member_of(sorted);
        if (how == kLocal) {
          if (!in) {
            if (items[i].user) mine[i].push_back(std::nullopt);  // the user's call: it returns at once
            continue;
          }
          const std::string name = hashed(sorted);
          ++held;
          mine[i].push_back(name);
          note(i, static_cast<int64_t>(g), name);
          continue;
        }
        const std::string name = std::to_string(count++);
        mine[i].push_back(in ? std::optional<std::string>(name) : std::nullopt);
        if (in) {
          ++held;
          note(i, static_cast<int64_t>(g), name);
        }
      }
    }
  }
  for (const auto& [g, names] : by_group) out.problem |= names.size() > 1;
  for (const auto& [n, groups] : by_name) out.problem |= groups.size() > 1;
  return out;
}

// random_request is a world of 2-8 ranks, a mesh (plain, with a bound device: split_group, or
// under torchcomms with a fake dim: local-synchronization new_groups), and 0-5 calls of the
// program's own around it.
Json random_request(std::mt19937_64& rng, TorchVersion v) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t world = pick(2, 8);
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= world; ++d) {
    if (world % d == 0) divisors.push_back(d);
  }
  const int64_t a = divisors[static_cast<std::size_t>(pick(0, static_cast<int64_t>(divisors.size()) - 1))];
  Json body{{"mesh_shape", {a, world / a}}, {"mesh_dim_names", {"x", "y"}}, {"torch_version", std::string(torch_version_name(v))}};
  switch (pick(0, 2)) {
    case 1: body["device_type"] = "cuda"; body["bound_device"] = true; break;
    case 2: body["use_torchcomms"] = true; body["backend_override"] = {{"y", "fake"}}; break;
    default: break;
  }
  Json calls = Json::array();
  const int64_t n = pick(0, 5);
  for (int64_t k = 0; k < n; ++k) {
    std::vector<int64_t> perm(static_cast<std::size_t>(world));
    for (int64_t r = 0; r < world; ++r) perm[static_cast<std::size_t>(r)] = r;
    std::shuffle(perm.begin(), perm.end(), rng);
    if (pick(0, 4) == 0) {
      // split_group: the permutation cut into 1-3 non-empty groups, some ranks left out.
      const int64_t keep = pick(1, world);
      const int64_t parts = std::min<int64_t>(pick(1, 3), keep);
      Json rows = Json::array();
      for (int64_t p = 0; p < parts; ++p) {
        Json row = Json::array();
        for (int64_t q = p; q < keep; q += parts) row.push_back(perm[static_cast<std::size_t>(q)]);
        rows.push_back(row);
      }
      calls.push_back({{"split_group", {{"split_ranks", rows}}}});
      continue;
    }
    Json ng = Json::object();
    if (pick(0, 9) > 0) ng["ranks"] = std::vector<int64_t>(perm.begin(), perm.begin() + pick(1, world));
    if (pick(0, 9) < 4) ng["use_local_synchronization"] = true;
    calls.push_back({{"new_group", ng}});
  }
  calls.insert(calls.begin() + pick(0, static_cast<int64_t>(calls.size())), "mesh");
  return Json{{"world_size", world}, {"build", {{"init_device_mesh", body}}}, {"process_groups", calls}};
}

TEST(GroupNames, EveryRanksNamesAreTheBruteForcesOnRandomPrograms) {
  std::mt19937_64 rng(67);
  int diverged = 0, agreed = 0;
  for (TorchVersion v : {TorchVersion::k2_13, TorchVersion::k2_14}) {
    for (int trial = 0; trial < 400; ++trial) {
      const Json req = random_request(rng, v);
      const Planned p = planned(req);
      const CreationPlan& plan = p.plan;
      const Brute brute = brute_force(plan);
      bool problem = false;
      for (int64_t r = 0; r < plan.world; ++r) {
        const GroupNames named = name_groups(plan, r);
        problem = named.problem_count > 0;
        ASSERT_EQ(named.items.size(), brute.names[static_cast<std::size_t>(r)].size()) << req.dump();
        for (std::size_t i = 0; i < named.items.size(); ++i) {
          ASSERT_EQ(named.items[i].names, brute.names[static_cast<std::size_t>(r)][i])
              << "rank " << r << ", item " << i << "\n" << req.dump();
        }
      }
      ASSERT_EQ(problem, brute.problem) << req.dump();
      (problem ? diverged : agreed) += 1;
    }
  }
  EXPECT_GT(diverged, 0);
  EXPECT_GT(agreed, 0);
}

TEST(GroupNames, TheLocalSyncProgramDivergesOn214AndNotOn213) {
  for (const char* v : {"2.13", "2.14"}) {
    const Json req{{"world_size", 4},
                   {"build", {{"init_device_mesh", {{"mesh_shape", {4}}, {"torch_version", v}}}}},
                   {"process_groups",
                    {{{"new_group", {{"ranks", {0, 1}}, {"use_local_synchronization", true}}}},
                     {{"new_group", {{"ranks", {0, 1, 2, 3}}}}}}}};
    const Planned p = planned(req);
    const CreationPlan& plan = p.plan;
    const GroupNames named = name_groups(plan, 0);
    // PyTorch's own names, printed by torch 2.13.0 and 2.14.1 over the fake backend.
    EXPECT_EQ(named.items[1].names.front(), "4a2ad14e7181d5235b64cf37fcd715cb5ce5c8e7");
    if (std::string(v) == "2.13") {
      EXPECT_EQ(named.problem_count, 0);
      EXPECT_EQ(named.items[2].names.front(), "1");
    } else {
      ASSERT_EQ(named.problem_count, 1);
      EXPECT_NE(named.problems[0].message.find("ranks 0-1 '2', ranks 2-3 '1'"), std::string::npos) << named.problems[0].message;
      EXPECT_NE(named.problems[0].message.find("process_groups[1]: new_group(ranks=[0, 1, 2, 3])"), std::string::npos);
      EXPECT_EQ(name_groups(plan, 3).items[2].names.front(), "1");
    }
  }
}

TEST(GroupNames, AMillionRanksAreNamedWithOneStateForTheRanksNeverNamed) {
  // 2^20 ranks as dp x tp, then a local-synchronization group of two ranks and a world group: on
  // 2.14 the world group's members split into the two ranks and the rest of the world.
  const int64_t world = int64_t{1} << 20;
  const Json req{{"world_size", world * 4},
                 {"build", {{"init_device_mesh", {{"mesh_shape", {1024, 1024}}, {"mesh_dim_names", {"dp", "tp"}}}}}},
                 {"process_groups",
                  {"mesh", {{"new_group", {{"ranks", {5, 7}}, {"use_local_synchronization", true}}}}, {{"new_group", Json::object()}}}}};
  const Planned p = planned(req);
  const CreationPlan& plan = p.plan;
  const GroupNames at5 = name_groups(plan, 5);
  ASSERT_EQ(at5.items.size(), 4u);
  EXPECT_EQ(at5.items[0].names.size(), 1024u);            // dp: one new_group per group, every rank
  EXPECT_EQ(at5.items[0].names[5], std::to_string(1 + 5));  // rank 5 is in dp group 5
  EXPECT_EQ(at5.items[1].names[0], std::to_string(1 + 1024));
  EXPECT_EQ(at5.problem_count, 1);
  EXPECT_NE(at5.problems[0].message.find("ranks 5,7 '2050'"), std::string::npos) << at5.problems[0].message;
  EXPECT_NE(at5.problems[0].message.find("'2049'"), std::string::npos) << at5.problems[0].message;
  EXPECT_EQ(name_groups(plan, world * 4 - 1).items[3].names.front(), "2049");
}

TEST(GroupNames, AProgramsOwnCallsAreReadAsPyTorchRefusesThem) {
  auto refusal = [](const Json& pg, const char* v = "2.14") -> std::string {
    try {
      process_groups_from_json(pg, 4, parse_torch_version(v));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(refusal(Json::parse(R"([{"new_group": {"ranks": [0, 4]}}])")).find("Rank 4 is out of range"), std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([{"new_group": {"ranks": [1, 1]}}])")).find("must not contain duplicate"), std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([{"new_group": {"ranks": [0, 1.5]}}])")).find("ranks must be a sequence of integers"),
            std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([{"new_group": {"ranks": [0, "1"]}}])"), "2.13").find("must hold integers"),
            std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([{"split_group": {"split_ranks": [[0, 1], [1, 2]]}}])")).find("rank 1 is in two"),
            std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([{"split_group": {"split_ranks": [[]]}}])")).find("cannot be empty"), std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"(["mesh", "mesh"])")).find("given twice"), std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([{"new_grup": {}}])")).find("exactly one of 'new_group' or 'split_group'"),
            std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([{"new_group": {"rank": [0]}}])")).find("rank"), std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"({"new_group": {}})")).find("must be a list"), std::string::npos);
  EXPECT_EQ(refusal(Json::parse(R"(["mesh", {"new_group": {"ranks": [3, 0], "group_desc": "ep"}}])")), "");
}

TEST(TorchVersion, ReadsTheModelledReleasesAndRefusesTheRestNamingThem) {
  EXPECT_EQ(parse_torch_version("2.13"), TorchVersion::k2_13);
  EXPECT_EQ(parse_torch_version("2.13.0+cpu"), TorchVersion::k2_13);
  EXPECT_EQ(parse_torch_version("2.14.1+cu130"), TorchVersion::k2_14);
  EXPECT_EQ(kNewestTorch, TorchVersion::k2_14);
  for (const char* bad : {"2.12", "2.14.0", "2.15", "", "2.13.", "v2.14"}) {
    try {
      parse_torch_version(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("2.13 (read from 2.13.0), 2.14 (read from 2.14.1)"), std::string::npos) << e.what();
    }
  }
}

TEST(TorchVersion, ConcatenatesRefusalIsWordedAsEachReleaseWordsIt) {
  for (auto [v, words] : {std::pair{TorchVersion::k2_13, "different device meshs"}, std::pair{TorchVersion::k2_14, "different device meshes"}}) {
    RootOptions o;
    o.torch_version = v;
    const DeviceMesh a = DeviceMesh::init(std::vector<int64_t>{2, 2}, std::vector<std::string>{"a", "b"}, o);
    const DeviceMesh b = DeviceMesh::init(std::vector<int64_t>{2, 2}, std::vector<std::string>{"a", "b"}, o);
    try {
      const std::vector<DeviceMesh> both{a.slice(std::string("a")), b.slice(std::string("b"))};
      DeviceMesh::concatenate(both);
      ADD_FAILURE() << "meshes of two roots were concatenated";
    } catch (const FailedPrecondition& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace meshsim
