// rank_engine.cpp — the SPMD engine: one rank's part of the program over its communicators, run
// on every rank of this process by the runner; a launched rank's typed result and how rank 0
// reads every rank's.
#include <cstring>

#include "meshsim/error.hpp"
#include "meshsim/launched.hpp"
#include "program.hpp"

namespace meshsim::check::detail {

namespace {

class RankEngine final : public Engine {
 public:
  // A planted stall sleeps before the rank builds anything; then every rank builds the recipe
  // itself, as real ranks do.
  RankEngine(const Plan& plan, RankContext& ctx, RankResult& out)
      : plan_(plan), ctx_(ctx), out_(out), me_(ctx.rank()), stalled_(stall(plan, ctx)),
        built_(plan.planted(FaultKind::kMesh, me_) ? meshsim::apply(different_recipe(plan.recipe, plan.expected->root))
                                                   : meshsim::apply(plan.recipe)) {
    // The rank checks its meshes in recipe order (root first) without copying them: a mesh is
    // about a kilobyte, and 1,024 ranks of 1,024 views held three copies each.
    built_.handles.clear();
    mine_.push_back(&built_.root);
    for (const DeviceMesh& m : built_.meshes) mine_.push_back(&m);
    out_.seen.resize(mine_.size());
  }

  std::size_t mesh_count() const override { return mine_.size(); }
  int ndim(std::size_t i) const override { return mine_[i]->contains(me_) ? mine_[i]->ndim() : 0; }

  void world() override {
    std::vector<int64_t> v{me_, 1};
    if (plan_.planted(FaultKind::kMismatch, me_)) v.push_back(0);  // the planted mismatch: another count
    ctx_.world().all_reduce(v.data(), static_cast<int64_t>(v.size()), DType::kInt64, ReduceOp::kSum);
    if (!checks::world_right(plan_.world, v[0], v[1])) ctx_.fail(checks::world_wrong(v[0], v[1]));
  }

  // The planted exit: the rank dies while the others are in the next collective.
  void exit_point() override {
    if (plan_.planted(FaultKind::kExit, me_)) ctx_.exit_abruptly();
  }

  void agree(std::size_t i) override { ctx_.check_mesh_agreement(*mine_[i], plan_.parts[i]); }

  // Group creation: the group-making calls the rank made (its universe's creation log, in
  // order), and the order it creates groups in, against the recipe's; every rank meets the
  // others in one world collective first, so a rank that parts from the plan is named by itself
  // while the others wait for it. O(steps) per rank: its own plan is built only to describe a
  // difference.
  void creation() override {
    const int64_t swap = plan_.planted(FaultKind::kReorder, me_) ? 0 : -1;
    const bool same_calls = built_.root.creation_log_digest() == plan_.creation_events;
    const bool same = same_calls && (swap < 0 || creation_digest(*plan_.creation, swap) == creation_digest(*plan_.creation));
    int64_t all_same = same ? 1 : 0;
    ctx_.world().all_reduce(std::span<int64_t>(&all_same, 1), ReduceOp::kMin);
    if (!same) {
      const bool odd_mesh = plan_.planted(FaultKind::kMesh, me_);
      const CreationPlan own =
          creation_plan(odd_mesh ? different_recipe(plan_.recipe, plan_.expected->root) : plan_.recipe, built_);
      ctx_.fail(checks::creation_wrong(*plan_.creation, own, creation_order(own, swap)));
    }
    if (all_same == 0) {
      // Another rank parted from the plan and fails naming itself: this one waits in a world
      // collective the failing ranks never join (the abort ends it), instead of going on to
      // make communicators with ranks that are gone.
      int64_t none = 0;
      ctx_.world().all_reduce(std::span<int64_t>(&none, 1), ReduceOp::kSum);
      ctx_.fail("group creation: the ranks' process-group calls disagree, and this rank's agree with the plan");
    }
  }

  void dim(std::size_t i, int d) override {
    const DeviceMesh& m = *mine_[i];
    Communicator& c = ctx_.comm(m, d);
    const std::string where = checks::where(i, m, d);
    {
      const std::vector<int64_t> expected = *m.group_of(me_, d);
      if (c.global_ranks() != expected) ctx_.fail(checks::members_wrong(where, c.global_ranks(), expected));
    }
    // From here the communicator's own (shared) member list is the group: a rank waiting in a
    // collective of 16,384 ranks holds its output, not a second copy of the members too.
    const std::vector<int64_t>& group = c.global_ranks();
    std::vector<int64_t> got(group.size());
    c.all_gather(std::span<const int64_t>(&me_, 1), std::span<int64_t>(got));
    if (got != group) ctx_.fail(checks::gathered_wrong(where, got, group));
    int64_t sum = me_ + 1;
    c.all_reduce(std::span<int64_t>(&sum, 1), ReduceOp::kSum);
    if (sum != checks::group_sum(group)) ctx_.fail(checks::sum_wrong(where, sum, checks::group_sum(group)));
    out_.checks += checks::kPerDim;
    // A rank keeps what the report shows, not a copy of every group of every view.
    out_.seen[i].push_back(plan_.keeps(i, d, me_, group) ? std::move(got) : std::vector<int64_t>{});
  }

