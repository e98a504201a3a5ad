// meshsim — the command-line tool.
//   meshsim query [--file requests.jsonl]   JSON Lines in, one answer per line (DESIGN §7)
//   meshsim show --mesh dp=2,tp=4 [...]     a mesh, its groups and coordinates
//   meshsim run --mesh dp=2,tp=4 [...]      simulate every rank and check the mesh's groups
//   meshsim store [--host H] [--port P]     serve a TCP rendezvous store until SIGINT/SIGTERM
//   meshsim launch -n N [...] -- prog args  start (or join) a store and N processes
//   meshsim rendezvous                      meet every rank of a launched job through its store
//   meshsim ops                             list the query ops
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "meshsim/backend_registry.hpp"
#include "meshsim/cli_common.hpp"
#include "meshsim/error.hpp"
#include "meshsim/launch.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/query.hpp"
#include "meshsim/rendezvous.hpp"
#include "meshsim/run.hpp"
#include "meshsim/show.hpp"
#include "meshsim/store_command.hpp"

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
    sub->add_option("--recipe", f.recipe_file,
                    "a mesh.program JSON file: world size, root, ops with on/let (several views of one root)");
    sub->add_option("--preset", f.preset,
                    "a framework's meshes: torchtitan:pp=2,dp_shard=4,tp=2,ep=2 | torchtitan:FILE.toml | "
                    "megatron:tp=2,pp=2,ep=2,order=tp-cp-ep-dp-pp");
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

// guarded runs a subcommand: a meshsim::Error is printed as "meshsim NAME: Type: message" and
// exits 2 (bad usage or input), or 1 where `job_errors` and the error is the job failing (a store
// or peer that cannot be reached, a rank started twice: cli::job_failed); on_error runs first.
template <class F>
int guarded(const char* name, bool job_errors, F&& f, void (*on_error)(const meshsim::Error&) = nullptr) {
  try {
    return f();
  } catch (const meshsim::Error& e) {
    std::cerr << "meshsim " << name << ": " << e.type_name() << ": " << e.what() << "\n";
    if (on_error) on_error(e);
    return job_errors && meshsim::cli::job_failed(e) ? 1 : 2;
  }
}

// add_placement adds the placement flags `show` and `run` share.
void add_placement(CLI::App* sub, meshsim::placement::Flags& f) {
  sub->add_option("--gpus-per-host", f.gpus_per_host, "GPUs per host: rank r lives on host r / G (reports placement)");
  sub->add_option("--nvlink-domain", f.nvlink_domain, "GPUs per NVLink domain (default: --gpus-per-host)");
  sub->add_option("--require", f.require, "DIM=host or DIM=domain: every group of DIM on one host (repeatable)");
}

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
  add_placement(show, so.placement);
  show->add_option("--svg", so.svg_file, "also draw the mesh to this SVG file (ranks, groups as colours, hosts)");
  show->add_option("--color-dim", so.color_dim, "with --svg: the dim whose groups are coloured (default: the last)");

  auto* run = app.add_subcommand("run", "simulate every rank over a backend and check the mesh's groups");
  meshsim::run::Options ro;
  RecipeOptions run_recipe;
  run_recipe.add(run, ro.recipe);
  std::string backends_help;
  for (const std::string& name : meshsim::backend_names()) {
    backends_help += name + " (" + meshsim::find_backend(name)->description + (name == "threaded" ? ", the default" : "") + "), ";
  }
  run->add_option("--backend", ro.backend,
                  backends_help + "or local (LocalWorld: every rank at once in one thread, up to 2^24 ranks)");
  run->add_option("--timeout", ro.timeout_seconds, "seconds every wait may take (default 30)");
  run->add_option("--format", ro.format, "text or json");
  run->add_option("--fault", ro.faults, "plant a fault: KIND@RANK, KIND in throw, skip, mismatch, mesh, stall, exit");
  add_placement(run, ro.placement);

  auto* store = app.add_subcommand("store", "serve a TCP rendezvous store (for multi-process and multi-host jobs)");
  meshsim::store_command::Options sto;
  store->add_option("--host", sto.server.host, "address to bind (default 127.0.0.1, loopback only)");
  store->add_option("--port", sto.server.port, "port to bind (default 0: any free port, printed)");
  store->add_option("--token-file", sto.token_file, "file whose first line is the token clients must present");

  auto* launch = app.add_subcommand("launch", "start (or join) a store and N processes of a program");
  meshsim::launch::Options lo;
  launch->add_option("-n,--nprocs", lo.nprocs, "processes to start on this host")->required();
  launch->add_option("--store", lo.store, "host:port of a store to join (default: serve one on 127.0.0.1)");
  launch->add_option("--world", lo.world, "world size when several hosts share one store");
  launch->add_option("--rank-offset", lo.rank_offset, "global rank of this host's first process");
  launch->add_option("--token-file", lo.token_file, "file whose first line is the store's token");
  launch->add_option("--timeout", lo.timeout_seconds, "stop every rank after this many seconds (0: none)");
  launch->add_option("--report-grace", lo.report_seconds,
                     "after a rank fails, seconds the others get to report and end before SIGTERM (default 10)");
  launch->add_option("program", lo.program, "the program and its arguments (after --)")->expected(-1)->required();

  auto* rendezvous = app.add_subcommand("rendezvous", "meet every rank of a launched job through its store");
  meshsim::rendezvous::Options rdv;
  rendezvous->add_option("--timeout", rdv.timeout_seconds, "seconds to wait for the other ranks");

  auto* ops = app.add_subcommand("ops", "list the ops `meshsim query` answers");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is success; every other parse error is bad usage: exit 2, as for bad values.
    return app.exit(e) == 0 ? 0 : 2;
  }

  std::ios::sync_with_stdio(false);
  if (*query) {
    meshsim::query::RunResult r;
    if (file.empty()) {
      r = meshsim::query::run_lines(std::cin, std::cout, flush, max_elements);
    } else {
      std::ifstream in(file);
      if (!in) {
        std::cerr << "meshsim query: cannot open '" << file << "'\n";
        return 2;
      }
      in.exceptions(std::ios::badbit);
      r = meshsim::query::run_lines(in, std::cout, flush, max_elements);
    }
    if (!r.input_ok) std::cerr << "meshsim query: the input could not be read to its end\n";
    return std::cout.good() && r.input_ok ? 0 : 1;
  }
  if (*show) {
    show_recipe.collect(show, so.recipe);  // transformations in command-line order
    return guarded("show", false, [&] { return meshsim::show::run(so, std::cout); });
  }
  if (*run) {
    run_recipe.collect(run, ro.recipe);
    return guarded("run", true, [&] { return meshsim::run::run(ro, std::cout); }, [](const meshsim::Error& e) {
      // Under torchrun, say why in the file its agent reads (the rank is named when known).
      if (const char* f = std::getenv("TORCHELASTIC_ERROR_FILE"); f && *f) {
        const char* rank = std::getenv("RANK");
        meshsim::run::write_error_file(f, std::string("meshsim run") + (rank ? " on rank " + std::string(rank) : "") +
                                              ": " + e.type_name() + ": " + e.what());
      }
    });
  }
  if (*store) return guarded("store", false, [&] { return meshsim::store_command::run(sto, std::cout); });
  if (*launch) return guarded("launch", false, [&] { return meshsim::launch::run(lo, std::cout, std::cerr); });
  if (*rendezvous) return guarded("rendezvous", true, [&] { return meshsim::rendezvous::run(rdv, std::cout); });
  if (*ops) {
    for (const auto& name : meshsim::query::ops()) std::cout << name << '\n';
  }
  return 0;
}
