// check_meshes.cpp — the job: engines by name, faults, making a job ready to run (every bad
// input refused before any rank starts), a launched rank's store and its report to the launcher,
// and the report.
#include "meshsim/check_meshes.hpp"
#include "meshsim/json_codec.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "meshsim/backend_registry.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/error.hpp"
#include "meshsim/job_store.hpp"
#include "meshsim/local.hpp"
#include "program.hpp"

namespace meshsim::check {

using detail::Outcome;
using detail::Plan;
namespace checks = detail::checks;

// ---- engines ----

namespace {

constexpr std::string_view kLocal = "local";

EngineEntry local_entry() {
  return EngineEntry{std::string(kLocal), "LocalWorld: every rank at once in one thread, up to 2^24 ranks", true, false,
                     kMaxLocalWorld};
}

}  // namespace

std::vector<EngineEntry> engines() {
  std::vector<EngineEntry> out;
  for (const std::string& name : backend_names()) {
    const BackendEntry* b = find_backend(name);
    if (b) out.push_back(EngineEntry{b->name, b->description, false, b->spans_processes, b->max_rank_threads});
  }
  out.push_back(local_entry());
  return out;
}

std::optional<EngineEntry> find_engine(std::string_view name) {
  if (name == kLocal) return local_entry();
  const BackendEntry* b = find_backend(name);
  if (!b) return std::nullopt;
  return EngineEntry{b->name, b->description, false, b->spans_processes, b->max_rank_threads};
}

std::string engine_names_text() { return backend_names_text() + ", " + std::string(kLocal); }

// ---- faults ----

std::string_view to_string(FaultKind k) {
  switch (k) {
    case FaultKind::kThrow: return "throw";
    case FaultKind::kSkip: return "skip";
    case FaultKind::kMismatch: return "mismatch";
    case FaultKind::kMesh: return "mesh";
    case FaultKind::kStall: return "stall";
    case FaultKind::kExit: return "exit";
    case FaultKind::kReorder: return "reorder";
  }
  return "?";
}

namespace {

// check_fault: the rules of one fault in a world of `world` ranks; `spec` is how it was given.
void check_fault(const Fault& f, int64_t world, const std::string& spec) {
  if (f.rank < 0) throw InvalidArgument("--fault '" + spec + "': rank " + std::to_string(f.rank) + " is negative");
  if (f.rank >= world) {
    throw OutOfRange("--fault '" + spec + "': rank " + std::to_string(f.rank) + " is out of range [0, " +
                     std::to_string(world) + ")");
  }
  if (world == 1 && (f.kind == FaultKind::kSkip || f.kind == FaultKind::kMismatch || f.kind == FaultKind::kExit)) {
    throw InvalidArgument("--fault '" + spec + "' needs at least 2 ranks: with one rank no peer can "
                          "observe a skipped or different collective, or an exit");
  }
}

std::string spelled(const Fault& f) { return std::string(to_string(f.kind)) + "@" + std::to_string(f.rank); }

}  // namespace

std::vector<Fault> parse_faults(const std::vector<std::string>& specs, int64_t world) {
  static const std::map<std::string, FaultKind> kinds{{"throw", FaultKind::kThrow}, {"skip", FaultKind::kSkip},
                                                      {"mismatch", FaultKind::kMismatch}, {"mesh", FaultKind::kMesh},
                                                      {"stall", FaultKind::kStall}, {"exit", FaultKind::kExit},
                                                      {"reorder", FaultKind::kReorder}};
  std::vector<Fault> out;
  for (const std::string& s : specs) {
    constexpr const char* kKinds = "throw, skip, mismatch, mesh, stall, exit, reorder";
    const text::KindAtRank kr = text::kind_at_rank(s, "--fault", kKinds);
    auto it = kinds.find(kr.kind);
    if (it == kinds.end()) {
      throw InvalidArgument("--fault '" + s + "': unknown kind '" + kr.kind + "' (known: " + kKinds + ")");
    }
    const Fault f{it->second, kr.rank};
    check_fault(f, world, s);
    out.push_back(f);
  }
  return out;
}

// ---- making a job ready ----

namespace {

// keep_for_report decides what the report keeps of the groups (Plan::keep_groups, firsts): the
// first kShownGroups per dim, or every group of every mesh and view when that fits the element
// budget; a bigger one is refused before any rank starts, naming the size it would have had.
void keep_for_report(const Job& job, Plan& plan) {
  if (job.max_elements < 1) {
    throw InvalidArgument("--max-elements " + std::to_string(job.max_elements) + " is not >= 1");
  }
  if (job.every_group) {
    std::vector<int64_t> listed(plan.meshes.size(), 1);  // each mesh once, and again per view of it
    for (const View& v : views(plan.recipe)) ++listed[v.step];
    // Every group of every dim (its ranks, once each, and one element per group), saturating.
    auto add = [](int64_t a, int64_t b) { return __builtin_add_overflow(a, b, &a) ? INT64_MAX : a; };
    auto mul = [](int64_t a, int64_t b) { return __builtin_mul_overflow(a, b, &a) ? INT64_MAX : a; };
    int64_t elements = 0;
    for (std::size_t i = 0; i < plan.meshes.size(); ++i) {
      const DeviceMesh& m = plan.meshes[i];
      for (int d = 0; d < m.ndim(); ++d) {
        elements = add(elements, mul(add(m.rank_map_size(), m.rank_map_size() / m.size(d)), listed[i]));
      }
    }
    if (elements > job.max_elements) {
      throw ResourceExhausted("--format json: the report would hold " +
                              (elements == INT64_MAX ? std::string("over 2^63") : std::to_string(elements)) +
                              " elements (every group of every dim of " + std::to_string(plan.meshes.size()) +
                              (plan.meshes.size() == 1 ? " mesh" : " meshes and views") +
                              "), over the answer's budget of " + std::to_string(job.max_elements) +
                              " (raise it with --max-elements, or use --format text, which lists the first " +
                              std::to_string(kShownGroups) + " groups per dim)");
    }
    return;
  }
  plan.keep_groups = kShownGroups;
  for (const DeviceMesh& m : plan.meshes) {
    std::vector<std::vector<int64_t>> dims;
    for (int d = 0; d < m.ndim(); ++d) {
      const GroupTable t = m.group_table_prefix(d, kShownGroups, 1);
      std::vector<int64_t> f;
      for (int64_t g = 0; g < t.count; ++g) f.push_back(t.row(g)[0]);
      std::sort(f.begin(), f.end());
      dims.push_back(std::move(f));
    }
    plan.firsts.push_back(std::move(dims));
  }
}

// memory_limit is what this process may use: the smaller of the machine's RAM, its cgroup's
// memory.max (cgroup v2) and RLIMIT_AS; with the name of the one that binds.
std::pair<uint64_t, std::string> memory_limit() {
  std::pair<uint64_t, std::string> best{static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                            static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE)),
                                        "RAM"};
  if (std::ifstream f("/sys/fs/cgroup/memory.max"); f) {
    std::string v;
    if (f >> v && !v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 20) {
      const uint64_t m = std::stoull(v);
      if (m < best.first) best = {m, "cgroup memory.max"};
    }
  }
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && as.rlim_cur < best.first) {
    best = {static_cast<uint64_t>(as.rlim_cur), "RLIMIT_AS"};
  }
  return best;
}