  void throw_point() override {
    if (plan_.planted(FaultKind::kThrow, me_)) throw Internal(checks::planted_throw(me_));
  }

  // Global agreement: every rank's check count sums to what the recipe predicts.
  void agreement() override {
    if (plan_.planted(FaultKind::kSkip, me_)) return;
    int64_t total = out_.checks;
    ctx_.world().all_reduce(std::span<int64_t>(&total, 1), ReduceOp::kSum);
    if (total != plan_.expected_checks) ctx_.fail(checks::agreement_wrong(total, plan_.expected_checks));
  }

 private:
  const Plan& plan_;
  RankContext& ctx_;
  RankResult& out_;
  static bool stall(const Plan& plan, RankContext& ctx) {
    if (!plan.planted(FaultKind::kStall, ctx.rank())) return false;
    ctx.sleep_for(plan.timeout + std::chrono::seconds(2));
    return true;
  }

  const int64_t me_;
  const bool stalled_;
  BuiltMeshes built_;
  std::vector<const DeviceMesh*> mine_;
};

// by_group lays the ranks' views out as Outcome::seen: per mesh, per dim, each group as its
// first member saw it (view(r) is rank r's seen, or null where nothing was gathered).
template <class View>
void by_group(const Plan& plan, Outcome& out, View view) {
  for (std::size_t i = 0; i < plan.meshes.size(); ++i) {
    const DeviceMesh& m = plan.meshes[i];
    std::vector<std::vector<std::vector<int64_t>>> dims;
    for (int d = 0; d < m.ndim(); ++d) {
      std::vector<std::vector<int64_t>> rows;
      const GroupTable t = m.group_table_prefix(d, plan.keep_groups, 1);
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

}  // namespace

// ---- a launched rank's result, as typed words ----
//
// A rank publishes its result as int64 words in the host's byte order (little-endian on every
// platform meshsim builds for): a tag, the checks it passed, the
// collectives its backend ran, the meshes, then per mesh its dims and per dim the group it kept
// (a length, then the ranks). Rank 0 reads each back against the plan: every count is bounded by
// the meshes the recipe makes, so a short, long or foreign value is refused, never trusted.

namespace {

constexpr int64_t kResultTag = 0x6d73'7265'7375'6c01;  // "msresul", version 1

void put(std::string& out, int64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}

}  // namespace

std::string encode_result(const RankResult& r, int64_t collectives) {
  std::string out;
  put(out, kResultTag);
  put(out, r.checks);
  put(out, collectives);
  put(out, static_cast<int64_t>(r.seen.size()));
  for (const auto& dims : r.seen) {
    put(out, static_cast<int64_t>(dims.size()));
    for (const auto& group : dims) {
      put(out, static_cast<int64_t>(group.size()));
      for (int64_t g : group) put(out, g);
    }
  }
  return out;
}

namespace {

struct Reader {
  const std::string& bytes;
  std::size_t at = 0;
  int64_t next(const char* what) {
    if (bytes.size() - at < 8) throw ParseError(std::string("the result ends before its ") + what);
    int64_t v = 0;
    std::memcpy(&v, bytes.data() + at, 8);
    at += 8;
    return v;
  }
  int64_t bounded(const char* what, int64_t max) {
    const int64_t v = next(what);
    if (v < 0 || v > max) {
      throw ParseError(std::string("the result's ") + what + " " + std::to_string(v) + " is not in [0, " + std::to_string(max) + "]");
    }
    return v;
  }
};

}  // namespace

RankResult decode_result(const std::string& bytes, const Plan& plan, int64_t rank, int64_t& collectives) {
  if (bytes.size() % 8 != 0) throw ParseError("the result holds " + std::to_string(bytes.size()) + " bytes, not whole words");
  Reader in{bytes};
  if (in.next("tag") != kResultTag) throw ParseError("the result is not a meshsim rank result (another tag)");
  RankResult r;
  r.checks = in.bounded("check count", checks::of_rank(plan.meshes, rank));
  collectives = in.bounded("collective count", INT64_MAX);
  const int64_t meshes = in.bounded("mesh count", static_cast<int64_t>(plan.meshes.size()));
  for (int64_t i = 0; i < meshes; ++i) {
    const DeviceMesh& m = plan.meshes[static_cast<std::size_t>(i)];
    const int64_t dims = in.bounded("dim count", m.ndim());
    std::vector<std::vector<int64_t>> ds;
    for (int64_t d = 0; d < dims; ++d) {
      const int64_t len = in.bounded("group size", m.size(static_cast<int>(d)));
      std::vector<int64_t> group(static_cast<std::size_t>(len));
      for (int64_t& g : group) g = in.bounded("rank", plan.world - 1);
      ds.push_back(std::move(group));
    }
    r.seen.push_back(std::move(ds));
  }
  if (in.at != bytes.size()) throw ParseError("the result has " + std::to_string(bytes.size() - in.at) + " bytes past its end");
  return r;
}

// run_ranks runs the program on this process's ranks; they hold the plan through `held`, so a
// rank left detached (stuck) never reads a plan that is gone.
Outcome run_ranks(const std::shared_ptr<const Plan>& held) {
  const Plan& plan = *held;
  SpmdOptions so;
  so.world_size = plan.world;
  so.timeout = plan.timeout;
  so.backend = plan.engine;
  so.placement.prefix = plan.prefix;
  so.interrupted = plan.interrupted;
  so.stack_bytes = plan.stack_bytes;
  if (plan.launched) {
    so.placement.first_rank = plan.launched->rank;
    so.placement.local_ranks = 1;
    so.placement.store = plan.store;
    so.placement.local_rank = plan.launched->local_rank;
  }
  SpmdResults<RankResult> run = run_spmd_results<RankResult>(so, [held](RankContext& ctx, RankResult& out) {
    RankEngine e(*held, ctx, out);
    run_program(e);
  });
  Outcome out;
  out.ok = run.report.ok;
  out.failures = run.report.failures;
  for (const RankReport& r : run.report.ranks) {
    if (r.status == RankStatus::kStuck) out.stuck.push_back(r);
  }
  for (const auto& r : run.results) out.checks += r ? r->checks : 0;
  out.collectives = run.report.collectives;
  out.seconds = run.report.seconds;
  if (!plan.launched) {
    if (out.ok) by_group(plan, out, [&](int64_t r) { return &run.results[static_cast<std::size_t>(r)]->seen; });
    return out;
  }
  // One rank of a launched job: rank 0 reports the whole job as a threaded run would, the
  // others their own groups.
  const int64_t me = plan.launched->rank;
  std::optional<std::string> mine;
  if (out.ok && run.results[0]) mine = encode_result(*run.results[0], run.report.collectives);
  LaunchedJob lj{plan.store, plan.prefix, plan.world, me, plan.timeout, [&plan] {
                   if (plan.wills) plan.wills->clear_will();  // an exit from here on is no crash
                 }};
  LaunchedEnd end = finish_launched(lj, run.report, mine);
  out.ok = end.ok;
  out.failures = end.failures;
  if (!out.ok) return out;
  if (me != 0) {
    out.own = true;
    const auto& seen = run.results[0]->seen;
    for (std::size_t i = 0; i < plan.meshes.size(); ++i) {
      std::vector<std::vector<std::vector<int64_t>>> dims;
      for (int d = 0; d < plan.meshes[i].ndim(); ++d) {
        if (i < seen.size() && static_cast<std::size_t>(d) < seen[i].size()) dims.push_back({seen[i][static_cast<std::size_t>(d)]});
        else dims.push_back({});
      }
      out.seen.push_back(std::move(dims));
    }
    return out;
  }
  std::vector<RankResult> all(static_cast<std::size_t>(plan.world));
  out.checks = 0;
  out.collectives = 0;
  for (int64_t r = 0; r < plan.world; ++r) {
    try {
      int64_t collectives = 0;
      all[static_cast<std::size_t>(r)] = decode_result(end.results[static_cast<std::size_t>(r)], plan, r, collectives);
      out.checks += all[static_cast<std::size_t>(r)].checks;  // at most the recipe's total
      if (__builtin_add_overflow(out.collectives, collectives, &out.collectives)) out.collectives = INT64_MAX;
    } catch (const Error& e) {
      out.ok = false;
      out.failures.push_back(Diagnosis{DiagnosisKind::kError, {me},
                                       "rank 0 could not read rank " + std::to_string(r) + "'s result: " + e.what(), {}, {}});
      return out;
    }
  }
  by_group(plan, out, [&](int64_t r) { return &all[static_cast<std::size_t>(r)].seen; });
  return out;
}

}  // namespace meshsim::check::detail
