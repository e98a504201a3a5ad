// meshsim — the command-line tool.
//   meshsim query [--file requests.jsonl]   JSON Lines in, one answer per line (DESIGN §7)
//   meshsim show --mesh dp=2,tp=4 [...]     a mesh, its groups and coordinates
//   meshsim run --mesh dp=2,tp=4 [...]      simulate every rank and check the mesh's groups
//   meshsim store [--host H] [--port P]     serve a TCP rendezvous store until SIGINT/SIGTERM
//   meshsim ops                             list the query ops
#include <CLI/CLI.hpp>
#include <csignal>
#include <fstream>
#include <iostream>

#include "meshsim/error.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/query.hpp"
#include "meshsim/run.hpp"
#include "meshsim/show.hpp"
#include "meshsim/store.hpp"

namespace {

// RecipeOptions are the recipe flags `show` and `run` share; steps() returns the
// transformations in command-line order.
struct RecipeOptions {
  std::vector<std::string> slices, flattens, unflattens;
  CLI::Option *slice = nullptr, *flatten = nullptr, *unflatten = nullptr;

  void add(CLI::App* sub, meshsim::RecipeFlags& f) {
    sub->add_option("--mesh", f.mesh, "named sizes, e.g. dp=2,cp=2,tp=4");
    sub->add_option("--shape", f.shape, "sizes, e.g. 2,2,4 (with --names)");
    sub->add_option("--names", f.names, "dim names for --shape, e.g. dp,cp,tp");
    sub->add_option("--rank-map", f.rank_map, "global ranks: a range 8..23 or a list 8,9,...");
    sub->add_option("--world-size", f.world_size, "world size (default: enough for the ranks)");
    slice = sub->add_option("--slice", slices, "slice dims, e.g. dp,tp (repeatable)");
    flatten = sub->add_option("--flatten", flattens, "flatten (optional name)")
                  ->expected(0, 1)
                  ->default_str("");
    unflatten = sub->add_option("--unflatten", unflattens, "unflatten dim:sizes:names, e.g. tp:2,2:a,b");
  }

  void collect(CLI::App* sub, meshsim::RecipeFlags& f) const {
    std::size_t si = 0, fi = 0, ui = 0;
    for (CLI::Option* opt : sub->parse_order()) {
      if (opt == slice) f.steps.push_back({"slice", slices.at(si++)});
      if (opt == flatten) f.steps.push_back({"flatten", fi < flattens.size() ? flattens[fi++] : ""});
      if (opt == unflatten) f.steps.push_back({"unflatten", unflattens.at(ui++)});
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshsim: device-mesh layout algebra and bookkeeping, testable on a laptop"};
  app.require_subcommand(1);

  auto* query = app.add_subcommand("query", "answer JSON-lines requests (stdin or --file)");
  std::string file;
  bool flush = false;
  query->add_option("-f,--file", file, "read requests from this file instead of stdin");
  query->add_flag("--flush", flush, "flush after every answer (for interactive pipes)");
  int64_t max_elements = meshsim::query::kDefaultMaxAnswerElements;
  query->add_option("--max-elements", max_elements,
                    "element budget of one answer (ranks, values and keys)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));

  auto* show = app.add_subcommand("show", "show a mesh, its per-dim groups and coordinates");
  meshsim::show::Options so;
  RecipeOptions show_recipe;
  show_recipe.add(show, so.recipe);
  show->add_option("--rank", so.recipe.rank, "the rank whose view and groups to show");
  show->add_option("--format", so.format, "text or json")->check(CLI::IsMember({"text", "json"}));
  show->add_option("--max-rows", so.max_rows, "rows printed per table (text)");

  auto* run = app.add_subcommand("run", "simulate every rank over a backend and check the mesh's groups");
  meshsim::run::Options ro;
  RecipeOptions run_recipe;
  run_recipe.add(run, ro.recipe);
  run->add_option("--backend", ro.backend,
                  "threaded (default: one thread per rank) or local (every rank at once in one "
                  "thread, up to 2^24 ranks)");
  run->add_option("--timeout", ro.timeout_seconds, "seconds every wait may take (default 30)");
  run->add_option("--format", ro.format, "text or json");
  run->add_option("--fault", ro.faults, "plant a fault: KIND@RANK, KIND in throw, skip, mismatch, mesh, stall");

  auto* store = app.add_subcommand("store", "serve a TCP rendezvous store (for multi-process and multi-host jobs)");
  meshsim::TcpStoreOptions sto;
  std::string token_file;
  store->add_option("--host", sto.host, "address to bind (default 127.0.0.1, loopback only)");
  store->add_option("--port", sto.port, "port to bind (default 0: any free port, printed)");
  store->add_option("--token-file", token_file, "file whose first line is the token clients must present");

  auto* ops = app.add_subcommand("ops", "list the ops `meshsim query` answers");

  CLI11_PARSE(app, argc, argv);

  std::ios::sync_with_stdio(false);
  if (*query) {
    meshsim::query::set_max_answer_elements(max_elements);
    meshsim::query::RunResult r;
    if (file.empty()) {
      r = meshsim::query::run_lines(std::cin, std::cout, flush);
    } else {
      std::ifstream in(file);
      if (!in) {
        std::cerr << "meshsim query: cannot open '" << file << "'\n";
        return 2;
      }
      in.exceptions(std::ios::badbit);
      r = meshsim::query::run_lines(in, std::cout, flush);
    }
    if (!r.input_ok) std::cerr << "meshsim query: the input could not be read to its end\n";
    return std::cout.good() && r.input_ok ? 0 : 1;
  }
  if (*show) {
    show_recipe.collect(show, so.recipe);  // transformations in command-line order
    try {
      meshsim::show::run(so, std::cout);
    } catch (const meshsim::Error& e) {
      std::cerr << "meshsim show: " << e.type_name() << ": " << e.what() << "\n";
      return 2;
    }
    return 0;
  }
  if (*run) {
    run_recipe.collect(run, ro.recipe);
    try {
      return meshsim::run::run(ro, std::cout);
    } catch (const meshsim::Error& e) {
      std::cerr << "meshsim run: " << e.type_name() << ": " << e.what() << "\n";
      return 2;
    }
  }
  if (*store) {
    try {
      if (!token_file.empty()) {
        std::ifstream in(token_file);
        if (!in || !std::getline(in, sto.token) || sto.token.empty()) {
          throw meshsim::InvalidArgument("--token-file '" + token_file +
                                         "' cannot be read or its first line is empty");
        }
      }
      // Block the stop signals before the server thread starts, then wait for one here.
      sigset_t stop;
      sigemptyset(&stop);
      sigaddset(&stop, SIGINT);
      sigaddset(&stop, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &stop, nullptr);
      meshsim::TcpStoreServer server(sto);
      std::cout << "meshsim store listening on " << server.address() << std::endl;
      int sig = 0;
      sigwait(&stop, &sig);
      server.stop();
      std::cout << "meshsim store stopped (signal " << sig << ")" << std::endl;
      return 0;
    } catch (const meshsim::Error& e) {
      std::cerr << "meshsim store: " << e.type_name() << ": " << e.what() << "\n";
      return 2;
    }
  }
  if (*ops) {
    for (const auto& name : meshsim::query::ops()) std::cout << name << '\n';
  }
  return 0;
}
