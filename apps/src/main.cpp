// meshsim — the command-line tool.
//   meshsim query [--file requests.jsonl]   JSON Lines in, one answer per line (docs/query-and-show.md)
//   meshsim show --mesh dp=2,tp=4 [...]     a mesh, its groups and coordinates
//   meshsim run --mesh dp=2,tp=4 [...]      simulate every rank and check the mesh's groups
//   meshsim store [--host H] [--port P]     serve a TCP rendezvous store until SIGINT/SIGTERM
//   meshsim launch -n N [...] -- prog args  start (or join) a store and N processes
//   meshsim rendezvous                      meet every rank of a launched job through its store
//   meshsim ops                             list the query ops
//   meshsim step --preset torchtitan:... --model llama3-8b ...  one training step's collectives, every rank
//   meshsim step --schedule 1F1B --pp 4 ... a pipeline schedule's sends and receives, checked
//   meshsim trace check DIR [--prefix rank_]  every rank's Flight Recorder dump, checked across ranks
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <new>
#include <fstream>
#include <iostream>
#include <type_traits>
#include <variant>

#include "meshsim/cli_common.hpp"
#include "meshsim/cli_flags.hpp"
#include "meshsim/error.hpp"
#include "meshsim/launch.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/query.hpp"
#include "meshsim/rendezvous.hpp"
#include "meshsim/run.hpp"
#include "meshsim/show.hpp"
#include "meshsim/step_command.hpp"
#include "meshsim/record_command.hpp"
#include "meshsim/trace_command.hpp"
#include "meshsim/store_command.hpp"

namespace {

using meshsim::cli::add_placement;
using meshsim::cli::RecipeOptions;

// TerminalSafe passes text to another stream buffer with the bytes a terminal acts on escaped:
// C0 controls other than newline and tab, and DEL, become "\xHH". PyTorch lets a dim's name be
// any string, so a name holding ESC [ 31 m would otherwise recolour (or retitle, or rewrite)
// the user's terminal when `show`, `run` or `step` print it. JSON output is unchanged: it
// escapes those bytes itself.
class TerminalSafe : public std::streambuf {
 public:
  explicit TerminalSafe(std::streambuf* to) : to_(to) {}

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char ch = traits_type::to_char_type(c);
    return xsputn(&ch, 1) == 1 ? c : traits_type::eof();
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::streamsize start = 0;
    for (std::streamsize i = 0; i < n; ++i) {
      const auto b = static_cast<unsigned char>(s[i]);
      if ((b >= 0x20 && b != 0x7f) || b == '\n' || b == '\t') continue;
      if (to_->sputn(s + start, i - start) != i - start) return start;
      static constexpr char kHex[] = "0123456789abcdef";
      const char esc[4] = {'\\', 'x', kHex[b >> 4], kHex[b & 15]};
      if (to_->sputn(esc, 4) != 4) return i;
      start = i + 1;
    }
    return start + to_->sputn(s + start, n - start) == n ? n : start;
  }
  int sync() override { return to_->pubsync(); }

 private:
  std::streambuf* to_;
};

// flushed flushes `out` (the terminal-safe stream) before a subcommand's status is returned.
int flushed(int status, std::ostream& out) {
  out.flush();
  return status;
}

