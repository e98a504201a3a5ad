// meshsim — the command-line tool.
//   meshsim query [--file requests.jsonl]   JSON Lines in, one answer per line (DESIGN §7)
//   meshsim show --mesh dp=2,tp=4 [...]     a mesh, its groups and coordinates
//   meshsim run --mesh dp=2,tp=4 [...]      simulate every rank and check the mesh's groups
//   meshsim store [--host H] [--port P]     serve a TCP rendezvous store until SIGINT/SIGTERM
//   meshsim launch -n N [...] -- prog args  start (or join) a store and N processes
//   meshsim rendezvous                      meet every rank of a launched job through its store
//   meshsim ops                             list the query ops
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <unistd.h>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "meshsim/backend_registry.hpp"
#include "meshsim/error.hpp"
#include "meshsim/launch.hpp"
#include "meshsim/launch_env.hpp"
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
  std::string backends_help;
  for (const std::string& name : meshsim::backend_names()) {
    backends_help += name + " (" + meshsim::find_backend(name)->description + (name == "threaded" ? ", the default" : "") + "), ";
  }
  run->add_option("--backend", ro.backend,
                  backends_help + "or local (LocalWorld: every rank at once in one thread, up to 2^24 ranks)");
  run->add_option("--timeout", ro.timeout_seconds, "seconds every wait may take (default 30)");
  run->add_option("--format", ro.format, "text or json");
  run->add_option("--fault", ro.faults, "plant a fault: KIND@RANK, KIND in throw, skip, mismatch, mesh, stall, exit");

  auto* store = app.add_subcommand("store", "serve a TCP rendezvous store (for multi-process and multi-host jobs)");
  meshsim::TcpStoreOptions sto;
  std::string token_file;
  store->add_option("--host", sto.host, "address to bind (default 127.0.0.1, loopback only)");
  store->add_option("--port", sto.port, "port to bind (default 0: any free port, printed)");
  store->add_option("--token-file", token_file, "file whose first line is the token clients must present");

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
  double rdv_timeout = 60;
  rendezvous->add_option("--timeout", rdv_timeout, "seconds to wait for the other ranks");

  auto* ops = app.add_subcommand("ops", "list the ops `meshsim query` answers");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is success; every other parse error is bad usage: exit 2, as for bad values.
    return app.exit(e) == 0 ? 0 : 2;
  }

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
      // Under torchrun, say why in the file its agent reads (the rank is named when known).
      if (const char* f = std::getenv("TORCHELASTIC_ERROR_FILE"); f && *f) {
        const char* rank = std::getenv("RANK");
        meshsim::run::write_error_file(f, std::string("meshsim run") + (rank ? " on rank " + std::string(rank) : "") +
                                              ": " + e.type_name() + ": " + e.what());
      }
      // A store or peer that cannot be reached, or a rank started twice, is the job failing (1),
      // not bad usage (2).
      const std::string type = e.type_name();
      return type == "Unavailable" || type == "DeadlineExceeded" || type == "AlreadyExists" ? 1 : 2;
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
  if (*launch) {
    try {
      return meshsim::launch::run(lo, std::cout, std::cerr);
    } catch (const meshsim::Error& e) {
      std::cerr << "meshsim launch: " << e.type_name() << ": " << e.what() << "\n";
      return 2;
    }
  }
  if (*rendezvous) {
    try {
      const auto env = meshsim::launch_env_from_environment();
      if (!env || env->store_host.empty()) {
        throw meshsim::FailedPrecondition("not launched: no MESHSIM_RANK/RANK/OMPI_COMM_WORLD_RANK "
                                          "with a store (MESHSIM_STORE or MASTER_ADDR/MASTER_PORT)");
      }
      if (!(rdv_timeout > 0) || rdv_timeout > 86400) {
        throw meshsim::InvalidArgument("--timeout " + std::to_string(rdv_timeout) + " is not in (0, 86400]");
      }
      const char* token = std::getenv("MESHSIM_STORE_TOKEN");
      const std::chrono::milliseconds deadline(static_cast<int64_t>(rdv_timeout * 1000));
      std::optional<meshsim::StoreProtocol> forced;
      if (const char* p = std::getenv("MESHSIM_TORCH_STORE_PROTOCOL"); p && *p) forced = meshsim::parse_store_protocol(p);
      meshsim::LaunchStore joined = meshsim::join_launch_store(*env, deadline, token ? token : "", forced);
      meshsim::Store& store = *joined.store;
      const std::string prefix = "rendezvous" + env->scope;
      // One process per rank: a duplicate rank, or a store holding an earlier rendezvous, fails.
      meshsim::claim_rank(store, prefix + "/" + std::to_string(env->rank), *env);
      std::vector<std::string> keys;
      for (int64_t r = 0; r < env->world_size; ++r) keys.push_back(prefix + "/" + std::to_string(r));
      store.wait(keys, deadline);
      const int64_t arrived = store.add(prefix + "/arrived", 1);
      if (arrived > env->world_size) {
        throw meshsim::AlreadyExists("arrival " + std::to_string(arrived) + " at " + env->store_host + ":" +
                                     std::to_string(env->store_port) + " is above the world size " +
                                     std::to_string(env->world_size) + ": extra processes, or an earlier rendezvous");
      }
      if (joined.hosted) {
        // This process serves the store: it stays until every rank has arrived (bounded).
        const auto until = std::chrono::steady_clock::now() + deadline;
        while (store.add(prefix + "/arrived", 0) < env->world_size && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      std::cout << "rank " << env->rank << " of " << env->world_size << " (" << env->launcher
                << "): met every rank through " << env->store_host << ":" << env->store_port
                << " (arrival " << arrived << ")" << std::endl;
      return 0;
    } catch (const meshsim::Error& e) {
      std::cerr << "meshsim rendezvous: " << e.type_name() << ": " << e.what() << "\n";
      const std::string type = e.type_name();
      return type == "DeadlineExceeded" || type == "Unavailable" || type == "AlreadyExists" ? 1 : 2;
    }
  }
  if (*ops) {
    for (const auto& name : meshsim::query::ops()) std::cout << name << '\n';
  }
  return 0;
}
