// The main job as a library call: typed job in, typed report out, on every engine; the engine
// table; typed faults; a launched rank's typed result read back against hostile bytes.
#include "meshsim/check_meshes.hpp"

#include <gtest/gtest.h>

#include <cstring>

#include "../check/src/program.hpp"
#include "meshsim/backend_registry.hpp"
#include "meshsim/error.hpp"
#include "meshsim/local.hpp"

namespace meshsim::check {
namespace {

using V = std::vector<int64_t>;

MeshRecipe three_dims() { return recipe_from_flags({.mesh = "dp=2,cp=2,tp=2", .steps = {{"slice", "dp,tp"}}}); }

// The groups a dim must have, from DeviceMesh itself (not from the job): each coordinate line.
std::vector<V> groups_of(const DeviceMesh& m, int d) {
  std::vector<V> out;
  for (const V& g : m.groups(d)) out.push_back(g);
  return out;
}

TEST(CheckEngines, TheNameTableIsEveryBackendThenLocal) {
  const std::vector<EngineEntry> all = engines();
  const std::vector<std::string> backends = backend_names();
  ASSERT_EQ(all.size(), backends.size() + 1);
  for (std::size_t i = 0; i < backends.size(); ++i) {
    EXPECT_EQ(all[i].name, backends[i]);
    EXPECT_FALSE(all[i].lockstep);
    EXPECT_EQ(all[i].max_ranks, find_backend(backends[i])->max_rank_threads);
  }
  EXPECT_EQ(all.back().name, "local");
  EXPECT_TRUE(all.back().lockstep);
  EXPECT_EQ(all.back().max_ranks, kMaxLocalWorld);
  EXPECT_FALSE(find_engine("nope").has_value());
  EXPECT_EQ(engine_names_text(), backend_names_text() + ", local");
  Job job{.recipe = three_dims(), .engine = "nope"};
  try {
    check_meshes(job);
    FAIL() << "an unknown engine ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'nope' is not available (known: " + engine_names_text()), std::string::npos) << e.what();
  }
}

class EveryEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryEngine, ATypedJobReportsEveryGroupItGathered) {
  Job job{.recipe = three_dims(), .engine = GetParam(), .timeout = std::chrono::seconds(20), .every_group = true};
  const MeshCheckReport r = check_meshes(job);
  ASSERT_TRUE(r.ok) << (r.failures.empty() ? "" : r.failures[0].message);
  EXPECT_TRUE(r.passed());
  EXPECT_EQ(r.engine, GetParam());
  EXPECT_EQ(r.world_size, 8);
  // root (3 dims) and the slice (2 dims), 8 ranks each, 3 checks per dim.
  EXPECT_EQ(r.expected_checks, 3 * (3 + 2) * 8);
  EXPECT_EQ(r.checks, r.expected_checks);
  ASSERT_EQ(r.meshes.size(), 2u);
  ASSERT_EQ(r.seen.size(), 2u);
  for (std::size_t i = 0; i < r.meshes.size(); ++i) {
    ASSERT_EQ(r.seen[i].size(), static_cast<std::size_t>(r.meshes[i].ndim()));
    for (int d = 0; d < r.meshes[i].ndim(); ++d) EXPECT_EQ(r.seen[i][static_cast<std::size_t>(d)], groups_of(r.meshes[i], d));
  }
  EXPECT_EQ(r.seen[0][2], (std::vector<V>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));  // tp, by hand
  EXPECT_GT(r.collectives, 0);
  EXPECT_FALSE(r.rank.has_value());
}

TEST_P(EveryEngine, APlantedThrowIsTheSameDiagnosisOnEveryEngine) {
  Job job{.recipe = three_dims(), .engine = GetParam(), .faults = {{FaultKind::kThrow, 5}},
          .timeout = std::chrono::seconds(20)};
  const MeshCheckReport r = check_meshes(job);
  ASSERT_FALSE(r.ok);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_EQ(r.failures[0].ranks, V{5});
  EXPECT_NE(r.failures[0].message.find("planted fault: rank 5 throws mid-run"), std::string::npos) << r.failures[0].message;
  EXPECT_TRUE(r.seen.empty());
}