// guarded runs a subcommand: a meshsim::Error is printed as "meshsim NAME: Type: message" and
// exits 2 (bad usage or input), or 1 where `job_errors` and the error is the job failing (a store
// or peer that cannot be reached, a rank started twice: cli::job_failed); on_error runs first.
template <class F>
int guarded(const char* name, bool job_errors, F&& f, void (*on_error)(const meshsim::Error&) = nullptr) {
  try {
    return f();
  } catch (const meshsim::Error& e) {
    TerminalSafe safe(std::cerr.rdbuf());
    std::ostream err(&safe);
    err << "meshsim " << name << ": " << e.type_name() << ": " << e.what() << "\n";
    err.flush();
    if (on_error) on_error(e);
    return job_errors && meshsim::cli::job_failed(e) ? 1 : 2;
  } catch (const std::bad_alloc&) {
    // The machine ran out of memory for this job: the job failed (exit 1), said as such, never
    // an abort.
    const meshsim::ResourceExhausted e("out of memory (an allocation failed): the job needs more memory than this "
                                       "process may use; run fewer ranks or views per process");
    std::cerr << "meshsim " << name << ": " << e.type_name() << ": " << e.what() << "\n";
    if (on_error) on_error(e);
    return 1;
  }
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
  show->add_flag("--creation-plan", so.creation_plan,
                 "print each rank's process-group calls (new_group, split_group) as PyTorch's DeviceMesh makes them");
  show->add_option("--bound-device", so.bound_device, "with --creation-plan: the default group is bound to a device (true/false)");
  show->add_option("--new-group-use-split-group", so.new_group_use_split_group,
                   "with --creation-plan: torch.distributed.config.new_group_use_split_group (true/false)");
  show->add_option("--use-torchcomms", so.use_torchcomms, "with --creation-plan: torch.distributed.config.use_torchcomms (true/false)");
  show->add_option("--default-backend", so.default_backend, "init_process_group's backend (gloo, nccl, ...)");
  show->add_option("--device-type", so.device_type, "the mesh's device type (cpu, cuda, ...)");
  show->add_option("--torch-version", so.torch_version,
                   "the PyTorch release to answer as: 2.13 or 2.14 (default: the newest modelled)");
  show->add_option("--process-groups", so.process_groups,
                   "with --creation-plan: the program's own new_group / split_group calls, a JSON list or @FILE");
  show->add_option("--max-elements", so.max_elements, "element budget of the JSON answer (ranks, values and keys)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  show->add_option("--color-dim", so.color_dim, "with --svg: the dim whose groups are coloured (default: the last)");

  auto* run = app.add_subcommand("run", "simulate every rank over a backend and check the mesh's groups");
  meshsim::run::Options ro;
  RecipeOptions run_recipe;
  meshsim::cli::add_run_flags(run, ro, run_recipe);

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

  auto* step = app.add_subcommand("step", "check one training step's collectives on every rank (--preset), or a pipeline schedule");
  meshsim::step_command::Options sto_step;
  // An output flag given an empty path is refused, never taken as "not given".
  const CLI::Validator non_empty_path(
      [](const std::string& v) { return v.empty() ? std::string("an output path may not be empty") : std::string(); },
      "PATH");
  // The step's fields, from the one table of them (step_job.hpp): the flags read into the
  // typed spec that `meshsim trace check --against` and Python's meshsim.step fill too.
  for (const meshsim::step::StepField& f : meshsim::step::step_fields()) {
    const std::string flag(f.flag), help(f.help);
    std::visit(
        [&](auto member) {
          auto& field = sto_step.spec.*member;
          if constexpr (std::is_same_v<std::remove_reference_t<decltype(field)>, bool>) {
            step->add_flag_callback(flag, [&field] { field = false; }, help);
          } else {
            step->add_option(flag, field, help);
          }
        },
        f.member);
  }
  step->add_option("--trace", sto_step.trace, "write Chrome/Perfetto trace JSON of the --ranks (or --rank) here")
      ->check(non_empty_path);
  step->add_option("--chakra", sto_step.chakra, "write MLCommons Chakra execution traces PREFIX.<npu>.et and PREFIX.comm_groups.json (for ASTRA-sim)")
      ->check(non_empty_path);
  step->add_option("--chakra-world", sto_step.chakra_world, "the ranks --chakra exports: all, or replica (one data-parallel replica)")
      ->check(CLI::IsMember({"all", "replica"}));
  step->add_flag("--grid", sto_step.grid, "print the pipeline's step x rank grid (always when the schedule deadlocks)");
  step->add_option("--pp", sto_step.pp, "pipeline ranks (without --preset; a CSV: its rows)");
  step->add_option("--dump-schedule", sto_step.dump_schedule, "write the lowered schedule to this CSV file")
      ->check(non_empty_path);
  step->add_option("--format", sto_step.format, "text or json");
  step->add_option("--max-rows", sto_step.max_rows, "schedule steps printed (text)");
  step->add_option("--max-cols", sto_step.max_cols, "schedule ranks printed as grid columns (text; default 64)");

  auto* trace = app.add_subcommand("trace", "traces of real jobs: check PyTorch Flight Recorder dumps across ranks");
  trace->require_subcommand(1);
  auto* trace_check = trace->add_subcommand("check", "read every rank's Flight Recorder dump in DIR and check them across ranks");
  meshsim::trace_command::Options tco;
  trace_check->add_option("dir", tco.dir, "the directory of dumps (one file per rank, <prefix><rank>)")->required();
  trace_check->add_option("--prefix", tco.prefix, "the text before each file's rank (default: the one prefix all files share)");
  trace_check->add_option("--format", tco.format, "text or json")->check(CLI::IsMember({"text", "json"}));
  trace_check->add_option("--against", tco.against,
                          "hold the dumps to the step these `meshsim step` flags plan (\"--preset torchtitan:... --model ...\"), or @FILE holding them");
  trace_check->add_option("--jobs", tco.jobs, "threads that read and decode the dumps (default: this machine's cores; the report is the same)");

  auto* record = app.add_subcommand("record", "run a Python program once per rank over PyTorch's fake backend, record each rank's "
                                               "process groups and collectives as Flight Recorder dumps, and check them across ranks");
  meshsim::record_command::Options rco;
  record->add_option("-n,--nprocs", rco.nprocs, "the world size: ranks the program is run as")->required();
  record->add_option("--ranks", rco.ranks, "record only these ranks (0-3,7; default every rank)");
  record->add_option("--jobs", rco.jobs, "ranks run at once (default: this machine's cores)");
  record->add_option("--out", rco.out, "the directory for the dumps and each rank's output (new or empty; default: a new one under $TMPDIR)");
  record->add_option("--timeout", rco.timeout_seconds, "each rank's deadline in seconds (default 300)");
  record->add_option("--nproc-per-node", rco.nproc_per_node, "LOCAL_WORLD_SIZE: ranks per node (default: the world, one node)");
  record->add_option("--preload", rco.preload, "a module imported before the ranks are forked (repeatable)");
  record->add_flag("--fake-tensors", rco.fake_tensors,
                   "run the program under PyTorch's FakeTensorMode: tensors have shapes and dtypes but no storage, so a model's "
                   "size costs neither memory nor compute (a value read back, .item(), stops the rank naming the call)");
  record->add_option("--format", rco.format, "text or json")->check(CLI::IsMember({"text", "json"}));
  record->add_option("program", rco.program, "python SCRIPT ARGS... (after --)")->expected(-1)->required();

  meshsim::cli::guard_integers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is success; every other parse error is bad usage: exit 2, as for bad values.
    return app.exit(e) == 0 ? 0 : 2;
  }

  std::ios::sync_with_stdio(false);
  TerminalSafe safe_out(std::cout.rdbuf());
  std::ostream out(&safe_out);
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
    return guarded("show", false, [&] { return flushed(meshsim::show::run(so, out), out); });
  }
  if (*run) {
    run_recipe.collect(run, ro.recipe);
    return guarded("run", true, [&] { return flushed(meshsim::run::run(ro, out), out); }, [](const meshsim::Error& e) {
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
  if (*step) return guarded("step", false, [&] { return flushed(meshsim::step_command::run(sto_step, out), out); });
  if (*record) return guarded("record", true, [&] { return flushed(meshsim::record_command::run(rco, out, std::cerr), out); });
  if (*trace_check) return guarded("trace check", false, [&] { return flushed(meshsim::trace_command::run(tco, out), out); });
  if (*ops) {
    for (const auto& name : meshsim::query::ops()) std::cout << name << '\n';
  }
  return 0;
}