// check_footprint refuses, before any rank starts, a job whose ranks in this process would
// hold more meshes than the process may use: each rank builds every mesh of the recipe itself,
// as real ranks do (about sizeof(DeviceMesh) each, twice while apply binds the views' names).
void check_footprint(const Plan& plan, int64_t ranks_here) {
  const uint64_t per_mesh = 2 * sizeof(DeviceMesh);
  const auto meshes = static_cast<uint64_t>(plan.meshes.size());
  const auto ranks = static_cast<uint64_t>(ranks_here);
  const auto [limit, bound] = memory_limit();
  if (meshes == 0 || ranks == 0 || ranks <= limit / meshes / per_mesh) return;
  const double need = static_cast<double>(ranks) * static_cast<double>(meshes) * static_cast<double>(per_mesh);
  const auto gib = [](double b) {
    std::ostringstream o;
    o.precision(3);
    o << b / double(1 << 30) << " GiB";
    return o.str();
  };
  throw ResourceExhausted("the job's ranks would hold about " + gib(need) + " of meshes (" + std::to_string(ranks) +
                          " ranks x " + std::to_string(meshes) + " meshes x " + std::to_string(per_mesh) +
                          " bytes: each rank builds every mesh of the recipe itself), over the " + gib(double(limit)) +
                          " this process may use (" + bound + "); run fewer views per job, fewer ranks per process "
                          "(meshsim launch), or --backend local");
}

