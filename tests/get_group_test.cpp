// PyTorch's get_group / get_all_groups (test_device_mesh.py: test_get_group_and_get_all_groups,
// test_device_mesh_init_backend, test_flatten_mesh_3d's group_desc, the error table of
// docs/device-mesh.md), the world's default backend, and meshsim's transpose and reshape.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "meshsim/device_mesh.hpp"
#include "meshsim/error.hpp"

namespace meshsim {
namespace {

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error of the expected type";
  return {};
}

TEST(GetGroup, ByIndexByNameAndFromTheSliceAgreeAndAllGroupsListsEveryDim) {
  const DeviceMesh mesh = DeviceMesh::init({2, 4}, std::vector<std::string>{"dp", "tp"});
  for (int64_t rank = 0; rank < 8; ++rank) {
    const GroupHandle tp = mesh.get_group(rank, 1);
    EXPECT_EQ(tp.ranks, mesh.get_group(rank, "tp").ranks);
    EXPECT_EQ(tp.record, mesh.get_group(rank, "tp").record);
    EXPECT_EQ(tp.ranks, mesh.slice("tp").get_group(rank).ranks);
    EXPECT_EQ(tp.record, mesh.slice("tp").get_group(rank).record);  // a slice reuses its parent's group
    const std::vector<GroupHandle> all = mesh.get_all_groups(rank);
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].ranks, mesh.get_group(rank, "dp").ranks);
    EXPECT_EQ(all[1].ranks, tp.ranks);
    EXPECT_EQ(all[0].group_desc, "mesh_dp");
    EXPECT_EQ(all[1].group_desc, "mesh_tp");
  }
  EXPECT_EQ(mesh.get_group(5, "dp").ranks, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(mesh.get_group(5, "tp").ranks, (std::vector<int64_t>{4, 5, 6, 7}));
}

TEST(GetGroup, PyTorchsErrors) {
  const DeviceMesh mesh = DeviceMesh::init({2, 4}, std::vector<std::string>{"dp", "tp"});
  EXPECT_NE(message_of<FailedPrecondition>([&] { mesh.get_group(0); }).find(
                "Optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim > 1"),
            std::string::npos);
  EXPECT_NE(message_of<NotFound>([&] { mesh.get_group(0, "cp"); }).find("Mesh dimension 'cp' does not exist."),
            std::string::npos);
  EXPECT_THROW(mesh.get_group(0, 2), OutOfRange);
  EXPECT_THROW(mesh.get_group(0, -1), OutOfRange);
  const DeviceMesh unnamed = DeviceMesh::init({4});
  EXPECT_EQ(unnamed.get_group(2).ranks, (std::vector<int64_t>{0, 1, 2, 3}));  // 1-D: its only group
  // As large as the world: PyTorch hands out its default group (checked against torch 2.13 by
  // torch:device_mesh); a dim of part of the world gets its own, "mesh_" + its name.
  EXPECT_EQ(unnamed.get_group(2).group_desc, "default_pg");
  EXPECT_EQ(mesh.get_group(2, "tp").group_desc, "mesh_tp");
  const std::vector<int64_t> shape{4}, order{3, 1, 0, 2};
  const DeviceMesh permuted = DeviceMesh::from_ranks(shape, order, std::vector<std::string>{"dp"});
  EXPECT_EQ(permuted.get_group(0, "dp").ranks, order);                                 // mesh order
  EXPECT_EQ(permuted.get_group(0, "dp").pg_ranks, (std::vector<int64_t>{0, 1, 2, 3}));  // the group's: ascending
  EXPECT_NE(message_of<FailedPrecondition>([&] { unnamed.get_group(0, "dp"); }).find("No `mesh_dim_names` found."),
            std::string::npos);
  // test_device_mesh_init_backend: no process groups, but the coordinate is still computed.
  RootOptions no_pg;
  no_pg.init_backend = false;
  const DeviceMesh lazy = DeviceMesh::from_ranks(std::vector<int64_t>{10}, std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
                                                 std::vector<std::string>{"x"}, no_pg);
  EXPECT_EQ(message_of<FailedPrecondition>([&] { lazy.get_group(5, 0); }), "DeviceMesh process groups not initialized!");
  EXPECT_THROW(lazy.get_all_groups(5), FailedPrecondition);
  EXPECT_EQ(*lazy.coordinate(5), (std::vector<int64_t>{5}));
  // A rank outside a mesh has no groups.
  const DeviceMesh part = DeviceMesh::from_ranks(std::vector<int64_t>{2}, std::vector<int64_t>{4, 6});
  EXPECT_THROW(part.get_group(5), FailedPrecondition);
}

