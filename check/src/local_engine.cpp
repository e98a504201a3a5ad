// local_engine.cpp — the LocalWorld engine: the program for every rank at once, each collective
// computed group by group, with the same checks, faults and diagnoses as the per-rank engine.
#include <set>

#include "meshsim/error.hpp"
#include "meshsim/local.hpp"
#include "program.hpp"

namespace meshsim::check::detail {

namespace {

// fail_check stops local mode the way RankContext::fail stops a rank; planted_throw the way a
// rank's uncaught exception does.
[[noreturn]] void fail_check(int64_t rank, const std::string& message) {
  throw LocalFailure(Diagnosis{DiagnosisKind::kCheck, {rank}, "rank " + std::to_string(rank) + ": " + message, {}, {}});
}

class LocalEngine final : public Engine {
 public:
  LocalEngine(const Plan& plan, LocalWorld& w, Outcome& out)
      : plan_(plan), w_(w), out_(out), rank_value_(LocalValue<int64_t>::affine(plan.world, 0, 1)) {
    for (const Fault& f : plan.faults) {
      if (f.kind == FaultKind::kThrow) throwing_.insert(f.rank);
      if (f.kind == FaultKind::kSkip) skipping_.insert(f.rank);
      if (f.kind == FaultKind::kMismatch) odd_count_.insert(f.rank);
      if (f.kind == FaultKind::kMesh) odd_mesh_.insert(f.rank);
      if (f.kind == FaultKind::kReorder) reordering_.insert(f.rank);
    }
  }

  std::size_t mesh_count() const override { return plan_.meshes.size(); }
  int ndim(std::size_t i) const override { return plan_.meshes[i].ndim(); }

  // World check: all_reduce(sum) of (rank, 1) over the world; each rank's count is 1 by
  // construction here (one value per rank is reduced).
  void world() override {
    LocalCall first;
    first.count = 2;
    for (int64_t r : odd_count_) first.count_of[r] = 3;
    const auto rank_sum = w_.all_reduce(w_.world_groups(), rank_value_, ReduceOp::kSum, first);
    if (!checks::world_right(plan_.world, rank_sum.at(0), plan_.world)) {
      fail_check(0, checks::world_wrong(rank_sum.at(0), plan_.world));
    }
  }

  void exit_point() override {}  // refused before the run: no rank has a thread of its own to end

  // Mesh agreement: what each rank built, against the recipe's meshes; the fingerprint check is
  // min of 4 parts and their complements and a flag, as ranks run it.
  void agree(std::size_t i) override {
    if (!odd_mesh_.empty() && odd_parts_.empty()) {
      const BuiltMeshes other = meshsim::apply(different_recipe(plan_.recipe, plan_.expected->root));
      odd_parts_.push_back(mesh_parts(other.root));
      odd_text_.push_back(other.root.to_string());
      for (const DeviceMesh& m : other.meshes) {
        odd_parts_.push_back(mesh_parts(m));
        odd_text_.push_back(m.to_string());
      }
    }
    LocalCall agree;
    agree.count = 9;
    w_.all_reduce(w_.world_groups(), rank_value_, ReduceOp::kMin, agree);
    if (!odd_mesh_.empty() && !(odd_parts_[i] == plan_.parts[i])) {
      throw LocalFailure(mesh_diagnosis(std::vector<int64_t>(odd_mesh_.begin(), odd_mesh_.end()),
                                        differing_parts(odd_parts_[i], plan_.parts[i]), true, odd_text_[i]));
    }
  }

  // Group creation: every rank's calls are the recipe's, but a planted reorder's (its first two
  // dims swapped); the ranks meet in one world collective, as they do over a backend.
  void creation() override {
    LocalCall c;
    c.count = 1;
    w_.all_reduce(w_.world_groups(), rank_value_, ReduceOp::kMin, c);
    if (reordering_.empty()) return;
    const CreationPlan& plan = *plan_.creation;
    fail_check(*reordering_.begin(), checks::creation_wrong(plan, plan, creation_order(plan, 0)));
  }