// make_plan checks the job (InvalidArgument naming the value) and builds what the engines run:
// the recipe's meshes, their fingerprints, the faults, the launch.
std::shared_ptr<Plan> make_plan(const Job& job, const EngineEntry& engine, std::vector<std::string>& misplaced) {
  auto held = std::make_shared<Plan>();
  Plan& plan = *held;
  plan.engine = engine.name;
  plan.recipe = job.recipe;
  plan.expected = apply_in(job.recipe, job.origin);
  plan.world = job.recipe.world_size;
  const BackendEntry* backend = engine.lockstep ? nullptr : find_backend(engine.name);
  if (engine.spans_processes) plan.launched = launch_env_from_environment();
  if (backend && backend->precondition) {
    // What the backend needs for the ranks of this process (NCCL: a GPU each).
    if (auto why = backend->precondition(plan.launched ? 1 : plan.world, plan.launched ? plan.launched->local_rank : 0)) {
      throw FailedPrecondition("--backend " + engine.name + ": " + *why);
    }
  }
  if (plan.launched) {
    if (plan.launched->world_size != plan.world) {
      throw InvalidArgument("meshsim run: the launcher's world size " + std::to_string(plan.launched->world_size) +
                            " (" + plan.launched->launcher + ") differs from the mesh's " + std::to_string(plan.world) +
                            " ranks");
    }
    if (plan.launched->store_host.empty()) {
      throw InvalidArgument("meshsim run: launched by " + plan.launched->launcher +
                            " but no store is named (set MESHSIM_STORE=host:port, or MASTER_ADDR and MASTER_PORT)");
    }
  }
  if (!plan.launched && plan.world > engine.max_ranks) {
    if (engine.lockstep) {
      throw InvalidArgument("--world-size " + std::to_string(plan.world) + " is over the " +
                            std::to_string(engine.max_ranks) + " ranks local mode supports");
    }
    throw InvalidArgument("--world-size " + std::to_string(plan.world) + " is over the " +
                          std::to_string(engine.max_ranks) + " ranks one process runs over the " + engine.name +
                          " backend" +
                          (engine.spans_processes ? "; run one rank per process with `meshsim launch -n N -- meshsim run "
                                                    "--backend " + engine.name + " ...`"
                                                  : std::string()) +
                          " (--backend local runs up to 2^24 ranks in one thread)");
  }
  plan.faults = job.faults;
  for (const Fault& f : plan.faults) {
    check_fault(f, plan.world, spelled(f));
    if (engine.lockstep && f.kind == FaultKind::kStall) {
      throw InvalidArgument("--fault stall@" + std::to_string(f.rank) + " does not apply to "
                            "--backend local: every rank runs in one thread, in lockstep, so "
                            "none can stall while the others wait");
    }
    if (engine.lockstep && f.kind == FaultKind::kExit) {
      throw InvalidArgument("--fault exit@" + std::to_string(f.rank) + " does not apply to "
                            "--backend local: no rank has a thread or process of its own to end");
    }
  }
  if (job.timeout.count() <= 0) {
    throw InvalidArgument("the timeout " + std::to_string(job.timeout.count()) + " ms is not > 0");
  }
  plan.timeout = job.timeout;
  if (job.stack_bytes != 0 && (job.stack_bytes < kMinStackBytes || job.stack_bytes > kMaxStackBytes)) {
    throw InvalidArgument("a rank stack of " + std::to_string(job.stack_bytes) + " bytes is out of range [" +
                          std::to_string(kMinStackBytes) + ", " + std::to_string(kMaxStackBytes) + "]");
  }
  plan.stack_bytes = job.stack_bytes;
  plan.interrupted = job.interrupted;
  plan.meshes.push_back(plan.expected->root);
  plan.meshes.insert(plan.meshes.end(), plan.expected->meshes.begin(), plan.expected->meshes.end());
  for (const DeviceMesh& m : plan.meshes) plan.parts.push_back(mesh_parts(m));
  plan.expected_checks = checks::total(plan.meshes);
  // The process-group calls PyTorch's DeviceMesh makes for the recipe: a configuration PyTorch
  // refuses (a backend that cannot split) is refused before any rank starts.
  plan.creation = std::make_shared<const CreationPlan>(creation_plan(plan.recipe, *plan.expected));
  plan.creation_events = plan.expected->root.creation_log_digest();
  for (const Fault& f : plan.faults) {
    if (f.kind != FaultKind::kReorder) continue;
    const std::size_t made = creation_order(*plan.creation).size();
    if (made < 2) {
      throw InvalidArgument("--fault reorder@" + std::to_string(f.rank) + " needs a recipe whose ranks create the groups "
                            "of at least two dims (this one creates " + std::to_string(made) + ")");
    }
  }
  if (!engine.lockstep) check_footprint(plan, plan.launched ? 1 : plan.world);
  keep_for_report(job, plan);
  if (job.hosts) {
    placement::check_required(*job.hosts, plan.meshes);
    misplaced = placement::violations(*job.hosts, plan.meshes);
  }
  return held;
}

