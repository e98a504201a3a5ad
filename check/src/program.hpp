// program.hpp (private) — the check program, written once, and what its two engines share: the
// prepared job (Plan), the checks' predicates and wordings, the Engine interface the program
// drives, and each engine's entry point.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meshsim/check_meshes.hpp"
#include "meshsim/creation_plan.hpp"
#include "meshsim/launch_env.hpp"
#include "meshsim/store.hpp"

namespace meshsim::check::detail {

// Plan is a job made ready to run: the recipe's meshes and fingerprints, the faults, the
// launch, and what the report keeps.
struct Plan {
  MeshRecipe recipe;
  std::optional<BuiltMeshes> expected;
  std::vector<DeviceMesh> meshes;  // root, then one per step
  std::vector<MeshParts> parts;
  int64_t world = 0;
  int64_t expected_checks = 0;
  std::shared_ptr<const CreationPlan> creation;  // the recipe's group creations, as every rank must make them
  uint64_t creation_events = 0;                  // the recipe's root's creation_log_digest
  std::vector<Fault> faults;
  std::chrono::milliseconds timeout{0};
  std::string engine = "threaded";
  // One rank of a launched job: its place, the job's store, and the store when it is meshsim's
  // (it publishes a crashed rank's exit).
  std::optional<LaunchEnv> launched;
  std::shared_ptr<Store> store;
  TcpStoreClient* wills = nullptr;
  // hosted: the store this process serves (rank 0 under torchrun-style variables); ranks left
  // stuck hold it with the plan.
  std::shared_ptr<TcpStoreServer> hosted;
  std::string prefix = "meshsim/run";
  // The report keeps, per dim, the first keep_groups groups as gathered; firsts[mesh][dim] are
  // their first members, ascending, the only ranks that keep a copy (empty: every group kept).
  int64_t keep_groups = INT64_MAX;
  std::vector<std::vector<std::vector<int64_t>>> firsts;
  std::function<bool()> interrupted;
  std::size_t stack_bytes = 0;

  bool planted(FaultKind kind, int64_t rank) const {
    return std::any_of(faults.begin(), faults.end(), [&](const Fault& f) { return f.kind == kind && f.rank == rank; });
  }
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

// different_recipe is what a rank with a `mesh` fault builds: the same mesh over a reversed
// rank map (or, with one rank, with renamed dims).
MeshRecipe different_recipe(MeshRecipe r, const DeviceMesh& root);

// Outcome is what an engine reports.
struct Outcome {
  bool ok = true;
  std::vector<Diagnosis> failures;  // one per rank at fault
  std::vector<RankReport> stuck;
  int64_t checks = 0;
  int64_t collectives = 0;
  double seconds = 0;
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> seen;  // [mesh][dim][group]
  bool own = false;  // a launched rank's report of its own groups only
};

// The checks of a run: what each expects and how its failure reads. run_program runs exactly
// these, in this order, on either engine:
//   1. the world: all_reduce(sum) of (rank, 1) over every rank gives (world(world-1)/2, world);
//      a planted exit fires after it;
//   2. every mesh: the ranks agree on it (its fingerprints, against the recipe's);
//   2b. group creation: every rank's process-group calls (creation_plan.hpp), as a digest, agree
//      (min and max over the world); a rank whose calls leave the recipe's names itself and the
//      first call where they part (a planted reorder swaps its first two dims' calls);
//   3. per mesh a rank belongs to, per dim, kPerDim checks: its communicator holds the dim's
//      group, an all_gather of ranks returns the group, an all_reduce(sum) of rank+1 gives
//      group_sum; a planted throw fires after the root mesh's checks;
//   4. global agreement: all_reduce(sum) of every rank's check count gives total() (a planted
//      skip leaves it out).
namespace checks {

inline constexpr int64_t kPerDim = 3;

std::string where(std::size_t mesh, const DeviceMesh& m, int d);
int64_t group_sum(std::span<const int64_t> group);
// of_rank: the checks `rank` runs; total: every rank's.
int64_t of_rank(const std::vector<DeviceMesh>& meshes, int64_t rank);
int64_t total(const std::vector<DeviceMesh>& meshes);
bool world_right(int64_t world, int64_t rank_sum, int64_t count);
std::string world_wrong(int64_t rank_sum, int64_t count);
std::string members_wrong(const std::string& where, std::span<const int64_t> held, std::span<const int64_t> group);
std::string gathered_wrong(const std::string& where, std::span<const int64_t> got, std::span<const int64_t> group);
std::string sum_wrong(const std::string& where, int64_t got, int64_t want);
std::string agreement_wrong(int64_t total, int64_t expected);
std::string planted_throw(int64_t rank);
// creation_wrong: a rank's calls (`mine`, batches of its own plan `own`, in the order it makes
// them) leave the recipe's plan at their first difference.
std::string creation_wrong(const CreationPlan& plan, const CreationPlan& own, const std::vector<const CreationBatch*>& mine);


}  // namespace checks

// Engine runs each step of the program for the ranks it stands for (one rank, or every rank at
// once); a failed check ends the engine's run the way its ranks end (RankContext::fail, or a
// LocalFailure).
class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::size_t mesh_count() const = 0;
  virtual int ndim(std::size_t mesh) const = 0;
  virtual void world() = 0;                     // step 1
  virtual void exit_point() = 0;                // a planted exit
  virtual void agree(std::size_t mesh) = 0;     // step 2
  virtual void creation() = 0;                  // step 2b
  virtual void dim(std::size_t mesh, int d) = 0;  // step 3, one dim
  virtual void throw_point() = 0;               // a planted throw
  virtual void agreement() = 0;                 // step 4
};

// run_program: the program, the one order both engines follow.
void run_program(Engine& e);

// RankResult is what one rank produces: the checks it passed and the groups it kept
// (seen[mesh][dim]), as far as it got.
struct RankResult {
  int64_t checks = 0;
  std::vector<std::vector<std::vector<int64_t>>> seen;
};

// encode_result is a launched rank's result as it publishes it (typed int64 words);
// decode_result reads rank `rank`'s back against the plan, every count bounded by the meshes
// the recipe makes: ParseError for a short, long, foreign or out-of-bounds value.
std::string encode_result(const RankResult& r, int64_t collectives);
RankResult decode_result(const std::string& bytes, const Plan& plan, int64_t rank, int64_t& collectives);

// The engines' runs: every rank of this process over the plan's backend (one, launched: then
// the ranks' typed results meet through the store), or every rank at once in LocalWorld.
Outcome run_ranks(const std::shared_ptr<const Plan>& plan);
Outcome run_local(const Plan& plan);

}  // namespace meshsim::check::detail