TEST_P(EveryEngine, ASummaryKeepsTheFirstGroupsOfEachDim) {
  Job job{.recipe = recipe_from_flags({.mesh = "dp=16,tp=2"}), .engine = GetParam(), .timeout = std::chrono::seconds(20)};
  const MeshCheckReport r = check_meshes(job);
  ASSERT_TRUE(r.ok);
  ASSERT_EQ(r.seen[0][1].size(), static_cast<std::size_t>(kShownGroups));  // tp: 16 groups, 8 kept
  for (int64_t g = 0; g < kShownGroups; ++g) EXPECT_EQ(r.seen[0][1][static_cast<std::size_t>(g)], (V{2 * g, 2 * g + 1}));
  EXPECT_EQ(r.seen[0][0].size(), 2u);  // dp: 2 groups
}

// A rank that creates its process groups in another order than PyTorch's DeviceMesh does (its
// first two dims swapped) is named by itself, with the first creation where it parts from the
// plan; the other ranks end without a diagnosis of their own.
TEST_P(EveryEngine, APlantedReorderOfGroupCreationsIsNamed) {
  Job job{.recipe = three_dims(), .engine = GetParam(), .faults = {{FaultKind::kReorder, 6}},
          .timeout = std::chrono::seconds(20)};
  const MeshCheckReport r = check_meshes(job);
  ASSERT_FALSE(r.ok);
  ASSERT_EQ(r.failures.size(), 1u) << r.failures[0].message;
  EXPECT_EQ(r.failures[0].ranks, V{6});
  const std::string& m = r.failures[0].message;
  EXPECT_NE(m.find("creation 1 of 3: it makes new_group x4 for dim 'cp'"), std::string::npos) << m;
  EXPECT_NE(m.find("where every rank makes new_group x4 for dim 'dp'"), std::string::npos) << m;
  EXPECT_TRUE(r.stuck.empty());
}

INSTANTIATE_TEST_SUITE_P(Engines, EveryEngine, ::testing::Values("threaded", "fiber", "local"),
                         [](const auto& info) { return info.param; });

