// meshsim/cli_flags.hpp — the command-line flags of `meshsim show` and `meshsim run`, registered
// on a CLI11 subcommand, so the tool and the Python module (meshsim.run([...flags])) read the
// same flags the same way.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "meshsim/placement.hpp"
#include "meshsim/recipe.hpp"
#include "meshsim/run.hpp"

namespace meshsim::cli {

// RecipeOptions are the recipe flags `show` and `run` share; collect() appends the
// transformations to the flags in command-line order.
struct RecipeOptions {
  std::vector<std::string> slices, flattens, unflattens;
  CLI::Option *slice = nullptr, *flatten = nullptr, *unflatten = nullptr;

  void add(CLI::App* sub, RecipeFlags& f);
  void collect(CLI::App* sub, RecipeFlags& f) const;
};

// add_placement adds the placement flags `show` and `run` share.
void add_placement(CLI::App* sub, placement::Flags& f);

// guard_integers makes every integer flag of `app` and its subcommands refuse a value beyond
// int64 naming it as typed ("--world-size: 9223372036854775808 does not fit in a 64-bit signed
// integer"), where CLI11 alone would clamp it to the nearest limit and go on.
void guard_integers(CLI::App& app);

// add_run_flags adds every flag of `meshsim run` to `sub`, reading into `o` (call
// recipe.collect(sub, o.recipe) after parsing).
void add_run_flags(CLI::App* sub, run::Options& o, RecipeOptions& recipe);

// parse_run_flags reads `meshsim run`'s flags (without the program and subcommand names, e.g.
// {"--mesh", "dp=2,tp=2", "--fault", "stall@1"}) as the tool does. A flag the tool would refuse
// (unknown, missing its value, a value of the wrong type, --help) is InvalidArgument naming it.
run::Options parse_run_flags(std::vector<std::string> args);

}  // namespace meshsim::cli