TEST(GetGroup, AFlattenedNameResolvesOnTheRootWithItsDescription) {
  const DeviceMesh mesh = DeviceMesh::init({2, 2, 2}, std::vector<std::string>{"dp", "cp", "tp"});
  const DeviceMesh dp_cp = mesh.slice({"dp", "cp"}).flatten();
  for (int64_t rank = 0; rank < 8; ++rank) {
    const GroupHandle g = mesh.get_group(rank, "dp_cp");
    EXPECT_EQ(g.ranks, *dp_cp.group_of(rank, 0));
    EXPECT_EQ(g.group_desc, "mesh_dp_cp");
    EXPECT_EQ(g.record, dp_cp.get_group(rank).record);
    EXPECT_EQ(g.ranks, mesh.slice("tp").get_group(rank, "dp_cp").ranks);  // from any mesh of the family
  }
  EXPECT_EQ(mesh.get_group(1, "dp_cp").ranks, (std::vector<int64_t>{1, 3, 5, 7}));
}

TEST(GetGroup, RepeatedRequestsAreCacheHitsAndSlicesReuseTheirParentsGroups) {
  const DeviceMesh mesh = DeviceMesh::init({2, 2, 4}, std::vector<std::string>{"dp", "cp", "tp"});
  mesh.get_all_groups(0);
  const CacheStats first = mesh.cache_stats();
  EXPECT_EQ(first.misses, 3);
  mesh.get_all_groups(7);
  mesh.slice({"dp", "tp"}).get_all_groups(3);
  const CacheStats after = mesh.cache_stats();
  EXPECT_EQ(after.misses, 3);
  EXPECT_EQ(after.hits, first.hits + 5);
  EXPECT_EQ(after.size, 3);
}

TEST(GetGroup, BackendIsTheOverrideElseTheWorldDefaultAndOptionsTravel) {
  RootOptions o;
  o.default_backend = "gloo";
  BackendConfig timeout_only;  // options alone keep the world's default backend
  timeout_only.timeout = std::chrono::milliseconds(1234);
  BackendConfig nccl;
  nccl.backend = "nccl";
  nccl.options = NcclOptions{.high_priority_stream = true};
  o.backend_override = {timeout_only, nccl, BackendConfig{}};
  const DeviceMesh mesh = DeviceMesh::init({2, 2, 2}, std::vector<std::string>{"dp", "cp", "tp"}, o);
  const GroupHandle dp = mesh.get_group(0, "dp"), cp = mesh.get_group(0, "cp"), tp = mesh.get_group(0, "tp");
  EXPECT_EQ(dp.backend, "gloo");
  EXPECT_EQ(dp.config.timeout, std::chrono::milliseconds(1234));
  EXPECT_EQ(cp.backend, "nccl");
  EXPECT_TRUE(std::get<NcclOptions>(cp.config.options).high_priority_stream);
  EXPECT_EQ(tp.backend, "gloo");
  EXPECT_NE(dp.record, mesh.with_backend_configs({}).get_group(0, "dp").record);  // the config is part of the key
  EXPECT_EQ(DeviceMesh::init({4}).get_group(0).backend, "");  // no default: the run's own backend
}

