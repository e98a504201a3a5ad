// meshsim/testing/spmd_test.hpp — GoogleTest on every rank: one test body, run by every rank of a
// world, once per backend, each backend a separate test instance.
//
//   #include <meshsim/testing/spmd_test.hpp>   // target meshsim::testing
//
//   MESHSIM_SPMD_TEST(TpGroups, MatchTheMesh, 8) {        // 8 ranks; `ctx` is the RankContext
//     auto mesh = meshsim::DeviceMesh::init(std::vector<int64_t>{2, 4}, {{"dp", "tp"}});
//     meshsim::Communicator& tp = ctx.comm(mesh, "tp");
//     EXPECT_EQ(tp.size(), 4);                            // a failure names the rank
//     ASSERT_EQ(tp.global_ranks(), *mesh.group_of(ctx.rank(), 1));  // fatal: stops all
//   }
//
// registers `TpGroups.MatchTheMesh/threaded`, `/gloo` (Gloo over loopback TCP, rank threads
// sharing one device), `/fiber` (every rank a fiber of one thread) and, in builds with NCCL,
// `/nccl` (one GPU per rank; skipped, saying why, when there are fewer GPUs than ranks): one
// instance per backend this build has. In CMake, `meshsim_discover_spmd_tests(target)` (from
// find_package(meshsim COMPONENTS testing)) gives each backend's instances the ctest label of
// the backend, so `ctest -L threaded` runs them.
//
// Inside the body:
//   - EXPECT_* / ADD_FAILURE report a failure of the test prefixed with "[rank R]";
//   - ASSERT_* / FAIL() also stop the run: the rank fails, and every other rank blocked in a
//     collective fails fast naming it, instead of waiting for it;
//   - an exception, a mismatched collective or a stall fails the test with the runner's
//     diagnosis (see meshsim/spmd.hpp);
//   - GTEST_SKIP() skips the test when every rank skips before its first collective.
//
// The per-wait timeout is 30 s unless the environment sets MESHSIM_TEST_TIMEOUT (seconds).
//
// Thread safety: a test body runs on every rank's thread (or fiber) at once; use `ctx` only from
// its own rank, and guard anything the body shares between ranks.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/spmd.hpp"

namespace meshsim::testing {

// spmd_backends lists the backends this build runs SPMD tests on, in registration order.
std::vector<std::string> spmd_backends();

// default_timeout is the per-wait timeout of SPMD tests (MESHSIM_TEST_TIMEOUT or 30 s).
std::chrono::milliseconds default_timeout();

// run_on_every_rank runs `fn` on every rank of a `world_size`-rank world over `backend`, inside
// the current test, reporting rank failures as described above. It returns the runner's report.
RunReport run_on_every_rank(int64_t world_size, std::string_view backend,
                            const std::function<void(RankContext&)>& fn,
                            std::chrono::milliseconds timeout = default_timeout());

namespace detail {
// register_spmd_test registers Suite.Name/<backend> for every backend; used by the macro.
int register_spmd_test(const char* suite, const char* name, const char* file, int line,
                       int64_t world_size, void (*body)(RankContext&));
}  // namespace detail

}  // namespace meshsim::testing

// MESHSIM_SPMD_TEST(Suite, Name, world_size) { body using `ctx` }
#define MESHSIM_SPMD_TEST(Suite, Name, world_size)                                              \
  static void meshsim_spmd_body_##Suite##_##Name(::meshsim::RankContext& ctx);                  \
  [[maybe_unused]] static const int meshsim_spmd_registered_##Suite##_##Name =                  \
      ::meshsim::testing::detail::register_spmd_test(#Suite, #Name, __FILE__, __LINE__,         \
                                                     (world_size),                              \
                                                     &meshsim_spmd_body_##Suite##_##Name);      \
  static void meshsim_spmd_body_##Suite##_##Name([[maybe_unused]] ::meshsim::RankContext& ctx)
