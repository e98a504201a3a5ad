#include "meshsim/cli_flags.hpp"

#include <algorithm>
#include <charconv>

#include "meshsim/decimal.hpp"
#include "meshsim/check_meshes.hpp"
#include "meshsim/error.hpp"

namespace meshsim::cli {

void RecipeOptions::add(CLI::App* sub, RecipeFlags& f) {
  sub->add_option("--mesh", f.mesh, "named sizes, e.g. dp=2,cp=2,tp=4");
  sub->add_option("--shape", f.shape, "sizes, e.g. 2,2,4 (with --names)");
  sub->add_option("--names", f.names, "dim names for --shape, e.g. dp,cp,tp");
  sub->add_option("--rank-map", f.rank_map, "global ranks: a range 8..23 or a list 8,9,...");
  sub->add_option("--world-size", f.world_size, "world size (default: enough for the ranks)");
  sub->add_option("--recipe", f.recipe_file,
                  "a mesh.program JSON file: world size, root, ops with on/let (several views of one root)");
  sub->add_option("--preset", f.preset,
                  "a framework's meshes: torchtitan:pp=2,dp_shard=4,tp=2,ep=2 | torchtitan:FILE.toml | "
                  "megatron:tp=2,pp=2,ep=2,order=tp-cp-ep-dp-pp");
  slice = sub->add_option("--slice", slices, "slice dims, e.g. dp,tp (repeatable)");
  // Each --flatten is one step, with or without its name (TakeAll: one result per occurrence,
  // "" for none).
  flatten = sub->add_option("--flatten", flattens, "flatten (optional name; repeatable)")
                ->expected(0, 1)
                ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
                ->default_str("");
  unflatten = sub->add_option("--unflatten", unflattens, "unflatten dim:sizes:names, e.g. tp:2,2:a,b");
}

void RecipeOptions::collect(CLI::App* sub, RecipeFlags& f) const {
  std::size_t si = 0, fi = 0, ui = 0;
  for (CLI::Option* opt : sub->parse_order()) {
    if (opt == slice) f.steps.push_back({"slice", slices.at(si++)});
    if (opt == flatten) f.steps.push_back({"flatten", flattens.at(fi++)});
    if (opt == unflatten) f.steps.push_back({"unflatten", unflattens.at(ui++)});
  }
}

void add_placement(CLI::App* sub, placement::Flags& f) {
  sub->add_option("--gpus-per-host", f.gpus_per_host, "GPUs per host: rank r lives on host r / G (reports placement)");
  sub->add_option("--nvlink-domain", f.nvlink_domain, "GPUs per NVLink domain (default: --gpus-per-host)");
  sub->add_option("--require", f.require, "DIM=host or DIM=domain: every group of DIM on one host (repeatable)");
}

void guard_integers(CLI::App& app) {
  static const CLI::Validator fits_int64(
      [](std::string& value) -> std::string {
        std::string_view digits = value;
        if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
        bool overflow = false;
        read_decimal(digits, &overflow);
        if (overflow) return value + " does not fit in a 64-bit signed integer";
        return "";  // anything else: CLI11's own conversion says what is wrong
      },
      "", "INT64");
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_name() == "INT") opt->check(fits_int64);
  }
  for (CLI::App* sub : app.get_subcommands({})) guard_integers(*sub);
}

void add_run_flags(CLI::App* sub, run::Options& o, RecipeOptions& recipe) {
  recipe.add(sub, o.recipe);
  // The engines' one name table: every backend, then local.
  const std::vector<check::EngineEntry> all = check::engines();
  std::string backends_help;
  for (std::size_t i = 0; i < all.size(); ++i) {
    backends_help += (i + 1 == all.size() ? "or " : "") + all[i].name + " (" + all[i].description +
                     (all[i].name == "threaded" ? ", the default" : "") + ")" + (i + 1 == all.size() ? "" : ", ");
  }
  sub->add_option("--backend", o.backend, backends_help);
  sub->add_option("--timeout", o.timeout_seconds, "seconds every wait may take (default 30)");
  sub->add_option("--format", o.format, "text or json");
  sub->add_option("--max-elements", o.max_elements,
                  "the JSON report's element budget (default 2^21, as the query's); a bigger report is refused");
  sub->add_option("--rank-stack-kib", o.rank_stack_kib,
                  "each rank thread's or fiber's stack in KiB, 64 to 1048576 (default 512)");
  sub->add_option("--fault", o.faults, "plant a fault: KIND@RANK, KIND in throw, skip, mismatch, mesh, stall, exit, reorder");
  add_placement(sub, o.placement);
}

run::Options parse_run_flags(std::vector<std::string> args) {
  CLI::App app{"meshsim run"};
  app.name("meshsim run");
  app.set_help_flag();  // no --help here: it is an unknown flag like any other
  run::Options o;
  RecipeOptions recipe;
  add_run_flags(&app, o, recipe);
  guard_integers(app);
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector with the last argument first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument("meshsim run flags: " + std::string(e.what()));
  }
  recipe.collect(&app, o.recipe);
  return o;
}

}  // namespace meshsim::cli
