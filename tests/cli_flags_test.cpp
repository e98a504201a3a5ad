// `meshsim run`'s flags as parse_run_flags reads them (the tool and meshsim.run([...]) share it).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshsim/cli_flags.hpp"
#include "meshsim/error.hpp"

namespace meshsim {
namespace {

TEST(RunFlags, EveryFlagLandsInItsFieldAndStepsKeepCommandLineOrder) {
  const run::Options o = cli::parse_run_flags(
      {"--mesh", "dp=2,tp=4", "--slice", "tp", "--flatten", "--unflatten", "tp:2,2:a,b", "--flatten", "x",
       "--backend", "gloo", "--timeout", "2.5", "--fault", "stall@1", "--fault", "throw@0", "--gpus-per-host", "4",
       "--require", "tp=host", "--world-size", "16"});
  EXPECT_EQ(o.recipe.mesh, "dp=2,tp=4");
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_DOUBLE_EQ(o.timeout_seconds, 2.5);
  EXPECT_EQ(o.faults, (std::vector<std::string>{"stall@1", "throw@0"}));
  EXPECT_EQ(o.placement.gpus_per_host, 4);
  EXPECT_EQ(o.placement.require, (std::vector<std::string>{"tp=host"}));
  EXPECT_EQ(o.recipe.world_size, 16);
  ASSERT_EQ(o.recipe.steps.size(), 4u);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"slice", "tp"}, {"flatten", ""}, {"unflatten", "tp:2,2:a,b"}, {"flatten", "x"}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(o.recipe.steps[i].kind, want[i].first) << i;
    EXPECT_EQ(o.recipe.steps[i].arg, want[i].second) << i;
  }
  // a nameless --flatten before a named one keeps each its own name
  const run::Options two = cli::parse_run_flags({"--mesh", "a=2,b=2", "--flatten", "--unflatten", "a_b:4:c", "--flatten", "d"});
  ASSERT_EQ(two.recipe.steps.size(), 3u);
  EXPECT_EQ(two.recipe.steps[0].arg, "");
  EXPECT_EQ(two.recipe.steps[2].arg, "d");
  // the limits themselves are values like any other (the run then judges them)
  EXPECT_EQ(cli::parse_run_flags({"--world-size", "9223372036854775807"}).recipe.world_size, INT64_MAX);
  EXPECT_EQ(cli::parse_run_flags({"--world-size", "+5"}).recipe.world_size, 5);
  const run::Options defaults = cli::parse_run_flags({});
  EXPECT_EQ(defaults.backend, "threaded");
  EXPECT_DOUBLE_EQ(defaults.timeout_seconds, 30);
  EXPECT_EQ(defaults.format, "text");
}

TEST(RunFlags, WhatTheToolRefusesIsInvalidArgumentNamingIt) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--bogus"}, "--bogus"},
      {{"--mesh"}, "--mesh"},
      {{"--timeout", "soon"}, "soon"},
      {{"--help"}, "--help"},
      {{"stray"}, "stray"},
      // beyond int64: refused as typed, never clamped to the limit
      {{"--world-size", "9223372036854775808"}, "9223372036854775808 does not fit in a 64-bit signed integer"},
      {{"--gpus-per-host", "99999999999999999999"}, "99999999999999999999 does not fit"},
      {{"--nvlink-domain", "-9223372036854775809"}, "-9223372036854775809 does not fit"},
  };
  for (const auto& [args, named] : cases) {
    try {
      cli::parse_run_flags(args);
      ADD_FAILURE() << args.front() << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace meshsim
