// A downstream suite: an SPMD test on every rank and a property over generated meshes, through
// the installed meshsim::testing.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <meshsim/testing/generators.hpp>
#include <meshsim/testing/mesh_generators.hpp>
#include <meshsim/testing/spmd_test.hpp>

MESHSIM_SPMD_TEST(Downstream, TpGroupsMatchTheMesh, 8) {
  const meshsim::DeviceMesh mesh =
      meshsim::DeviceMesh::init(std::vector<int64_t>{2, 4}, std::vector<std::string>{"dp", "tp"});
  meshsim::Communicator& tp = ctx.comm(mesh, "tp");
  ASSERT_EQ(tp.global_ranks(), *mesh.group_of(ctx.rank(), 1));
  int64_t v = ctx.rank();
  tp.all_reduce(std::span<int64_t>(&v, 1), meshsim::ReduceOp::kSum);
  const int64_t base = ctx.rank() / 4 * 4;
  EXPECT_EQ(v, 4 * base + 6);
}

RC_GTEST_PROP(Props, EveryRankOfAGeneratedMeshHasACoordinate, ()) {
  const auto spec = *meshsim::gen::mesh_root();
  const meshsim::DeviceMesh m = spec.build();
  for (int64_t r : spec.ranks()) RC_ASSERT(m.coordinate(r).has_value());
}

RC_GTEST_PROP(Props, CoalesceKeepsTheSize, ()) {
  const meshsim::Layout l = *meshsim::gen::any_layout();
  RC_ASSERT(meshsim::size(meshsim::coalesce(l)) == meshsim::size(l));
}