// join_job_store joins (or, as rank 0 under torchrun-style variables, serves) a launched job's
// store and claims this process's rank in it; returns the store this process serves, if any.
std::shared_ptr<TcpStoreServer> join_job_store(Plan& plan) {
  const LaunchEnv& env = *plan.launched;
  // meshsim launch serves its own store; under torchrun's agent the agent's PyTorch TCPStore
  // is joined; otherwise rank 0 serves one at MASTER_ADDR:MASTER_PORT (join_launch_store).
  LaunchStore joined = launch::join_store(env, plan.timeout);
  plan.store = std::move(joined.store);
  plan.wills = joined.meshsim;
  plan.prefix += env.scope;  // one namespace per run (and, under torchrun, per attempt)
  // One process per rank and run: a second process with this rank (a duplicate RANK), or a
  // store that still holds this run's keys from an earlier job, is refused at once. The claim
  // ("<host> <pid>") also lets peers on this host name this rank if its process dies, on a
  // store without wills (PyTorch's) too.
  claim_rank(*plan.store, plan.prefix + "/rank/" + std::to_string(env.rank), env);
  // If this process dies, meshsim's store tells the others which rank it was.
  if (plan.wills) plan.wills->set_will(plan.prefix + "/exit/" + std::to_string(env.rank), "its process ended");
  return std::shared_ptr<TcpStoreServer>(std::move(joined.hosted));
}

// report_to_launcher writes a failed launched rank's diagnosis where torchrun's agent reads it.
void report_to_launcher(const Plan& plan, const Outcome& r, std::chrono::system_clock::time_point started) {
  std::string text;
  bool culprit = false;  // this rank is one the diagnosis names
  for (const Diagnosis& d : r.failures) {
    text += (text.empty() ? "" : "\n") + std::string("rank ") + (d.ranks.empty() ? "?" : std::to_string(d.ranks[0])) +
            " [" + std::string(to_string(d.kind)) + "]: " + d.message;
    culprit = culprit || std::find(d.ranks.begin(), d.ranks.end(), plan.launched->rank) != d.ranks.end();
  }
  for (const RankReport& s : r.stuck) text += "\nrank " + std::to_string(s.rank) + " [stuck]: " + s.message;
  // torchrun's Root Cause is the failure with the earliest timestamp (whole seconds, ties to
  // the lowest local rank), and a faulty rank may learn of its own fault after its peers (a
  // rank that skipped a collective hears it from them). So a faulty rank dates its report at
  // the start of its run, and a rank that only observed another's fault at least two seconds
  // after the start of its own: ranks start within a second of each other under a launcher,
  // so the report torchrun shows first is the faulty rank's own.
  const auto secs = [](std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
  };
  const int64_t stamp = culprit ? secs(started) : std::max(secs(std::chrono::system_clock::now()), secs(started) + 2);
  write_error_file(plan.launched->error_file,
                   "meshsim run: rank " + std::to_string(plan.launched->rank) + " of " + std::to_string(plan.world) +
                       " failed: " + text,
                   stamp);
  // The dates only order the failures torchrun has seen when it looks: once one worker has failed
  // it stops the rest, and a faulty rank stopped before its report was written is no failure of
  // record. So a faulty rank announces its report on the job's store, and a rank that only
  // observed the fault leaves after that announcement (and a moment for torchrun to see the
  // faulty process end), or after a bounded wait. A rank whose process died announces nothing:
  // its own exit is already the first failure.
  const std::string reported = plan.prefix + "/reported/";
  try {
    if (culprit) {
      plan.store->set(reported + std::to_string(plan.launched->rank), "1");
      return;
    }
    std::vector<std::string> keys;
    for (const Diagnosis& d : r.failures) {
      const bool alive = d.kind == DiagnosisKind::kError || d.kind == DiagnosisKind::kMismatch ||
                         d.kind == DiagnosisKind::kDeparted || d.kind == DiagnosisKind::kMesh;
      if (alive && !d.ranks.empty() && d.ranks[0] != plan.launched->rank) {
        keys.push_back(reported + std::to_string(d.ranks[0]));
      }
    }
    if (keys.empty()) return;
    plan.store->wait(keys, std::min<std::chrono::milliseconds>(plan.timeout, std::chrono::seconds(5)));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  } catch (const std::exception&) {
    // The store is gone or the faulty rank never reported: leave now, the wait was bounded.
  }
}

}  // namespace