TEST(GetGroup, RanksAreTheRanksRowOfGroupsOnRandomMeshes) {
  std::mt19937 rng(32);
  for (int iter = 0; iter < 200; ++iter) {
    const int nd = 1 + static_cast<int>(rng() % 4);
    std::vector<int64_t> shape;
    std::vector<std::string> names;
    for (int d = 0; d < nd; ++d) {
      shape.push_back(1 + static_cast<int64_t>(rng() % 4));
      names.push_back("d" + std::to_string(d));
    }
    DeviceMesh m = DeviceMesh::init(shape, names);
    if (nd > 1 && rng() % 2) {  // a non-contiguous slice
      m = m.slice({names.front(), names.back()});
    }
    for (int d = 0; d < m.ndim(); ++d) {
      for (const std::vector<int64_t>& row : m.groups(d)) {
        for (int64_t r : row) {
          if (m.coordinate(r)) EXPECT_EQ(m.get_group(r, d).ranks, row) << m.to_string() << " dim " << d;
        }
      }
    }
  }
}

TEST(Transpose, PermutesDimsOverTheSameRanksAndFlattensColumnMajor) {
  const DeviceMesh mesh = DeviceMesh::init({2, 4}, std::vector<std::string>{"dp", "tp"});
  const DeviceMesh t = mesh.transpose(std::vector<std::string>{"tp", "dp"});
  EXPECT_EQ(t, mesh.transpose(std::vector<int>{1, 0}));
  EXPECT_EQ(*t.names(), (std::vector<std::string>{"tp", "dp"}));
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t.groups(0), mesh.groups(1));
  EXPECT_EQ(t.groups(1), mesh.groups(0));
  EXPECT_EQ(t.mesh_for(0)->values, (std::vector<int64_t>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(t.flatten("tp_dp").groups(0), (std::vector<std::vector<int64_t>>{{0, 4, 1, 5, 2, 6, 3, 7}}));
  EXPECT_EQ(t.transpose(std::vector<int>{1, 0}), mesh);
  EXPECT_EQ(mesh.transpose(std::vector<int>{0, 1}), mesh);
  EXPECT_THROW(mesh.slice({"tp", "dp"}), Error);  // PyTorch's slice still refuses this order
  EXPECT_EQ(t.slice({"tp", "dp"}), t);            // the transposed mesh's own order slices
  EXPECT_THROW(mesh.transpose(std::vector<int>{0, 0}), InvalidArgument);
  EXPECT_THROW(mesh.transpose(std::vector<int>{1}), InvalidArgument);
  EXPECT_THROW(mesh.transpose(std::vector<int>{0, 2}), InvalidArgument);
  EXPECT_THROW(mesh.transpose(std::vector<std::string>{"tp", "cp"}), NotFound);
  EXPECT_THROW(DeviceMesh::init({2, 2}).transpose(std::vector<std::string>{"a", "b"}), FailedPrecondition);
}

TEST(Reshape, IsFlattenThenUnflattenWithoutRegisteringAName) {
  const DeviceMesh mesh = DeviceMesh::init({2, 2, 4}, std::vector<std::string>{"dp", "cp", "tp"});
  const DeviceMesh s = mesh.slice({"dp", "tp"});
  const DeviceMesh r = s.reshape(std::vector<int64_t>{4, 2}, std::vector<std::string>{"a", "b"});
  const DeviceMesh via = s.flatten("via").unflatten(0, std::vector<int64_t>{4, 2}, std::vector<std::string>{"a", "b"});
  EXPECT_EQ(r.groups(0), via.groups(0));
  EXPECT_EQ(r.groups(1), via.groups(1));
  EXPECT_EQ(mesh.flattened_names(), (std::vector<std::string>{"via"}));
  EXPECT_THROW(s.reshape(std::vector<int64_t>{3, 3}, std::vector<std::string>{"a", "b"}), InvalidArgument);
}

}  // namespace
}  // namespace meshsim
