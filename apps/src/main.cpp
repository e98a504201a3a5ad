// meshsim — the command-line tool.
//   meshsim query [--file requests.jsonl]   JSON Lines in, one answer per line (DESIGN §7)
//   meshsim show --mesh dp=2,tp=4 [...]     a mesh, its groups and coordinates
//   meshsim ops                             list the query ops
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "meshsim/error.hpp"
#include "query.hpp"
#include "show.hpp"

int main(int argc, char** argv) {
  CLI::App app{"meshsim: device-mesh layout algebra and bookkeeping, testable on a laptop"};
  app.require_subcommand(1);

  auto* query = app.add_subcommand("query", "answer JSON-lines requests (stdin or --file)");
  std::string file;
  bool flush = false;
  query->add_option("-f,--file", file, "read requests from this file instead of stdin");
  query->add_flag("--flush", flush, "flush after every answer (for interactive pipes)");

  auto* show = app.add_subcommand("show", "show a mesh, its per-dim groups and coordinates");
  meshsim::show::Options so;
  std::vector<std::string> slices, flattens, unflattens;
  show->add_option("--mesh", so.mesh, "named sizes, e.g. dp=2,cp=2,tp=4");
  show->add_option("--shape", so.shape, "sizes, e.g. 2,2,4 (with --names)");
  show->add_option("--names", so.names, "dim names for --shape, e.g. dp,cp,tp");
  show->add_option("--rank-map", so.rank_map, "global ranks: a range 8..23 or a list 8,9,...");
  show->add_option("--world-size", so.world_size, "world size (default: enough for the ranks)");
  show->add_option("--rank", so.rank, "the rank whose view and groups to show");
  auto* o_slice = show->add_option("--slice", slices, "slice dims, e.g. dp,tp (repeatable)");
  auto* o_flatten = show->add_option("--flatten", flattens, "flatten (optional name)")
                        ->expected(0, 1)
                        ->default_str("");
  auto* o_unflatten =
      show->add_option("--unflatten", unflattens, "unflatten dim:sizes:names, e.g. tp:2,2:a,b");
  show->add_option("--format", so.format, "text or json")->check(CLI::IsMember({"text", "json"}));
  show->add_option("--max-rows", so.max_rows, "rows printed per table (text)");

  auto* ops = app.add_subcommand("ops", "list the ops `meshsim query` answers");

  CLI11_PARSE(app, argc, argv);

  std::ios::sync_with_stdio(false);
  if (*query) {
    if (file.empty()) {
      meshsim::query::run(std::cin, std::cout, flush);
    } else {
      std::ifstream in(file);
      if (!in) {
        std::cerr << "meshsim query: cannot open '" << file << "'\n";
        return 2;
      }
      meshsim::query::run(in, std::cout, flush);
    }
    return std::cout.good() ? 0 : 1;
  }
  if (*show) {
    // Transformations apply in command-line order.
    std::size_t si = 0, fi = 0, ui = 0;
    for (CLI::Option* opt : show->parse_order()) {
      if (opt == o_slice) so.steps.push_back({"slice", slices.at(si++)});
      if (opt == o_flatten) so.steps.push_back({"flatten", fi < flattens.size() ? flattens[fi++] : ""});
      if (opt == o_unflatten) so.steps.push_back({"unflatten", unflattens.at(ui++)});
    }
    try {
      meshsim::show::run(so, std::cout);
    } catch (const meshsim::Error& e) {
      std::cerr << "meshsim show: " << e.type_name() << ": " << e.what() << "\n";
      return 2;
    }
    return 0;
  }
  if (*ops) {
    for (const auto& name : meshsim::query::ops()) std::cout << name << '\n';
  }
  return 0;
}
