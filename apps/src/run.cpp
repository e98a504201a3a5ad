#include "meshsim/run.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "meshsim/job_store.hpp"
#include "meshsim/error.hpp"
#include "meshsim/launch_env.hpp"
#include "meshsim/local.hpp"
#include "meshsim/nccl_api.hpp"
#include "meshsim/launched.hpp"
#include "meshsim/spmd.hpp"

namespace meshsim::run {

namespace {

using Json = nlohmann::json;

enum class Fault { kThrow, kSkip, kMismatch, kMesh, kStall, kExit };

struct Planted {
  Fault kind;
  int64_t rank;
};

std::vector<Planted> parse_faults(const std::vector<std::string>& specs, int64_t world) {
  static const std::map<std::string, Fault> kinds{{"throw", Fault::kThrow}, {"skip", Fault::kSkip},
                                                  {"mismatch", Fault::kMismatch},
                                                  {"mesh", Fault::kMesh}, {"stall", Fault::kStall},
                                                  {"exit", Fault::kExit}};
  std::vector<Planted> out;
  for (const std::string& s : specs) {
    const auto at = s.find('@');
    if (at == std::string::npos) throw InvalidArgument("--fault '" + s + "' is not KIND@RANK");
    const std::string kind = s.substr(0, at);
    auto it = kinds.find(kind);
    if (it == kinds.end()) {
      throw InvalidArgument("--fault '" + s + "': unknown kind '" + kind +
                            "' (known: throw, skip, mismatch, mesh, stall, exit)");
    }
    const std::string rank_text = s.substr(at + 1);
    std::size_t used = 0;
    int64_t rank = -1;
    try {
      rank = std::stoll(rank_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (rank_text.empty() || used != rank_text.size() || !std::isdigit(static_cast<unsigned char>(rank_text[0]))) {
      throw InvalidArgument("--fault '" + s + "': '" + rank_text + "' is not a rank");
    }
    if (rank >= world) {
      throw OutOfRange("--fault '" + s + "': rank " + std::to_string(rank) + " is out of range [0, " +
                       std::to_string(world) + ")");
    }
    if (world == 1 && (it->second == Fault::kSkip || it->second == Fault::kMismatch || it->second == Fault::kExit)) {
      throw InvalidArgument("--fault '" + s + "' needs at least 2 ranks: with one rank no peer can "
                            "observe a skipped or different collective, or an exit");
    }
    out.push_back({it->second, rank});
  }
  return out;
}

bool planted(const std::vector<Planted>& f, Fault kind, int64_t rank) {
  for (const Planted& p : f) {
    if (p.kind == kind && p.rank == rank) return true;
  }
  return false;
}

// different_recipe is what a rank with a `mesh` fault builds: the same mesh over a reversed
// rank map (or, with one rank, with renamed dims).
MeshRecipe different_recipe(MeshRecipe r, const DeviceMesh& root) {
  std::vector<int64_t> ranks = root.rank_map();
  if (ranks.size() > 1) {
    std::reverse(ranks.begin(), ranks.end());
    r.root.kind = RootSpec::Kind::kRanks;
    r.root.ranks = std::move(ranks);
  } else {
    if (!r.root.names) r.root.names = std::vector<std::string>(r.root.shape.size(), "");
    for (std::size_t i = 0; i < r.root.names->size(); ++i) (*r.root.names)[i] += "_planted" + std::to_string(i);
    r.steps.clear();
  }
  return r;
}



// Outcome is what a run reports, whatever the backend.
struct Outcome {
  bool ok = true;
  std::vector<Diagnosis> failures;   // one per rank at fault
  std::vector<RankReport> stuck;
  int64_t checks = 0;
  int64_t collectives = 0;
  double seconds = 0;
  // seen[mesh][dim]: the groups as gathered over the backend, in m.groups(d) order (when ok).
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> seen;
  // own: a launched rank's report of its own groups only (rank 0 reports the whole job).
  bool own = false;
};

// Job is what both programs run: the recipe, the meshes it makes, the planted faults.
struct Job {
  MeshRecipe recipe;
  std::optional<BuiltMeshes> expected;
  std::vector<DeviceMesh> meshes;  // root, then one per step
  std::vector<MeshParts> parts;
  int64_t world = 0;
  int64_t expected_checks = 0;
  std::vector<Planted> faults;
  std::chrono::milliseconds timeout{0};
  // Ranks over the backend: threaded or gloo; one rank of a launched job (gloo) has a store.
  std::string backend = "threaded";
  std::optional<LaunchEnv> launched;
  std::shared_ptr<Store> store;
  TcpStoreClient* wills = nullptr;  // the store when it is meshsim's: it publishes a crashed rank
  std::string prefix = "meshsim/run";
  std::optional<placement::Hosts> hosts;  // --gpus-per-host
  std::vector<std::string> misplaced;     // broken --require, one line each
  // The report keeps, per dim, the first keep_groups groups as gathered (what it prints: 8 in
  // text, every group in JSON within the element budget); firsts[mesh][dim] are their first
  // members, ascending, the only ranks that keep a copy (empty: every group is kept).
  int64_t keep_groups = INT64_MAX;
  std::vector<std::vector<std::vector<int64_t>>> firsts;
  std::function<bool()> interrupted;  // Options::interrupted
  std::size_t stack_bytes = 0;        // --rank-stack-kib (0: the runner's default)

  // keeps says whether `rank` keeps the group it gathered on dim d of mesh i for the report: a
  // launched rank keeps its own (it reports them); else only a kept group's first member.
  bool keeps(std::size_t i, int d, int64_t rank, std::span<const int64_t> group) const {
    if (launched) return true;
    if (group.empty() || group[0] != rank) return false;
    if (firsts.empty()) return true;
    const std::vector<int64_t>& f = firsts[i][static_cast<std::size_t>(d)];
    return std::binary_search(f.begin(), f.end(), rank);
  }
};

// kShownGroups is how many groups per dim a text report prints; kListedRanks how many ranks a
// report lists for one diagnosis (FAILED lines of one message, JSON failures, a stall's waiting
// and missing ranks), the rest counted.
constexpr std::size_t kListedRanks = 64;
constexpr int64_t kShownGroups = 8;

// The checks of a run, written once: what each expects and how its failure reads. The per-rank
// program (run_ranks) and the local program (run_local) both run exactly these, in this order:
//   1. the world: all_reduce(sum) of (rank, 1) over every rank gives (world(world-1)/2, world);
//   2. every mesh: the ranks agree on it (its fingerprints, against the recipe's);
//   3. per mesh a rank belongs to, per dim, kPerDim checks: its communicator holds the dim's
//      group, an all_gather of ranks returns the group, an all_reduce(sum) of rank+1 gives
//      group_sum; a planted throw fires after the root mesh's checks;
//   4. global agreement: all_reduce(sum) of every rank's check count gives total().
namespace checks {

constexpr int64_t kPerDim = 3;

std::string where(std::size_t mesh, const DeviceMesh& m, int d) {
  return "mesh " + std::to_string(mesh) + " " + m.to_string() + " dim " + m.dim_name(d);
}

int64_t group_sum(std::span<const int64_t> group) {
  int64_t want = 0;
  for (int64_t g : group) want += g + 1;
  return want;
}

// of_rank: the checks `rank` runs; total: every rank's.
int64_t of_rank(const std::vector<DeviceMesh>& meshes, int64_t rank) {
  int64_t n = 0;
  for (const DeviceMesh& m : meshes) n += m.contains(rank) ? kPerDim * m.ndim() : 0;
  return n;
}
int64_t total(const std::vector<DeviceMesh>& meshes) {
  int64_t n = 0;
  for (const DeviceMesh& m : meshes) n += kPerDim * m.ndim() * m.rank_map_size();
  return n;
}

std::string world_wrong(int64_t rank_sum, int64_t count) {
  return "world all_reduce of (rank, 1) gave (" + std::to_string(rank_sum) + ", " + std::to_string(count) + ")";
}
bool world_right(int64_t world, int64_t rank_sum, int64_t count) { return rank_sum == world * (world - 1) / 2 && count == world; }

std::string members_wrong(const std::string& where, std::span<const int64_t> held, std::span<const int64_t> group) {
  return where + ": the communicator holds " + format_ranks(held) + ", the mesh says " + format_ranks(group);
}
std::string gathered_wrong(const std::string& where, std::span<const int64_t> got, std::span<const int64_t> group) {
  return where + ": all_gather of ranks returned " + format_ranks(got) + ", the mesh says " + format_ranks(group);
}
std::string sum_wrong(const std::string& where, int64_t got, int64_t want) {
  return where + ": all_reduce(sum) of rank+1 gave " + std::to_string(got) + ", expected " + std::to_string(want);
}
std::string agreement_wrong(int64_t total, int64_t expected) {
  return "global agreement: ranks ran " + std::to_string(total) + " checks, the recipe predicts " + std::to_string(expected);
}
std::string planted_throw(int64_t rank) { return "planted fault: rank " + std::to_string(rank) + " throws mid-run"; }

}  // namespace checks

// RankResult is what one rank produces: the checks it passed and the groups it gathered
// (seen[mesh][dim]), as far as it got.
struct RankResult {
  int64_t checks = 0;
  std::vector<std::vector<std::vector<int64_t>>> seen;
};

// rank_program is one rank's part of the run (the checks above over its communicators).
void rank_program(const Job& job, RankContext& ctx, RankResult& out) {
  const std::vector<Planted>& faults = job.faults;
  const int64_t me = ctx.rank(), world = job.world;
  if (planted(faults, Fault::kStall, me)) ctx.sleep_for(job.timeout + std::chrono::seconds(2));
  // Every rank builds the recipe itself, as real ranks do.
  BuiltMeshes built = planted(faults, Fault::kMesh, me) ? meshsim::apply(different_recipe(job.recipe, job.expected->root))
                                                        : meshsim::apply(job.recipe);
  // The rank checks its meshes in recipe order (root first) without copying them: a mesh is
  // about a kilobyte, and 1,024 ranks of 1,024 views held three copies each.
  built.handles.clear();
  std::vector<const DeviceMesh*> mine{&built.root};
  for (const DeviceMesh& m : built.meshes) mine.push_back(&m);
  {
    std::vector<int64_t> v{me, 1};
    if (planted(faults, Fault::kMismatch, me)) v.push_back(0);  // the planted mismatch: another count
    ctx.world().all_reduce(v.data(), static_cast<int64_t>(v.size()), DType::kInt64, ReduceOp::kSum);
    if (!checks::world_right(world, v[0], v[1])) ctx.fail(checks::world_wrong(v[0], v[1]));
  }
  // The planted exit: the rank dies while the others are in the next collective.
  if (planted(faults, Fault::kExit, me)) ctx.exit_abruptly();
  for (std::size_t i = 0; i < mine.size(); ++i) ctx.check_mesh_agreement(*mine[i], job.parts[i]);
  out.seen.resize(mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const DeviceMesh& m = *mine[i];
    if (!m.contains(me)) continue;
    for (int d = 0; d < m.ndim(); ++d) {
      Communicator& c = ctx.comm(m, d);
      const std::string where = checks::where(i, m, d);
      {
        const std::vector<int64_t> expected = *m.group_of(me, d);
        if (c.global_ranks() != expected) ctx.fail(checks::members_wrong(where, c.global_ranks(), expected));
      }
      // From here the communicator's own (shared) member list is the group: a rank waiting in a
      // collective of 16,384 ranks holds its output, not a second copy of the members too.
      const std::vector<int64_t>& group = c.global_ranks();
      std::vector<int64_t> got(group.size());
      c.all_gather(std::span<const int64_t>(&me, 1), std::span<int64_t>(got));
      if (got != group) ctx.fail(checks::gathered_wrong(where, got, group));
      int64_t sum = me + 1;
      c.all_reduce(std::span<int64_t>(&sum, 1), ReduceOp::kSum);
      if (sum != checks::group_sum(group)) ctx.fail(checks::sum_wrong(where, sum, checks::group_sum(group)));
      out.checks += checks::kPerDim;
      // A rank keeps what the report shows, not a copy of every group of every view.
      out.seen[i].push_back(job.keeps(i, d, me, group) ? std::move(got) : std::vector<int64_t>{});
    }
    if (i == 0 && planted(faults, Fault::kThrow, me)) throw Internal(checks::planted_throw(me));
  }
  if (planted(faults, Fault::kThrow, me)) throw Internal(checks::planted_throw(me));
  // Global agreement: every rank's check count sums to what the recipe predicts.
  if (planted(faults, Fault::kSkip, me)) return;
  int64_t total = out.checks;
  ctx.world().all_reduce(std::span<int64_t>(&total, 1), ReduceOp::kSum);
  if (total != job.expected_checks) ctx.fail(checks::agreement_wrong(total, job.expected_checks));
}

// by_group lays the ranks' views out as Outcome::seen: per mesh, per dim, each group as its
// first member saw it (view(r) is rank r's seen, or null where nothing was gathered).
template <class View>
void by_group(const Job& job, Outcome& out, View view) {
  for (std::size_t i = 0; i < job.meshes.size(); ++i) {
    const DeviceMesh& m = job.meshes[i];
    std::vector<std::vector<std::vector<int64_t>>> dims;
    for (int d = 0; d < m.ndim(); ++d) {
      std::vector<std::vector<int64_t>> rows;
      const GroupTable t = m.group_table_prefix(d, job.keep_groups, 1);
      for (int64_t g = 0; g < t.count; ++g) {
        const auto* s = view(t.row(g)[0]);
        rows.push_back(s && i < s->size() && static_cast<std::size_t>(d) < (*s)[i].size() ? (*s)[i][static_cast<std::size_t>(d)]
                                                                                          : std::vector<int64_t>{});
      }
      dims.push_back(std::move(rows));
    }
    out.seen.push_back(std::move(dims));
  }
}

// run_ranks runs rank_program on every rank over the backend (this process's ranks; one, for a
// launched job, which then ends through finish_launched).
// run_ranks runs the job's ranks; they hold the job through `held`, so a rank left detached
// (stuck) never reads a job that is gone.
Outcome run_ranks(const std::shared_ptr<const Job>& held) {
  const Job& job = *held;
  SpmdOptions so;
  so.world_size = job.world;
  so.timeout = job.timeout;
  so.backend = job.backend;
  so.store_prefix = job.prefix;
  so.interrupted = job.interrupted;
  so.stack_bytes = job.stack_bytes;
  if (job.launched) {
    so.first_rank = job.launched->rank;
    so.local_ranks = 1;
    so.store = job.store;
    so.local_rank = job.launched->local_rank;
  }
  SpmdResults<RankResult> run =
      run_spmd_results<RankResult>(so, [held](RankContext& ctx, RankResult& out) { rank_program(*held, ctx, out); });
  Outcome out;
  out.ok = run.report.ok;
  out.failures = run.report.failures;
  for (const RankReport& r : run.report.ranks) {
    if (r.status == RankStatus::kStuck) out.stuck.push_back(r);
  }
  for (const auto& r : run.results) out.checks += r ? r->checks : 0;
  out.collectives = run.report.collectives;
  out.seconds = run.report.seconds;
  if (!job.launched) {
    if (out.ok) by_group(job, out, [&](int64_t r) { return &run.results[static_cast<std::size_t>(r)]->seen; });
    return out;
  }
  // One rank of a launched job: rank 0 reports the whole job as a threaded run would, the
  // others their own groups.
  const int64_t me = job.launched->rank;
  std::optional<std::string> mine;
  if (out.ok && run.results[0]) {
    mine = nlohmann::json{{"checks", run.results[0]->checks}, {"collectives", run.report.collectives},
                          {"seen", run.results[0]->seen}}.dump();
  }
  LaunchedJob lj{job.store, job.prefix, job.world, me, job.timeout, [&job] {
                   if (job.wills) job.wills->clear_will();  // an exit from here on is no crash
                 }};
  LaunchedEnd end = finish_launched(lj, run.report, mine);
  out.ok = end.ok;
  out.failures = end.failures;
  if (!out.ok) return out;
  if (me != 0) {
    out.own = true;
    for (std::size_t i = 0; i < job.meshes.size(); ++i) {
      std::vector<std::vector<std::vector<int64_t>>> dims;
      for (int d = 0; d < job.meshes[i].ndim(); ++d) {
        const auto& seen = run.results[0]->seen;
        if (i < seen.size() && static_cast<std::size_t>(d) < seen[i].size()) dims.push_back({seen[i][static_cast<std::size_t>(d)]});
        else dims.push_back({});
      }
      out.seen.push_back(std::move(dims));
    }
    return out;
  }
  std::vector<RankResult> all(static_cast<std::size_t>(job.world));
  try {
    out.checks = 0;
    out.collectives = 0;
    for (int64_t r = 0; r < job.world; ++r) {
      const Json j = Json::parse(end.results[static_cast<std::size_t>(r)]);
      out.checks += j.at("checks").get<int64_t>();
      out.collectives += j.at("collectives").get<int64_t>();
      all[static_cast<std::size_t>(r)].seen = j.at("seen").get<std::vector<std::vector<std::vector<int64_t>>>>();
    }
  } catch (const std::exception& e) {
    out.ok = false;
    out.failures.push_back(Diagnosis{DiagnosisKind::kError, {me}, std::string("rank 0 could not read every rank's result: ") + e.what(), {}, {}});
    return out;
  }
  by_group(job, out, [&](int64_t r) { return &all[static_cast<std::size_t>(r)].seen; });
  return out;
}

// fail_check stops local mode the way RankContext::fail stops a rank; planted_throw the way a
// rank's uncaught exception does.
[[noreturn]] void fail_check(int64_t rank, const std::string& message) {
  throw LocalFailure(Diagnosis{DiagnosisKind::kCheck, {rank}, "rank " + std::to_string(rank) + ": " + message, {}, {}});
}
[[noreturn]] void planted_throw(int64_t rank) {
  throw LocalFailure(Diagnosis{DiagnosisKind::kError, {rank},
                               "rank " + std::to_string(rank) + " failed: Internal: " + checks::planted_throw(rank), {}, {}});
}

// local_dim_checks runs the checks of dim d of mesh i for every rank at once; returns the dim's
// groups as all_gather returned them.
std::vector<std::vector<int64_t>> local_dim_checks(LocalWorld& w, const DeviceMesh& m, std::size_t i, int d,
                                                    Outcome& out) {
  const int64_t world = w.size();
  const auto rank_value = LocalValue<int64_t>::affine(world, 0, 1);
  auto groups = std::make_shared<const LocalGroups>(m, d);
  const std::string where = checks::where(i, m, d);
  // Each rank's own view of its group (its coordinate) against the dim's groups.
  for (int64_t g = 0; g < groups->count(); ++g) {
    std::span<const int64_t> members = groups->group(g);
    std::vector<int64_t> anchor = *m.coordinate(members[0]);
    for (std::size_t k = 0; k < members.size(); ++k) {
      std::vector<int64_t> c = *m.coordinate(members[k]);
      const bool same_line = c[static_cast<std::size_t>(d)] == static_cast<int64_t>(k) &&
                             [&] {
                               for (std::size_t e = 0; e < c.size(); ++e) {
                                 if (e != static_cast<std::size_t>(d) && c[e] != anchor[e]) return false;
                               }
                               return true;
                             }();
      if (!same_line) fail_check(members[k], checks::members_wrong(where, members, *m.group_of(members[k], d)));
    }
  }
  auto rows = w.all_gather(*groups, rank_value);
  for (int64_t g = 0; g < groups->count(); ++g) {
    std::span<const int64_t> members = groups->group(g);
    const std::vector<int64_t>& got = rows[static_cast<std::size_t>(g)];
    if (!std::equal(members.begin(), members.end(), got.begin(), got.end())) {
      fail_check(members[0], checks::gathered_wrong(where, got, members));
    }
  }
  const LocalValue<int64_t> sums = w.all_reduce(groups, LocalValue<int64_t>::affine(world, 1, 1), ReduceOp::kSum);
  for (int64_t g = 0; g < groups->count(); ++g) {
    std::span<const int64_t> members = groups->group(g);
    const int64_t want = checks::group_sum(members);
    if (sums.at(members[0]) != want) fail_check(members[0], checks::sum_wrong(where, sums.at(members[0]), want));
  }
  out.checks += checks::kPerDim * groups->count() * groups->size();
  return rows;
}

// run_local evaluates every rank at once (local mode): the same program, checks and faults as
// the threaded run, each collective computed group by group.
Outcome run_local(const Job& job) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t world = job.world;
  LocalWorld w(world);
  Outcome out;
  auto ranks_of = [&](Fault kind) {
    std::set<int64_t> s;
    for (const Planted& p : job.faults) {
      if (p.kind == kind) s.insert(p.rank);
    }
    return s;
  };
  const std::set<int64_t> throwing = ranks_of(Fault::kThrow), skipping = ranks_of(Fault::kSkip),
                          odd_count = ranks_of(Fault::kMismatch), odd_mesh = ranks_of(Fault::kMesh);
  const auto rank_value = LocalValue<int64_t>::affine(world, 0, 1);
  try {
    // World check: all_reduce(sum) of (rank, 1) over the world.
    LocalCall first;
    first.count = 2;
    for (int64_t r : odd_count) first.count_of[r] = 3;
    const auto rank_sum = w.all_reduce(w.world_groups(), rank_value, ReduceOp::kSum, first);
    // Each rank's count is 1 by construction here: one value per rank is reduced.
    if (!checks::world_right(world, rank_sum.at(0), world)) fail_check(0, checks::world_wrong(rank_sum.at(0), world));
    // Mesh agreement: what each rank built, against the recipe's meshes.
    std::vector<MeshParts> odd_parts;
    std::vector<std::string> odd_text;
    if (!odd_mesh.empty()) {
      const BuiltMeshes other = meshsim::apply(different_recipe(job.recipe, job.expected->root));
      odd_parts.push_back(mesh_parts(other.root));
      odd_text.push_back(other.root.to_string());
      for (const DeviceMesh& m : other.meshes) {
        odd_parts.push_back(mesh_parts(m));
        odd_text.push_back(m.to_string());
      }
    }
    for (std::size_t i = 0; i < job.meshes.size(); ++i) {
      // The fingerprint check: min of 4 parts and their complements and a flag, as ranks run it.
      LocalCall agree;
      agree.count = 9;
      w.all_reduce(w.world_groups(), rank_value, ReduceOp::kMin, agree);
      if (!odd_mesh.empty() && !(odd_parts[i] == job.parts[i])) {
        throw LocalFailure(mesh_diagnosis(std::vector<int64_t>(odd_mesh.begin(), odd_mesh.end()),
                                          differing_parts(odd_parts[i], job.parts[i]), true, odd_text[i]));
      }
    }
    for (std::size_t i = 0; i < job.meshes.size(); ++i) {
      const DeviceMesh& m = job.meshes[i];
      std::vector<std::vector<std::vector<int64_t>>> dims;
      for (int d = 0; d < m.ndim(); ++d) {
        if (job.interrupted && job.interrupted()) {
          throw LocalFailure(Diagnosis{DiagnosisKind::kError, {}, "interrupted: the run was stopped from outside before it ended", {}, {}});
        }
        std::vector<std::vector<int64_t>> rows = local_dim_checks(w, m, i, d, out);
        if (static_cast<int64_t>(rows.size()) > job.keep_groups) {
          rows.resize(static_cast<std::size_t>(job.keep_groups));
          rows.shrink_to_fit();
        }
        dims.push_back(std::move(rows));
      }
      out.seen.push_back(std::move(dims));
      // A planted throw happens after the root's checks, as in the threaded run.
      if (i == 0 && !throwing.empty()) planted_throw(*throwing.begin());
    }
    if (!throwing.empty()) planted_throw(*throwing.begin());
    // Global agreement: every rank's check count sums to what the recipe predicts.
    LocalCall last;
    last.absent = skipping;
    std::vector<int64_t> passed(static_cast<std::size_t>(world), 0);
    for (int64_t r = 0; r < world; ++r) passed[static_cast<std::size_t>(r)] = checks::of_rank(job.meshes, r);
    const auto total = w.all_reduce(w.world_groups(), LocalValue<int64_t>::dense(std::move(passed)), ReduceOp::kSum, last);
    if (total.at(0) != job.expected_checks) fail_check(0, checks::agreement_wrong(total.at(0), job.expected_checks));
  } catch (const LocalFailure& f) {
    out.ok = false;
    out.seen.clear();
    if (f.diagnosis.ranks.empty()) out.failures.push_back(f.diagnosis);  // no rank at fault
    for (int64_t r : f.diagnosis.ranks) {
      Diagnosis one = f.diagnosis;
      one.ranks = {r};
      out.failures.push_back(std::move(one));
    }
  }
  out.collectives = w.collectives();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

void print(const Options& o, const Job& job, const Outcome& r, std::ostream& out) {
  const int64_t world = job.world;
  const std::vector<DeviceMesh>& meshes = job.meshes;
  if (o.format == "json") {
    Json j;
    j["ok"] = r.ok;
    j["backend"] = o.backend;
    j["world_size"] = world;
    if (r.own) j["rank"] = job.launched->rank;  // one launched rank's report: its own groups only
    if (job.hosts) {
      j["ok"] = r.ok && job.misplaced.empty();
      j["placement_failures"] = job.misplaced;
    }
    Json ms = Json::array();
    for (std::size_t i = 0; i < meshes.size(); ++i) {
      const DeviceMesh& m = meshes[i];
      Json md;
      md["mesh_dim_names"] = m.names() ? Json(*m.names()) : Json(nullptr);
      md["shape"] = m.shape();
      Json g = Json::object();
      for (int d = 0; d < m.ndim(); ++d) {
        g[m.dim_name(d)] = r.ok ? Json(r.seen[i][static_cast<std::size_t>(d)]) : Json(nullptr);
      }
      md["groups_by_dim"] = g;
      if (job.hosts) {
        Json pl = Json::object();
        for (int d = 0; d < m.ndim(); ++d) {
          const placement::DimPlacement p = placement::place(m, d, *job.hosts);
          pl[m.dim_name(d)] = {{"groups", p.groups}, {"max_hosts", p.max_hosts},
                               {"groups_crossing_hosts", p.groups_crossing_hosts}, {"max_domains", p.max_domains}};
        }
        md["placement"] = pl;
      }
      ms.push_back(md);
    }
    j["meshes"] = ms;
    // The views the recipe names: the root and every mesh bound by `let`, in recipe order.
    Json vs = Json::array();
    for (const View& v : views(job.recipe)) {
      Json view = ms[v.step];
      view.erase("placement");
      view["name"] = v.name;
      vs.push_back(std::move(view));
    }
    j["views"] = vs;
    j["checks"] = r.checks;
    j["collectives"] = r.collectives;
    j["seconds"] = r.seconds;
    Json fs = Json::array();
    // One entry per rank at fault, as many as the budget allows; failures_count says how many.
    j["failures_count"] = r.failures.size() + r.stuck.size();
    for (const Diagnosis& d : r.failures) {
      if (fs.size() >= kListedRanks) break;
      Json f{{"rank", d.ranks.empty() ? Json(nullptr) : Json(d.ranks[0])}, {"kind", to_string(d.kind)}, {"message", d.message}};
      if (d.kind == DiagnosisKind::kStall) {
        // The first ranks and a count: a report does not grow with the world.
        auto first = [](const std::vector<int64_t>& v) {
          return std::vector<int64_t>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(v.size(), kListedRanks)));
        };
        f["waiting"] = first(d.waiting);
        f["waiting_count"] = d.waiting.size();
        f["missing"] = first(d.missing);
        f["missing_count"] = d.missing.size();
      }
      fs.push_back(f);
    }
    for (const RankReport& s : r.stuck) {
      if (fs.size() >= kListedRanks) break;
      fs.push_back({{"rank", s.rank}, {"kind", "stuck"}, {"message", s.message}});
    }
    j["failures"] = fs;
    out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  } else {
    if (r.own) {
      out << "meshsim run: rank " << job.launched->rank << " of " << world << " over the " << o.backend
          << " backend (launched by " << job.launched->launcher << "; its own groups)";
    } else if (job.launched) {
      out << "meshsim run: " << world << " ranks over the " << o.backend << " backend, one per process (launched by "
          << job.launched->launcher << "; rank " << job.launched->rank << " reports)";
    } else {
      out << "meshsim run: " << world << " ranks over the " << o.backend << " backend";
    }
    if (o.backend != "local") out << ", timeout " << o.timeout_seconds << " s";
    out << "\n";
    for (std::size_t i = 0; i < meshes.size(); ++i) {
      const DeviceMesh& m = meshes[i];
      const auto& let = i == 0 ? std::optional<std::string>() : job.recipe.steps[i - 1].let;
      out << (i == 0 ? "  root " : "  step " + std::to_string(i) + (let ? " (" + *let + ")" : std::string()) + " ")
          << m.to_string() << "\n";
      for (int d = 0; d < m.ndim(); ++d) {
        // The first groups only: listing every group of a 2^24-rank dim is not a summary.
        const int64_t count = m.rank_map_size() / m.size(d);
        out << "    " << m.dim_name(d) << ": " << count << (count == 1 ? " group of " : " groups of ") << m.size(d);
        if (r.ok) {
          const auto& rows = r.seen[i][static_cast<std::size_t>(d)];
          for (std::size_t k = 0; k < rows.size() && k < kShownGroups; ++k) out << " " << format_ranks(rows[k]);
          if (!r.own && count > std::min<int64_t>(static_cast<int64_t>(rows.size()), kShownGroups)) out << " ...";
        }
        if (job.hosts) {
          const placement::DimPlacement p = placement::place(m, d, *job.hosts);
          out << "; spans <= " << p.max_hosts << (p.max_hosts == 1 ? " host" : " hosts") << " (" << p.max_domains
              << (p.max_domains == 1 ? " domain" : " domains") << "), " << p.groups_crossing_hosts
              << (p.groups_crossing_hosts == 1 ? " group crosses a host" : " groups cross a host");
        }
        out << "\n";
      }
    }
    int64_t expected = job.expected_checks;
    if (r.own || (job.launched && !r.ok)) {
      expected = checks::of_rank(meshes, job.launched->rank);  // this rank's own checks
    }
    out << "checks passed: " << r.checks << " of " << expected << "; collectives: "
        << r.collectives << "; wall time " << r.seconds << " s\n";
    if (r.ok) {
      out << "OK: every rank's groups match the mesh on every dim\n";
    } else {
      // One line per rank at fault, up to kListedRanks lines of one diagnosis; the rest of its
      // ranks are counted on one line (a stall of thousands of ranks is not thousands of lines).
      std::map<std::string, int64_t> shown;
      std::map<std::string, std::pair<DiagnosisKind, std::vector<int64_t>>> more;
      for (const Diagnosis& d : r.failures) {
        if (shown[d.message]++ >= static_cast<int64_t>(kListedRanks)) {
          auto& m = more[d.message];
          m.first = d.kind;
          m.second.insert(m.second.end(), d.ranks.begin(), d.ranks.end());
          continue;
        }
        // A failure no rank caused (a lost store) names none.
        out << "FAILED " << (d.ranks.empty() ? "" : "rank " + std::to_string(d.ranks[0]) + " ") << "[" << to_string(d.kind)
            << "]: " << d.message << "\n";
      }
      for (const auto& [message, m] : more) {
        out << "FAILED ranks " << format_ranks(m.second) << " [" << to_string(m.first) << "]: the same diagnosis as the "
            << kListedRanks << " lines above it\n";
      }
      std::size_t stuck = 0;
      for (const RankReport& s : r.stuck) {
        if (stuck++ < kListedRanks) out << "STUCK rank " << s.rank << ": " << s.message << "\n";
      }
      if (r.stuck.size() > kListedRanks) out << "STUCK: " << r.stuck.size() - kListedRanks << " more ranks\n";
    }
    for (const std::string& b : job.misplaced) out << "FAILED placement: " << b << "\n";
  }
  out.flush();
}

}  // namespace

void write_error_file(const std::string& path, const std::string& message, std::optional<int64_t> timestamp) {
  // The form torchrun's ErrorHandler writes and its ProcessFailure reads: the root cause is the
  // failure with the smallest timestamp; it prints extraInfo.py_callstack as the traceback.
  const int64_t now = timestamp.value_or(std::chrono::duration_cast<std::chrono::seconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  const Json j{{"message",
                {{"message", "MeshsimRunFailure: " + message},
                 {"extraInfo", {{"py_callstack", message}, {"timestamp", std::to_string(now)}}}}}};
  std::ofstream f(path, std::ios::trunc);
  f << j.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  if (!f) std::cerr << "meshsim run: cannot write the error file " << quote_input(path) << " for the launcher\n";
}

namespace {

// keep_for_report decides what the report keeps of the groups (Job::keep_groups, firsts): what
// a text report prints, or, in JSON, every group of every mesh and view when the report fits
// the element budget the query has (--max-elements); a bigger one is refused before any rank
// starts, naming the size it would have had.
void keep_for_report(const Options& o, Job& job) {
  if (o.max_elements < 1) {
    throw InvalidArgument("--max-elements " + std::to_string(o.max_elements) + " is not >= 1");
  }
  if (o.format == "json") {
    std::vector<int64_t> listed(job.meshes.size(), 1);  // each mesh once, and again per view of it
    for (const View& v : views(job.recipe)) ++listed[v.step];
    // Every group of every dim (its ranks, once each, and one element per group), saturating.
    auto add = [](int64_t a, int64_t b) { return __builtin_add_overflow(a, b, &a) ? INT64_MAX : a; };
    auto mul = [](int64_t a, int64_t b) { return __builtin_mul_overflow(a, b, &a) ? INT64_MAX : a; };
    int64_t elements = 0;
    for (std::size_t i = 0; i < job.meshes.size(); ++i) {
      const DeviceMesh& m = job.meshes[i];
      for (int d = 0; d < m.ndim(); ++d) {
        elements = add(elements, mul(add(m.rank_map_size(), m.rank_map_size() / m.size(d)), listed[i]));
      }
    }
    if (elements > o.max_elements) {
      throw ResourceExhausted("--format json: the report would hold " +
                              (elements == INT64_MAX ? std::string("over 2^63") : std::to_string(elements)) +
                              " elements (every group of every dim of " + std::to_string(job.meshes.size()) +
                              (job.meshes.size() == 1 ? " mesh" : " meshes and views") +
                              "), over the answer's budget of " + std::to_string(o.max_elements) +
                              " (raise it with --max-elements, or use --format text, which lists the first " +
                              std::to_string(kShownGroups) + " groups per dim)");
    }
    return;
  }
  job.keep_groups = kShownGroups;
  for (const DeviceMesh& m : job.meshes) {
    std::vector<std::vector<int64_t>> dims;
    for (int d = 0; d < m.ndim(); ++d) {
      const GroupTable t = m.group_table_prefix(d, kShownGroups, 1);
      std::vector<int64_t> f;
      for (int64_t g = 0; g < t.count; ++g) f.push_back(t.row(g)[0]);
      std::sort(f.begin(), f.end());
      dims.push_back(std::move(f));
    }
    job.firsts.push_back(std::move(dims));
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
void check_footprint(const Job& job, int64_t ranks_here) {
  const uint64_t per_mesh = 2 * sizeof(DeviceMesh);
  const auto meshes = static_cast<uint64_t>(job.meshes.size());
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

// make_job checks the flags (InvalidArgument naming the flag or value, exit 2) and builds what
// both programs run: the recipe's meshes, their fingerprints, the faults, the launch.
Job make_job(const Options& o, const BackendEntry* entry, std::chrono::milliseconds timeout) {
  Job job;
  job.backend = o.backend;
  job.recipe = recipe_from_flags(o.recipe);
  job.expected = apply_flags(job.recipe, o.recipe);  // bad recipes stop here (exit 2)
  job.world = job.recipe.world_size;
  if (entry && entry->spans_processes) job.launched = launch_env_from_environment();
  if (entry && entry->precondition) {
    // What the backend needs for the ranks of this process (NCCL: a GPU each).
    if (auto why = entry->precondition(job.launched ? 1 : job.world, job.launched ? job.launched->local_rank : 0)) {
      throw FailedPrecondition("--backend " + o.backend + ": " + *why);
    }
  }
  if (job.launched) {
    if (job.launched->world_size != job.world) {
      throw InvalidArgument("meshsim run: the launcher's world size " + std::to_string(job.launched->world_size) +
                            " (" + job.launched->launcher + ") differs from the mesh's " + std::to_string(job.world) +
                            " ranks");
    }
    if (job.launched->store_host.empty()) {
      throw InvalidArgument("meshsim run: launched by " + job.launched->launcher +
                            " but no store is named (set MESHSIM_STORE=host:port, or MASTER_ADDR and MASTER_PORT)");
    }
  }
  if (entry && !job.launched && job.world > entry->max_rank_threads) {
    throw InvalidArgument("--world-size " + std::to_string(job.world) + " is over the " +
                          std::to_string(entry->max_rank_threads) + " ranks one process runs over the " +
                          o.backend + " backend" +
                          (entry->spans_processes ? "; run one rank per process with `meshsim launch -n N -- meshsim run "
                                                    "--backend " + o.backend + " ...`"
                                                  : std::string()) +
                          " (--backend local runs up to 2^24 ranks in one thread)");
  }
  if (o.backend == "local" && job.world > kMaxLocalWorld) {
    throw InvalidArgument("--world-size " + std::to_string(job.world) + " is over the " +
                          std::to_string(kMaxLocalWorld) + " ranks local mode supports");
  }
  job.faults = parse_faults(o.faults, job.world);
  if (o.backend == "local") {
    for (const Planted& p : job.faults) {
      if (p.kind == Fault::kStall) {
        throw InvalidArgument("--fault stall@" + std::to_string(p.rank) + " does not apply to "
                              "--backend local: every rank runs in one thread, in lockstep, so "
                              "none can stall while the others wait");
      }
      if (p.kind == Fault::kExit) {
        throw InvalidArgument("--fault exit@" + std::to_string(p.rank) + " does not apply to "
                              "--backend local: no rank has a thread or process of its own to end");
      }
    }
  }
  job.timeout = timeout;
  constexpr int64_t kMinKib = static_cast<int64_t>(kMinStackBytes >> 10), kMaxKib = static_cast<int64_t>(kMaxStackBytes >> 10);
  if (o.rank_stack_kib != 0 && (o.rank_stack_kib < kMinKib || o.rank_stack_kib > kMaxKib)) {
    throw InvalidArgument("--rank-stack-kib " + std::to_string(o.rank_stack_kib) + " is out of range [" +
                          std::to_string(kMinKib) + ", " + std::to_string(kMaxKib) + "]");
  }
  job.stack_bytes = static_cast<std::size_t>(o.rank_stack_kib) << 10;
  job.interrupted = o.interrupted;
  job.meshes.push_back(job.expected->root);
  job.meshes.insert(job.meshes.end(), job.expected->meshes.begin(), job.expected->meshes.end());
  for (const DeviceMesh& m : job.meshes) job.parts.push_back(mesh_parts(m));
  job.expected_checks = checks::total(job.meshes);
  if (o.backend != "local") check_footprint(job, job.launched ? 1 : job.world);
  keep_for_report(o, job);
  job.hosts = placement::from_flags(o.placement);
  if (job.hosts) {
    placement::check_required(*job.hosts, job.meshes);
    job.misplaced = placement::violations(*job.hosts, job.meshes);
  }

  return job;
}

// join_job_store joins (or, as rank 0 under torchrun-style variables, serves) a launched job's
// store and claims this process's rank in it; returns the store this process serves, if any.
std::unique_ptr<TcpStoreServer> join_job_store(Job& job) {
  const LaunchEnv& env = *job.launched;
  // meshsim launch serves its own store; under torchrun's agent the agent's PyTorch TCPStore
  // is joined; otherwise rank 0 serves one at MASTER_ADDR:MASTER_PORT (join_launch_store).
  LaunchStore joined = launch::join_store(env, job.timeout);
  job.store = std::move(joined.store);
  job.wills = joined.meshsim;
  job.prefix += env.scope;  // one namespace per run (and, under torchrun, per attempt)
  // One process per rank and run: a second process with this rank (a duplicate RANK), or a
  // store that still holds this run's keys from an earlier job, is refused at once. The claim
  // ("<host> <pid>") also lets peers on this host name this rank if its process dies, on a
  // store without wills (PyTorch's) too.
  claim_rank(*job.store, job.prefix + "/rank/" + std::to_string(env.rank), env);
  // If this process dies, meshsim's store tells the others which rank it was.
  if (job.wills) job.wills->set_will(job.prefix + "/exit/" + std::to_string(env.rank), "its process ended");
  return std::move(joined.hosted);
}

// report_to_launcher writes a failed launched rank's diagnosis where torchrun's agent reads it.
void report_to_launcher(const Job& job, const Outcome& r, std::chrono::system_clock::time_point started) {
  std::string text;
  bool culprit = false;  // this rank is one the diagnosis names
  for (const Diagnosis& d : r.failures) {
    text += (text.empty() ? "" : "\n") + std::string("rank ") + (d.ranks.empty() ? "?" : std::to_string(d.ranks[0])) +
            " [" + std::string(to_string(d.kind)) + "]: " + d.message;
    culprit = culprit || std::find(d.ranks.begin(), d.ranks.end(), job.launched->rank) != d.ranks.end();
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
  write_error_file(job.launched->error_file,
                   "meshsim run: rank " + std::to_string(job.launched->rank) + " of " + std::to_string(job.world) +
                       " failed: " + text,
                   stamp);
}

}  // namespace

int run(const Options& o, std::ostream& out) {
  const auto started = std::chrono::system_clock::now();
  const BackendEntry* entry = o.backend == "local" ? nullptr : find_backend(o.backend);
  if (o.backend != "local" && entry == nullptr) {
    throw InvalidArgument("--backend '" + o.backend + "' is not available (known: " + backend_names_text() + ", local)");
  }
  const std::chrono::milliseconds timeout = launch::timeout_flag(o.timeout_seconds);
  if (o.format != "text" && o.format != "json") {
    throw InvalidArgument("--format must be text or json, not " + o.format);
  }
  auto held = std::make_shared<Job>(make_job(o, entry, timeout));
  Job& job = *held;
  std::unique_ptr<TcpStoreServer> hosted;
  if (job.launched) hosted = join_job_store(job);
  Outcome r = o.backend == "local" ? run_local(job) : run_ranks(held);
  if (hosted && r.ok) {
    // Serve until every rank has seen the end (bounded: a rank that died meanwhile is not awaited).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until && job.store->add(job.prefix + "/left", 0) < job.world) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  print(o, job, r, out);
  if (!r.ok && job.launched && !job.launched->error_file.empty()) report_to_launcher(job, r, started);
  const int code = r.ok && job.misplaced.empty() ? 0 : 1;
  // Detached rank threads must not outlive main's destructors: the tool ends here. A library
  // caller (Python) keeps its process; the stuck threads hold what they use.
  if (!r.stuck.empty() && o.end_process_if_stuck) std::_Exit(code);
  return code;
}

}  // namespace meshsim::run