TEST(CheckFaults, TypedFaultsAreCheckedLikeTheirSpelling) {
  EXPECT_EQ(parse_faults({"stall@3", "mesh@0"}, 8), (std::vector<Fault>{{FaultKind::kStall, 3}, {FaultKind::kMesh, 0}}));
  EXPECT_THROW(parse_faults({"stall@8"}, 8), OutOfRange);
  EXPECT_THROW(parse_faults({"boom@1"}, 8), InvalidArgument);
  EXPECT_THROW(parse_faults({"skip@0"}, 1), InvalidArgument);
  const auto refused = [](Job job, const std::string& want) {
    try {
      check_meshes(job);
      ADD_FAILURE() << "ran: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(Job{.recipe = three_dims(), .faults = {{FaultKind::kSkip, 9}}}, "rank 9 is out of range [0, 8)");
  refused(Job{.recipe = three_dims(), .faults = {{FaultKind::kSkip, -1}}}, "rank -1 is negative");
  refused(Job{.recipe = three_dims(), .engine = "local", .faults = {{FaultKind::kStall, 1}}}, "does not apply to --backend local");
  refused(Job{.recipe = three_dims(), .timeout = std::chrono::milliseconds(0)}, "is not > 0");
  // A recipe that cannot be built is refused before any rank starts, naming where it came from.
  const MeshRecipe bad = recipe_from_flags({.mesh = "a=2,b=2", .steps = {{"slice", "zz"}}});
  refused(Job{.recipe = bad, .origin = "--recipe 'x.json'"}, "--recipe 'x.json': ");
  refused(Job{.recipe = bad, .engine = "local"}, "zz");
  refused(Job{.recipe = three_dims(), .stack_bytes = 1024}, "out of range");
  EXPECT_EQ(parse_faults({"reorder@2"}, 8), (std::vector<Fault>{{FaultKind::kReorder, 2}}));
  // One dim of the world's size reuses the default group: nothing to reorder.
  refused(Job{.recipe = recipe_from_flags({.mesh = "world=8"}), .faults = {{FaultKind::kReorder, 1}}},
          "needs a recipe whose ranks create the groups of at least two dims (this one creates 0)");
  // What PyTorch refuses is refused before any rank starts: a bound default group whose backend
  // cannot split.
  MeshRecipe xccl = three_dims();
  xccl.root.device_type = "xpu";
  xccl.root.default_backend = "xccl";
  xccl.root.creation.bound_device = true;
  refused(Job{.recipe = xccl}, "the default backend 'xccl' cannot split");
}

// ---- a launched rank's typed result ----

detail::Plan plan_of(const MeshRecipe& recipe) {
  detail::Plan p;
  p.recipe = recipe;
  p.expected = apply(recipe);
  p.meshes.push_back(p.expected->root);
  for (const DeviceMesh& m : p.expected->meshes) p.meshes.push_back(m);
  p.world = recipe.world_size;
  p.expected_checks = detail::checks::total(p.meshes);
  return p;
}

TEST(CheckRankResult, ARankResultReadsBackAsItWasWritten) {
  const detail::Plan plan = plan_of(three_dims());
  detail::RankResult r{.checks = 15, .seen = {{{0, 4}, {0, 2}, {0, 1}}, {{0, 4}, {0, 1}}}};
  int64_t collectives = 0;
  const detail::RankResult back = detail::decode_result(detail::encode_result(r, 77), plan, 0, collectives);
  EXPECT_EQ(back.checks, 15);
  EXPECT_EQ(back.seen, r.seen);
  EXPECT_EQ(collectives, 77);
}

TEST(CheckRankResult, HostileBytesAreRefusedNeverTrusted) {
  const detail::Plan plan = plan_of(three_dims());
  const detail::RankResult good{.checks = 15, .seen = {{{0, 4}, {0, 2}, {0, 1}}, {{0, 4}, {0, 1}}}};
  const std::string bytes = detail::encode_result(good, 3);
  int64_t c = 0;
  const auto refused = [&](const std::string& b, const std::string& want) {
    try {
      detail::decode_result(b, plan, 0, c);
      ADD_FAILURE() << "read: " << want;
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  const auto word = [&](std::size_t k, int64_t v) {
    std::string b = bytes;
    std::memcpy(b.data() + 8 * k, &v, 8);
    return b;
  };
  refused("", "ends before its tag");
  refused(bytes.substr(0, bytes.size() - 8), "ends before");
  refused(bytes.substr(0, bytes.size() - 3), "not whole words");
  refused(bytes + std::string(8, '\0'), "past its end");
  refused(std::string(bytes.size(), 'x'), "another tag");
  refused(word(1, 16), "check count 16 is not in [0, 15]");          // rank 0 runs 15 checks
  refused(word(3, 3), "mesh count 3 is not in [0, 2]");
  refused(word(4, int64_t{1} << 62), "dim count");
  refused(word(5, INT64_MAX), "group size");                          // a length near 2^63
  refused(word(6, 8), "rank 8 is not in [0, 7]");
  refused(word(6, -1), "rank -1 is not in [0, 7]");
  // Another rank's own bound: rank 0 of the slice runs 15 checks, a rank outside none.
  detail::Plan sliced = plan_of(recipe_from_flags({.mesh = "a=2", .world_size = 4}));
  EXPECT_THROW(detail::decode_result(detail::encode_result({.checks = 3, .seen = {{{0, 1}}}}, 1), sliced, 3, c), ParseError);
}

}  // namespace
}  // namespace meshsim::check