  // The checks of dim d of mesh i for every rank at once.
  void dim(std::size_t i, int d) override {
    if (plan_.interrupted && plan_.interrupted()) {
      throw LocalFailure(Diagnosis{DiagnosisKind::kError, {}, "interrupted: the run was stopped from outside before it ended", {}, {}});
    }
    const DeviceMesh& m = plan_.meshes[i];
    auto groups = std::make_shared<const LocalGroups>(m, d);
    const std::string where = checks::where(i, m, d);
    // Each rank's own view of its group (its coordinate) against the dim's groups.
    for (int64_t g = 0; g < groups->count(); ++g) {
      std::span<const int64_t> members = groups->group(g);
      const std::vector<int64_t> anchor = *m.coordinate(members[0]);
      for (std::size_t k = 0; k < members.size(); ++k) {
        const std::vector<int64_t> c = *m.coordinate(members[k]);
        bool same_line = c[static_cast<std::size_t>(d)] == static_cast<int64_t>(k);
        for (std::size_t e = 0; e < c.size() && same_line; ++e) {
          same_line = e == static_cast<std::size_t>(d) || c[e] == anchor[e];
        }
        if (!same_line) fail_check(members[k], checks::members_wrong(where, members, *m.group_of(members[k], d)));
      }
    }
    std::vector<std::vector<int64_t>> rows = w_.all_gather(*groups, rank_value_);
    for (int64_t g = 0; g < groups->count(); ++g) {
      std::span<const int64_t> members = groups->group(g);
      const std::vector<int64_t>& got = rows[static_cast<std::size_t>(g)];
      if (!std::equal(members.begin(), members.end(), got.begin(), got.end())) {
        fail_check(members[0], checks::gathered_wrong(where, got, members));
      }
    }
    const LocalValue<int64_t> sums =
        w_.all_reduce(groups, LocalValue<int64_t>::affine(plan_.world, 1, 1), ReduceOp::kSum);
    for (int64_t g = 0; g < groups->count(); ++g) {
      std::span<const int64_t> members = groups->group(g);
      const int64_t want = checks::group_sum(members);
      if (sums.at(members[0]) != want) fail_check(members[0], checks::sum_wrong(where, sums.at(members[0]), want));
    }
    out_.checks += checks::kPerDim * groups->count() * groups->size();
    if (static_cast<int64_t>(rows.size()) > plan_.keep_groups) {
      rows.resize(static_cast<std::size_t>(plan_.keep_groups));
      rows.shrink_to_fit();
    }
    if (out_.seen.size() <= i) out_.seen.resize(i + 1);
    out_.seen[i].push_back(std::move(rows));
  }

  void throw_point() override {
    if (throwing_.empty()) return;
    const int64_t rank = *throwing_.begin();
    throw LocalFailure(Diagnosis{DiagnosisKind::kError, {rank},
                                 "rank " + std::to_string(rank) + " failed: Internal: " + checks::planted_throw(rank), {}, {}});
  }

  // Global agreement: every rank's check count sums to what the recipe predicts.
  void agreement() override {
    LocalCall last;
    last.absent = skipping_;
    std::vector<int64_t> passed(static_cast<std::size_t>(plan_.world), 0);
    for (int64_t r = 0; r < plan_.world; ++r) passed[static_cast<std::size_t>(r)] = checks::of_rank(plan_.meshes, r);
    const auto total = w_.all_reduce(w_.world_groups(), LocalValue<int64_t>::dense(std::move(passed)), ReduceOp::kSum, last);
    if (total.at(0) != plan_.expected_checks) fail_check(0, checks::agreement_wrong(total.at(0), plan_.expected_checks));
  }

 private:
  const Plan& plan_;
  LocalWorld& w_;
  Outcome& out_;
  const LocalValue<int64_t> rank_value_;
  std::set<int64_t> throwing_, skipping_, odd_count_, odd_mesh_, reordering_;
  std::vector<MeshParts> odd_parts_;
  std::vector<std::string> odd_text_;
};

}  // namespace

Outcome run_local(const Plan& plan) {
  const auto start = std::chrono::steady_clock::now();
  LocalWorld w(plan.world);
  Outcome out;
  try {
    LocalEngine e(plan, w, out);
    run_program(e);
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

}  // namespace meshsim::check::detail