void write_error_file(const std::string& path, const std::string& message, std::optional<int64_t> timestamp) {
  // The form torchrun's ErrorHandler writes and its ProcessFailure reads: the root cause is the
  // failure with the smallest timestamp; it prints extraInfo.py_callstack as the traceback.
  const int64_t now = timestamp.value_or(std::chrono::duration_cast<std::chrono::seconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  using Json = nlohmann::json;
  const Json j{{"message",
                {{"message", "MeshsimRunFailure: " + message},
                 {"extraInfo", {{"py_callstack", message}, {"timestamp", std::to_string(now)}}}}}};
  std::ofstream f(path, std::ios::trunc);
  f << json::output_text(j) << "\n";
  if (!f) std::cerr << "meshsim run: cannot write the error file " << quote_input(path) << " for the launcher\n";
}

MeshCheckReport check_meshes(const Job& job) {
  const auto started = std::chrono::system_clock::now();
  const std::optional<EngineEntry> engine = find_engine(job.engine);
  if (!engine) {
    throw InvalidArgument("--backend '" + job.engine + "' is not available (known: " + engine_names_text() + ")");
  }
  MeshCheckReport report;
  std::shared_ptr<Plan> held = make_plan(job, *engine, report.misplaced);
  Plan& plan = *held;
  if (plan.launched) plan.hosted = join_job_store(plan);
  Outcome r = engine->lockstep ? detail::run_local(plan) : detail::run_ranks(held);
  if (plan.hosted && r.ok) {
    // Serve until every rank has seen the end (bounded: a rank that died meanwhile is not awaited).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until && plan.store->add(plan.prefix + "/left", 0) < plan.world) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (!r.ok && plan.launched && !plan.launched->error_file.empty()) report_to_launcher(plan, r, started);
  report.ok = r.ok;
  report.engine = engine->name;
  report.world_size = plan.world;
  report.failures = std::move(r.failures);
  report.stuck = std::move(r.stuck);
  report.checks = r.checks;
  report.expected_checks = plan.expected_checks;
  if (plan.launched && (r.own || !r.ok)) report.expected_checks = checks::of_rank(plan.meshes, plan.launched->rank);
  report.collectives = r.collectives;
  report.seconds = r.seconds;
  report.meshes = plan.meshes;
  for (const StepSpec& s : plan.recipe.steps) report.step_names.push_back(s.let);
  report.views = views(plan.recipe);
  report.warnings = plan.expected->warnings;
  report.seen = std::move(r.seen);
  report.hosts = job.hosts;
  if (plan.launched) {
    report.rank = plan.launched->rank;
    report.launcher = plan.launched->launcher;
  }
  report.own = r.own;
  return report;
}

}  // namespace meshsim::check
