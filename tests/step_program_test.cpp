// One torchtitan step's programs: groups against the preset meshes, byte totals against closed
// forms, torchtitan's refusals, planted faults named, deadlocks found, exact and class checks agree.
#include "meshsim/step_program.hpp"
#include "meshsim/megatron_args.hpp"
#include "meshsim/step_job.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <string_view>
#include <tuple>

#include "meshsim/error.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/recipe.hpp"

namespace meshsim::step {
namespace {

// groups_of: every group of dim d over the world, as sorted member lists; view_groups: a built
// mesh's groups along one of its dims, the same way.
std::set<std::vector<int64_t>> groups_of(const Parallel& p, Dim d) {
  std::set<std::vector<int64_t>> s;
  for (int64_t r = 0; r < world_size(p); ++r) s.insert(group_members(p, d, r));
  return s;
}
std::set<std::vector<int64_t>> view_groups(const DeviceMesh& m, std::string_view name) {
  std::set<std::vector<int64_t>> s;
  for (auto g : m.groups(m.dim_index(name))) {
    std::sort(g.begin(), g.end());
    s.insert(g);
  }
  return s;
}

// laid: torchtitan's degrees with their groups laid out as the preset's views lay them.
Parallel laid(const Parallel& d) {
  return titan_parallel(preset::torchtitan_views({d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp, d.ep, "spmd_types"}, std::nullopt));
}

Job small_job(const Parallel& degrees, int64_t microbatches = 1, std::string schedule = "1F1B") {
  Job j;
  j.parallel = laid(degrees);
  j.model = builtin_model("llama3-debugmodel");
  j.seq_len = 256;
  j.local_batch_size = 2;
  j.microbatches = microbatches;
  j.schedule = std::move(schedule);
  return j;
}

bool names(const Report& r, int64_t rank) {
  return std::find(r.ranks.begin(), r.ranks.end(), rank) != r.ranks.end() &&
         r.diagnosis.find("rank " + std::to_string(rank)) != std::string::npos;
}

// DeepSeek's released checkpoints: V2-Lite (torchtitan's deepseek_v3 16B flavor) holds
// 15,706,484,224 parameters; V3's main model 671,026,419,200 counting the router's
// e_score_correction_bias (256 per MoE layer, 58 layers), which torchtitan keeps as a buffer.
TEST(StepModel, DeepSeekCountsAreTheReleasedCheckpoints) {
  EXPECT_EQ(parameter_count(builtin_model("deepseek_v3-16b")), 15'706'484'224);
  EXPECT_EQ(parameter_count(builtin_model("deepseek_v3-671b")) + 58 * 256, 671'026'419'200);
}

TEST(StepModel, ParameterCountsAreMetasPublishedOnes) {
  // Meta's model cards: 8.03B, 70.6B, 405B; the exact counts of the released checkpoints.
  EXPECT_EQ(parameter_count(builtin_model("llama3-8b")), 8'030'261'248);
  EXPECT_EQ(parameter_count(builtin_model("llama3-70b")), 70'553'706'496);
  EXPECT_EQ(parameter_count(builtin_model("Llama3-405B")), 405'853'388'800);
  EXPECT_EQ(builtin_model("llama3-8b").ffn_dim, 14336);
  EXPECT_EQ(builtin_model("llama3-70b").ffn_dim, 28672);
  EXPECT_EQ(builtin_model("llama3-405b").ffn_dim, 53248);
  EXPECT_THROW(builtin_model("llama3-9b"), NotFound);
}

// The groups meshsim step counts on are the preset's: step lays torchtitan's ranks out by the
// preset's views (titan_parallel over preset::torchtitan_views), and every dim's groups, over the
// world, equal the groups of the views the applied recipe builds (dense, dataloading, loss).
TEST(StepGroups, MatchTheTorchtitanPresetViews) {
  for (const Parallel given : {Parallel{2, 1, 4, 1, 2, 1}, Parallel{2, 2, 2, 2, 2, 4}, Parallel{1, 3, 2, 2, 1, 2},
                               Parallel{3, 1, 1, 2, 4, 8}, Parallel{1, 2, 4, 1, 2, 2}}) {
    preset::Torchtitan t{given.pp, given.dp_replicate, -1, given.cp, given.tp, given.ep, "spmd_types"};
    const Parallel p = titan_parallel(preset::torchtitan_views(t, world_size(given)));  // dp_shard resolved
    EXPECT_EQ(p.dp_shard, given.dp_shard);
    auto ours = [&](Dim d) { return groups_of(p, d); };
    const auto& theirs = view_groups;
    t.dp_shard = given.dp_shard;
    const BuiltMeshes spmd = apply(preset::torchtitan_recipe(t, std::nullopt));
    t.spmd_backend = "partial_dtensor";
    const BuiltMeshes dt = apply(preset::torchtitan_recipe(t, std::nullopt));
    EXPECT_EQ(ours(Dim::kPp), theirs(spmd.handles.at("dense"), "pp"));
    EXPECT_EQ(ours(Dim::kDpReplicate), theirs(spmd.handles.at("dense"), "dp_replicate"));
    EXPECT_EQ(ours(Dim::kCp), theirs(spmd.handles.at("dense"), "cp"));
    EXPECT_EQ(ours(Dim::kTp), theirs(spmd.handles.at("dense"), "tp"));
    EXPECT_EQ(ours(Dim::kFsdp), theirs(dt.handles.at("dense"), "fsdp"));
    EXPECT_EQ(ours(Dim::kBatch), theirs(spmd.handles.at("dataloading"), "batch"));
    EXPECT_EQ(ours(Dim::kLoss), theirs(spmd.handles.at("loss"), "loss_mesh"));
    EXPECT_EQ(ours(Dim::kEp), theirs(spmd.handles.at("sparse"), "ep"));
    EXPECT_EQ(ours(Dim::kEfsdp), theirs(spmd.handles.at("sparse"), "efsdp"));
  }
}

// A Parallel given by its degrees alone (no group layouts), or whose degrees changed after its
// layouts were read, is refused by name, never checked over groups that are not the degrees'.
TEST(StepGroups, DegreesWithoutTheirLayoutsAreRefused) {
  Job j = small_job({2, 1, 2, 1, 2}, 2);
  EXPECT_NO_THROW(layout(j));
  const Parallel bare{2, 1, 2, 1, 2};
  j.parallel = bare;
  try {
    layout(j);
    ADD_FAILURE() << "degrees without layouts were taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the job's pp groups have 1 ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("titan_parallel"), std::string::npos) << e.what();
  }
  j.parallel = laid({2, 1, 2, 1, 2});
  j.parallel.tp = 1;  // the same world, but the tp layout still makes groups of 2
  j.parallel.dp_shard = 4;
  EXPECT_THROW(layout(j), InvalidArgument);
  j.parallel = laid({2, 1, 2, 1, 2});
  j.parallel.groups[static_cast<std::size_t>(Dim::kFsdp)].stride[0] = 3;  // overlaps tp's
  EXPECT_THROW(check_step(j, {}), InvalidArgument);
  j.parallel = laid({2, 1, 2, 1, 2});
  j.parallel.groups[static_cast<std::size_t>(Dim::kTp)].modes = 6;
  EXPECT_THROW(check_step(j, {}), InvalidArgument);
}

TEST(StepGroups, AMemberIsNamedWithoutListingTheGroup) {
  const Parallel p = laid({2, 2, 4, 2, 2, 4});
  for (int d = 0; d < kDims; ++d) {
    const Dim dim = static_cast<Dim>(d);
    for (int64_t rank : {int64_t{0}, int64_t{37}, world_size(p) - 1}) {
      const auto members = group_members(p, dim, rank);
      ASSERT_EQ(static_cast<int64_t>(members.size()), dim_size(p, dim));
      for (std::size_t k = 0; k < members.size(); ++k) EXPECT_EQ(group_member(p, dim, rank, static_cast<int64_t>(k)), members[k]);
      EXPECT_THROW(group_member(p, dim, rank, dim_size(p, dim)), OutOfRange);
    }
  }
}

// A trace is bounded (ranks and events); past the bound it is refused, never built.
TEST(StepTrace, BoundedAndOneTrackPerRank) {
  StepSpec spec;
  spec.preset = "torchtitan:pp=2,dp_shard=2,tp=2";
  spec.model = "llama3-debugmodel";
  spec.seq_len = 256;
  spec.local_batch_size = 2;
  spec.microbatches = 2;
  spec.ranks = "0,5";
  const StepRun run = run_step(spec);
  const nlohmann::json t = trace_json(run, traced_ranks(run));
  std::set<int64_t> tids;
  for (const auto& e : t["traceEvents"]) tids.insert(e["tid"].get<int64_t>());
  EXPECT_EQ(tids, (std::set<int64_t>{0, 5}));
  spec.preset = "torchtitan:pp=16,dp_shard=64,tp=8";
  spec.model = "llama3-405b";
  spec.seq_len = 8192;
  spec.local_batch_size = 1;
  spec.microbatches = 32;
  spec.ranks = "0-300";
  const StepRun big = run_step(spec);
  EXPECT_THROW(trace_json(big, traced_ranks(big)), ResourceExhausted);
}

struct Count {
  int64_t calls = 0, bytes = 0;
};
Count count(const std::vector<Event>& prog, Dim d, Op op, Phase ph) {
  Count c;
  for (const Event& e : prog) {
    if (e.dim == d && e.op == op && e.phase == ph) {
      ++c.calls;
      c.bytes += e.bytes;
    }
  }
  return c;
}

// Closed forms for llama3-debugmodel (6 layers, dim 256, ffn 768, 16 heads of 16, vocab 2048),
// seq 256, local batch 2, dp_shard 2, tp 2, no pp: every size divides, so nothing is padded.
TEST(StepBytes, DebugModelMatchesClosedForms) {
  Job job = small_job({1, 1, 2, 1, 2});
  job.activation_checkpoint = Checkpoint::kNone;
  const auto prog = program(job, layout(job), 0);
  const int64_t layers = 6, dim = 256, ffn = 768, vocab = 2048, tp = 2, tokens = 2 * 256;
  const int64_t act = tokens * dim * 2;
  // TP with sequence parallel: per block an all-gather and a reduce-scatter around attention and
  // around the MLP, both ways; the embedding reduce-scatters (fwd), the lm_head gathers (fwd).
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllGather, Phase::kFwd).calls, 2 * layers + 1);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kReduceScatter, Phase::kFwd).calls, 2 * layers + 1);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllGather, Phase::kBwd).calls, 2 * layers + 1);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kReduceScatter, Phase::kBwd).calls, 2 * layers + 1);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllGather, Phase::kFwd).bytes, (2 * layers + 1) * act);
  // Loss parallel: three fp32 reductions per token.
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllReduce, Phase::kFwd).bytes, 3 * tokens * 4);
  // FSDP: each rank's tp shard of every unit gathered in bf16 in forward; in backward again for
  // the embeddings and blocks (resharded after forward), not the norm + lm_head unit.
  const int64_t block = ((16 + 2 * 16) * 16 * dim + 16 * 16 * dim + 3 * dim * ffn) / tp + 2 * dim;
  const int64_t embed = vocab * dim / tp, output = dim + vocab * dim / tp;
  EXPECT_EQ(count(prog, Dim::kFsdp, Op::kAllGather, Phase::kFwd).bytes, 2 * (embed + layers * block + output));
  EXPECT_EQ(count(prog, Dim::kFsdp, Op::kAllGather, Phase::kFwd).calls, layers + 2);
  EXPECT_EQ(count(prog, Dim::kFsdp, Op::kAllGather, Phase::kBwd).bytes, 2 * (embed + layers * block));
  // Gradients reduce-scattered once per unit in fp32.
  EXPECT_EQ(count(prog, Dim::kFsdp, Op::kReduceScatter, Phase::kBwd).bytes, 4 * (embed + layers * block + output));
  // The sum over ranks of what FSDP gathers is the model, sharded over tp (tp ranks hold halves).
  EXPECT_EQ((embed + layers * block + output) * tp - (2 * layers * dim + dim) * (tp - 1),
            parameter_count(job.model));
  // Sequence parallel: each norm's gradient (a replicated weight, partial over tp) all-reduced
  // over tp in bf16 before its unit's reduce-scatter: two a block, the final norm.
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllReduce, Phase::kBwd).calls, 2 * layers + 1);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllReduce, Phase::kBwd).bytes, (2 * layers + 1) * dim * 2);
  // The token count over the batch mesh; the grad norm: one fp32 norm per parameter tensor
  // (the embeddings, 7 a block with llama3's fused wqkv, the norm, the lm_head) over fsdp, then
  // tp; three metrics over the loss mesh, and no finite check over it (torchtitan 0.3.0 checks
  // on the rank).
  EXPECT_EQ(count(prog, Dim::kBatch, Op::kAllReduce, Phase::kTokens).calls, 1);
  EXPECT_EQ(count(prog, Dim::kFsdp, Op::kAllReduce, Phase::kOptimizer).calls, 1);
  EXPECT_EQ(count(prog, Dim::kFsdp, Op::kAllReduce, Phase::kOptimizer).bytes, (1 + 7 * layers + 2) * 4);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllReduce, Phase::kOptimizer).calls, 1);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllReduce, Phase::kOptimizer).bytes, (1 + 7 * layers + 2) * 4);
  EXPECT_EQ(count(prog, Dim::kLoss, Op::kAllReduce, Phase::kOptimizer).calls, 0);
  EXPECT_EQ(count(prog, Dim::kLoss, Op::kAllReduce, Phase::kMetrics).calls, 3);
  // torchtitan's default selective activation checkpointing runs each block's forward again in
  // backward, saving reduce-scatters' outputs but not all-gathers': the attention's and the
  // MLP's all-gathers are issued again (marked recomputed); full AC issues everything again.
  job.activation_checkpoint = Checkpoint::kSelective;
  const auto sac = program(job, layout(job), 0);
  EXPECT_EQ(count(sac, Dim::kTp, Op::kAllGather, Phase::kBwd).calls, 2 * layers + 1 + 2 * layers);
  EXPECT_EQ(count(sac, Dim::kTp, Op::kReduceScatter, Phase::kBwd).calls, 2 * layers + 1);
  EXPECT_EQ(std::count_if(sac.begin(), sac.end(), [](const Event& e) { return e.recompute; }), 2 * layers);
  job.activation_checkpoint = Checkpoint::kFull;
  const auto full = program(job, layout(job), 0);
  EXPECT_EQ(count(full, Dim::kTp, Op::kAllGather, Phase::kBwd).calls, 2 * layers + 1 + 2 * layers);
  EXPECT_EQ(count(full, Dim::kTp, Op::kReduceScatter, Phase::kBwd).calls, 2 * layers + 1 + 2 * layers);
  // Each mode is read once at the edge, case folded as torchtitan reads it; anything else is
  // refused naming the framework's default.
  EXPECT_EQ(parse_checkpoint("Full", Framework::kTorchtitan), Checkpoint::kFull);
  for (const Checkpoint c : {Checkpoint::kSelective, Checkpoint::kFull, Checkpoint::kNone}) {
    EXPECT_EQ(parse_checkpoint(checkpoint_name(c), Framework::kMegatron), c);
  }
  EXPECT_THROW(parse_checkpoint("sometimes", Framework::kTorchtitan), InvalidArgument);
  EXPECT_THROW(parse_checkpoint("", Framework::kMegatron), InvalidArgument);
}

// deepseek_v3's debug model (6 layers, the first dense; 8 experts of 256, top 3, 2 shared; MLA),
// seq 256, local batch 2: the MoE's collectives per layer as torchtitan's moe_sharding lays them.
TEST(StepBytes, MoeAllToAllsAndTpAsTorchtitanShardsThem) {
  Job job = small_job({1, 1, 2, 1, 2, 2});
  job.model = builtin_model("deepseek_v3-debugmodel");
  job.activation_checkpoint = Checkpoint::kNone;
  const int64_t moe_layers = 5, tokens = 2 * 256, dim = 256, top_k = 3, experts = 8;
  auto prog = program(job, layout(job), 0);
  // ep = 2: per MoE layer forward the token counts (int64 per expert), the dispatch and the
  // combine of the sequence shard's routed tokens; backward the combine's and the dispatch's.
  const Count fwd = count(prog, Dim::kEp, Op::kAllToAll, Phase::kFwd), bwd = count(prog, Dim::kEp, Op::kAllToAll, Phase::kBwd);
  const int64_t routed = tokens / 2 * top_k * dim * 2;
  EXPECT_EQ(fwd.calls, 3 * moe_layers);
  EXPECT_EQ(fwd.bytes, moe_layers * (experts * 8 + 2 * routed));
  EXPECT_EQ(bwd.calls, 2 * moe_layers);
  EXPECT_EQ(bwd.bytes, moe_layers * 2 * routed);
  // tp: attention's gather and reduce-scatter per layer, the dense layer's MLP, the shared
  // experts' per MoE layer; the embeddings and the lm_head once.
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllGather, Phase::kFwd).calls, 6 + 1 + moe_layers + 1);
  // The routed experts (4 a rank of 8) sharded over efsdp (dp_shard x tp / ep = 2), dim 0.
  const Count experts_ag = count(prog, Dim::kEfsdp, Op::kAllGather, Phase::kFwd);
  EXPECT_EQ(experts_ag.calls, moe_layers);
  EXPECT_EQ(experts_ag.bytes, moe_layers * (4 * 3 * 256 * 256) * 2);
  // ep = 1: no all-to-all; the MoE gathers its input over tp and reduce-scatters the routed and
  // the shared experts' outputs (and the mirror in backward).
  job.parallel = laid({1, 1, 2, 1, 2, 1});
  prog = program(job, layout(job), 0);
  EXPECT_EQ(count(prog, Dim::kEp, Op::kAllToAll, Phase::kFwd).calls, 0);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kReduceScatter, Phase::kFwd).calls, 1 + 6 + 1 + 2 * moe_layers);
  EXPECT_EQ(count(prog, Dim::kTp, Op::kAllGather, Phase::kBwd).calls, 6 + 1 + 2 * moe_layers + 1);
  // Selective AC saves the all-to-alls (torchtitan's comm_ops): none is issued again.
  job.parallel = laid({1, 1, 2, 1, 2, 2});
  job.activation_checkpoint = Checkpoint::kSelective;
  prog = program(job, layout(job), 0);
  EXPECT_EQ(count(prog, Dim::kEp, Op::kAllToAll, Phase::kBwd).calls, 2 * moe_layers);
  // Every rank agrees and the step progresses, with and without pp, exactly and by class; a
  // fault planted at a rank of an ep group is named.
  for (const Parallel p : {Parallel{1, 1, 2, 1, 2, 4}, Parallel{2, 1, 2, 1, 2, 2}, Parallel{2, 2, 2, 1, 1, 2}}) {
    Job j = small_job(p, p.pp > 1 ? 4 : 1);
    j.model = builtin_model("deepseek_v3-debugmodel");
    EXPECT_TRUE(check_step(j, {}).ok);
    EXPECT_TRUE(check_step(j, {.all_ranks = true}).ok);
    const Report bad = check_step(j, {.faults = {{FaultKind::kSwap, 3}}, .all_ranks = true});
    EXPECT_FALSE(bad.ok);
    EXPECT_TRUE(names(bad, 3)) << bad.diagnosis;
  }
}

// With pp, stage s's rank gathers its units once (pipelining keeps them unsharded), reduces
// them on its last backward, and sends each microbatch's activation (its SP shard) forward.
TEST(StepBytes, PipelineStagesGatherOnceAndSendEachMicrobatch) {
  const Job job = small_job({2, 1, 2, 1, 2}, 4);
  const StageLayout l = layout(job);
  ASSERT_EQ(l.stages, 2);
  // torchtitan's split: 6 layers + 1 + 1 effective over 2 stages: 4 each, less one each end.
  EXPECT_EQ(l.layer_count, (std::vector<int64_t>{3, 3}));
  const auto first = program(job, l, 0), last = program(job, l, 1);
  EXPECT_EQ(count(first, Dim::kFsdp, Op::kAllGather, Phase::kFwd).calls, 1 + 3);
  EXPECT_EQ(count(first, Dim::kFsdp, Op::kAllGather, Phase::kBwd).calls, 0);
  EXPECT_EQ(count(last, Dim::kFsdp, Op::kReduceScatter, Phase::kBwd).calls, 3 + 1);
  const Count sends = count(first, Dim::kPp, Op::kSend, Phase::kFwd);
  EXPECT_EQ(sends.calls, 4);
  EXPECT_EQ(sends.bytes, 4 * (2 * 256 * 256 * 2 / 2));
  EXPECT_EQ(count(last, Dim::kPp, Op::kRecv, Phase::kFwd).calls, 4);
  EXPECT_EQ(count(last, Dim::kPp, Op::kSend, Phase::kBwd).calls, 4);
  // Only the last stage runs the loss's reductions.
  EXPECT_EQ(count(first, Dim::kTp, Op::kAllReduce, Phase::kFwd).calls, 0);
  EXPECT_EQ(count(last, Dim::kTp, Op::kAllReduce, Phase::kFwd).calls, 3 * 4);
}

// torchtitan's ChunkedLossWrapper (loss.num_chunks): loss parallel's three reductions per chunk
// (the same bytes in all), the lm_head's gradients reduce-scattered at the last chunk (in
// forward), its unit resharded and so gathered again in backward, where the norm's reduce alone.
TEST(StepBytes, ChunkedLossReducesTheLmHeadInForward) {
  Job job = small_job({1, 1, 2, 1, 2});
  job.activation_checkpoint = Checkpoint::kNone;
  const auto whole = program(job, layout(job), 0);
  job.loss_chunks = 8;
  const auto chunked = program(job, layout(job), 0);
  const int64_t dim = 256, vocab = 2048, tp = 2, tokens = 2 * 256;
  EXPECT_EQ(count(whole, Dim::kTp, Op::kAllReduce, Phase::kFwd).calls, 3);
  EXPECT_EQ(count(chunked, Dim::kTp, Op::kAllReduce, Phase::kFwd).calls, 3 * 8);
  EXPECT_EQ(count(chunked, Dim::kTp, Op::kAllReduce, Phase::kFwd).bytes, 3 * tokens * 4);
  const Count lm_head = count(chunked, Dim::kFsdp, Op::kReduceScatter, Phase::kFwd);
  EXPECT_EQ(lm_head.calls, 1);
  EXPECT_EQ(lm_head.bytes, 4 * vocab * dim / tp);
  // Every gradient reduced once all the same; the output unit gathered once more.
  EXPECT_EQ(lm_head.bytes + count(chunked, Dim::kFsdp, Op::kReduceScatter, Phase::kBwd).bytes,
            count(whole, Dim::kFsdp, Op::kReduceScatter, Phase::kBwd).bytes);
  EXPECT_EQ(count(chunked, Dim::kFsdp, Op::kAllGather, Phase::kBwd).bytes -
                count(whole, Dim::kFsdp, Op::kAllGather, Phase::kBwd).bytes,
            2 * (dim + vocab * dim / tp));
  // The lm_head's reduction follows the last chunk's reductions, before any backward event.
  std::size_t rs = 0, last_loss = 0, first_bwd = whole.size();
  for (std::size_t k = 0; k < chunked.size(); ++k) {
    const Event& e = chunked[k];
    if (e.op == Op::kReduceScatter && e.dim == Dim::kFsdp && e.phase == Phase::kFwd) rs = k;
    if (e.op == Op::kAllReduce && e.dim == Dim::kTp && e.phase == Phase::kFwd) last_loss = k;
    if (e.phase == Phase::kBwd && first_bwd == whole.size()) first_bwd = k;
  }
  EXPECT_GT(rs, last_loss);
  EXPECT_LT(rs, first_bwd);
  // A sequence the chunks do not divide is refused, as torchtitan's wrapper does.
  job.loss_chunks = 3;
  EXPECT_THROW(program(job, layout(job), 0), InvalidArgument);
}

// FSDP's implicit backward prefetch: at a unit's pre-backward the next unit (in backward order)
// is gathered, so a block's all-gather comes before the reduce-scatter of the block after it.
TEST(StepBytes, BackwardPrefetchGathersTheNextUnitFirst) {
  Job job = small_job({1, 1, 2, 1, 1});
  job.activation_checkpoint = Checkpoint::kNone;
  const auto prog = program(job, layout(job), 0);
  std::vector<std::pair<Op, int32_t>> bwd;
  for (const Event& e : prog) {
    if (e.phase == Phase::kBwd && e.dim == Dim::kFsdp) bwd.emplace_back(e.op, e.layer);
  }
  // output unit (kept unsharded) reduces after block 5 is gathered; then gather 4, reduce 5, ...
  ASSERT_EQ(bwd.size(), 2u * 6 + 1 + 2);
  EXPECT_EQ(bwd[0], std::make_pair(Op::kAllGather, int32_t{5}));
  EXPECT_EQ(bwd[1], std::make_pair(Op::kReduceScatter, int32_t{-1}));
  for (int32_t l = 5; l >= 1; --l) {
    EXPECT_EQ(bwd[2 + 2 * (5 - l)], std::make_pair(Op::kAllGather, l - 1));
    EXPECT_EQ(bwd[3 + 2 * (5 - l)], std::make_pair(Op::kReduceScatter, l));
  }
  EXPECT_EQ(bwd[12], std::make_pair(Op::kAllGather, int32_t{-1}));  // the embeddings
  EXPECT_EQ(bwd[13], std::make_pair(Op::kReduceScatter, int32_t{0}));
  EXPECT_EQ(bwd[14], std::make_pair(Op::kReduceScatter, int32_t{-1}));
}

// Under 1F1B the step's sends and receives are posted as PyTorch's loop posts them: rank 0's
// held forward send with each backward's receive, rank 1's backward send with the next forward's
// receive, each pair one batch; the step progresses under rendezvous sends only because a batch
// is posted whole (torch:schedules holds the order to Schedule1F1B itself).
TEST(StepBytes, OneFOneBPairsItsSendsAndReceivesInBatches) {
  const Job job = small_job({2, 1, 1, 1, 1}, 4);
  const StageLayout l = layout(job);
  EXPECT_EQ(l.lowering, "step_microbatches");
  for (int64_t pp = 0; pp < 2; ++pp) {
    std::vector<std::string> p2p;
    for (const Event& e : program(job, l, pp)) {
      if (e.op == Op::kSend || e.op == Op::kRecv) {
        p2p.push_back(std::string(e.op == Op::kSend ? "send" : "recv") + (e.phase == Phase::kFwd ? "F" : "B") +
                      std::to_string(e.microbatch) + (e.batch >= 0 ? "#" + std::to_string(e.batch) : ""));
      }
    }
    if (pp == 0) {
      EXPECT_EQ(p2p, (std::vector<std::string>{"sendF0", "sendF1#0", "recvB0#0", "sendF2#1", "recvB1#1", "sendF3#2", "recvB2#2",
                                               "recvB3"}));
    } else {
      EXPECT_EQ(p2p, (std::vector<std::string>{"recvF0", "sendB0#0", "recvF1#0", "sendB1#1", "recvF2#1", "sendB2#2", "recvF3#2",
                                               "sendB3"}));
    }
  }
  EXPECT_TRUE(check_step(job, {.all_ranks = true}).ok);
  EXPECT_TRUE(check_step(job, {.semantics = SendSemantics::kEager, .all_ranks = true}).ok);
}

// ZBVZeroBubble places stages in a "v": rank 0 holds the first and the last stage, so rank 0
// runs the loss, and the middle rank sends to itself nothing (its two stages meet locally).
TEST(StepBytes, ZbvPutsTheLossOnRankZero) {
  const Job job = small_job({2, 1, 1, 1, 2}, 4, "ZBVZeroBubble");
  const StageLayout l = layout(job);
  ASSERT_EQ(l.stages, 4);
  EXPECT_EQ(l.layer_count, (std::vector<int64_t>{1, 2, 2, 1}));  // 8 effective layers over 4
  const auto first = program(job, l, 0), second = program(job, l, 1);
  EXPECT_EQ(count(first, Dim::kTp, Op::kAllReduce, Phase::kFwd).calls, 3 * 4);
  EXPECT_EQ(count(second, Dim::kTp, Op::kAllReduce, Phase::kFwd).calls, 0);
  // Rank 0 sends stage 0's activations to rank 1 and stage 3's gradients back to it, and
  // receives stage 2's activations and stage 1's gradients: 4 microbatches each.
  EXPECT_EQ(count(first, Dim::kPp, Op::kSend, Phase::kFwd).calls, 4);
  EXPECT_EQ(count(first, Dim::kPp, Op::kSend, Phase::kBwd).calls, 4);
  EXPECT_EQ(count(second, Dim::kPp, Op::kSend, Phase::kFwd).calls, 4);
  for (const Event& e : first) {
    if (e.op == Op::kSend || e.op == Op::kRecv) EXPECT_EQ(e.peer, 1);
  }
  EXPECT_TRUE(check_step(job, {.all_ranks = true}).ok);
}

// torch.utils.checkpoint (non-reentrant, torchtitan's FullAC and SelectiveAC) recomputes a block
// at the first op of its backward that unpacks a saved tensor: the gradient of the FFN's output
// reduce-scatter (an all-gather over tp) needs none and comes first. Held to torchtitan's own
// Trainer in torch:step_real (moe_fsdp2_tp2_ep2_full_ac); here each policy's order by hand.
TEST(StepBytes, ACheckpointedBlocksBackwardStartsBeforeItsRecompute) {
  Job job = small_job({1, 1, 2, 1, 2});
  using Seen = std::tuple<Op, std::string, bool>;
  auto last_block = [&](Checkpoint ac) {
    job.activation_checkpoint = ac;
    std::vector<Seen> seen;
    for (const Event& e : program(job, layout(job), 0)) {
      if (e.phase == Phase::kBwd && e.dim == Dim::kTp && e.layer == 5 && e.op != Op::kAllReduce) {
        seen.emplace_back(e.op, e.what, e.recompute);
      }
    }
    return seen;
  };
  const Op ag = Op::kAllGather, rs = Op::kReduceScatter;
  EXPECT_EQ(last_block(Checkpoint::kFull),
            (std::vector<Seen>{{ag, "mlp", false}, {ag, "attention", true}, {rs, "attention", true}, {ag, "mlp", true},
                               {rs, "mlp", true}, {rs, "mlp", false}, {ag, "attention", false}, {rs, "attention", false}}));
  EXPECT_EQ(last_block(Checkpoint::kSelective),
            (std::vector<Seen>{{ag, "mlp", false}, {ag, "attention", true}, {ag, "mlp", true}, {rs, "mlp", false},
                               {ag, "attention", false}, {rs, "attention", false}}));
  EXPECT_EQ(last_block(Checkpoint::kNone),
            (std::vector<Seen>{{ag, "mlp", false}, {rs, "mlp", false}, {ag, "attention", false}, {rs, "attention", false}}));
  // An MoE block with shared experts ends in their reduce-scatter: its gradient leads.
  job.model = builtin_model("deepseek_v3-debugmodel");
  job.parallel = laid({1, 1, 2, 1, 2, 2});
  const auto moe = last_block(Checkpoint::kFull);
  ASSERT_GE(moe.size(), 2u);
  EXPECT_EQ(moe[0], (Seen{ag, "shared_experts", false}));
  EXPECT_EQ(moe[1], (Seen{ag, "attention", true}));
}

// A zero-bubble schedule's I computes no weight gradient and its W sets them on the weights the
// forward used, which ChunkedLossWrapper has resharded since: FSDP reduces no gradient of the
// final norm in the step (the wrapper's reductions hold the lm_head alone, the stage's
// REDUCE_GRAD nothing of the norm), and clip_grad_norm_ counts one tensor fewer. 1F1B's full
// backward does: the wrapper reduces the norm's gradient with the next microbatch's lm_head.
// Both held to torchtitan's own Trainer in torch:step_real (pp2_fsdp2_zbv, pp2_fsdp2_tp2_1f1b).
TEST(StepBytes, AZeroBubbleStepReducesNoGradientOfTheFinalNorm) {
  const int64_t vocab = 2048, dim = 256, lm_head = 4 * vocab * dim, norm = 4 * dim;
  auto reductions = [&](const std::vector<Event>& prog) {
    std::vector<int64_t> b;
    for (const Event& e : prog) {
      if (e.dim == Dim::kFsdp && e.op == Op::kReduceScatter && e.layer < 0 && e.stage == 3) b.push_back(e.bytes);
    }
    return b;
  };
  auto grad_norm = [](const std::vector<Event>& prog) {
    for (const Event& e : prog) {
      if (e.dim == Dim::kFsdp && e.phase == Phase::kOptimizer) return e.bytes;
    }
    return int64_t{-1};
  };
  Job job = small_job({2, 1, 2, 1, 1}, 4, "ZBVZeroBubble");
  job.activation_checkpoint = Checkpoint::kNone;
  job.loss_chunks = 8;
  const auto zbv = program(job, layout(job), 0);  // rank 0 holds stages 0 and 3
  EXPECT_EQ(reductions(zbv), (std::vector<int64_t>{lm_head, lm_head, lm_head, lm_head}));
  // The embeddings, two blocks of 7 tensors and the lm_head: 16 norms (the final norm left out).
  EXPECT_EQ(grad_norm(zbv), 16 * 4);
  EXPECT_TRUE(check_step(job, {.all_ranks = true}).ok);
  // 1F1B, one stage a rank: the last stage (3 layers) is stage 1.
  job.schedule = "1F1B";
  const auto one = program(job, layout(job), 1);
  std::vector<int64_t> b;
  for (const Event& e : one) {
    if (e.dim == Dim::kFsdp && e.op == Op::kReduceScatter && e.layer < 0) b.push_back(e.bytes);
  }
  EXPECT_EQ(b, (std::vector<int64_t>{lm_head, lm_head + norm, lm_head + norm, lm_head + norm, norm}));
  EXPECT_EQ(grad_norm(one), (3 * 7 + 2) * 4);
}

// With ep > 1 torchtitan sets FSDP's forward prefetch explicitly (distributed/fsdp.py
// apply_fsdp): each unit's pre-forward gathers the next before its own collectives, so a block's
// all-to-alls follow the next block's gather. The combine's input and the dispatch's gradient are
// the tokens the router sent (their bytes follow the routing); clip_grad_norm_ norms the routed
// experts apart (_clip_grad_norm_with_ep) and the optimizer's pre-step hook all-reduces the
// tokens per expert (_update_expert_bias). Held to the real Trainer in torch:step_real.
TEST(StepBytes, ExpertParallelPrefetchesNormsAndBalancesAsTorchtitan) {
  Job job = small_job({1, 1, 2, 1, 1, 2});
  job.model = builtin_model("deepseek_v3-debugmodel");
  auto prog = program(job, layout(job), 0);
  std::vector<std::pair<std::string, int32_t>> fwd;
  for (const Event& e : prog) {
    if (e.phase != Phase::kFwd) continue;
    if (e.dim == Dim::kFsdp && e.op == Op::kAllGather) fwd.emplace_back("gather", e.layer);
    if (e.dim == Dim::kEp && std::string_view(e.what) == "moe_counts") fwd.emplace_back("counts", e.layer);
    if (e.op == Op::kAllToAll) EXPECT_EQ(e.routed, std::string_view(e.what) == "moe_combine") << describe(e);
  }
  using P = std::pair<std::string, int32_t>;
  EXPECT_EQ(fwd, (std::vector<P>{{"gather", -1}, {"gather", 0}, {"gather", 1}, {"gather", 2}, {"counts", 1}, {"gather", 3},
                                 {"counts", 2}, {"gather", 4}, {"counts", 3}, {"gather", 5}, {"counts", 4}, {"gather", -1},
                                 {"counts", 5}}));
  for (const Event& e : prog) {
    if (e.phase == Phase::kBwd && e.op == Op::kAllToAll) EXPECT_EQ(e.routed, std::string_view(e.what) == "moe_dispatch");
  }
  // dp_shard 2 x tp 2, ep 2 (efsdp 2): 5 MoE layers' 15 expert tensors over efsdp then ep, the
  // other 68 over fsdp then tp; the 5 x 8 tokens per expert over tp, then the loss mesh.
  job.parallel = laid({1, 1, 2, 1, 2, 2});
  using O = std::tuple<Dim, int64_t, std::string>;
  auto optimizer = [&] {
    std::vector<O> o;
    for (const Event& e : program(job, layout(job), 0)) {
      if (e.phase == Phase::kOptimizer) o.emplace_back(e.dim, e.bytes, e.what);
    }
    return o;
  };
  EXPECT_EQ(optimizer(), (std::vector<O>{{Dim::kEfsdp, 60, "expert_grad_norm"}, {Dim::kEp, 60, "expert_grad_norm"},
                                         {Dim::kFsdp, 272, "grad_norm"}, {Dim::kTp, 272, "grad_norm"},
                                         {Dim::kTp, 160, "expert_bias"}, {Dim::kLoss, 160, "expert_bias"}}));
  job.model.load_balance = false;  // load_balance_coeff None: no hook
  EXPECT_EQ(optimizer().size(), 4u);
  // The routed experts' parameter group runs first in backward: gathered, then reduced, before
  // the block's other parameters; under sequence parallel the gradients of what TP leaves whole
  // (MLA's wkv_a and kv_norm, the two norms, the router's gate) all-reduced over tp, in order.
  job.model.load_balance = true;
  using B = std::tuple<Dim, Op, int64_t>;
  std::vector<B> bwd;
  for (const Event& e : program(job, layout(job), 0)) {
    if (e.phase != Phase::kBwd || e.layer != 3) continue;
    if (e.dim == Dim::kFsdp || e.dim == Dim::kEfsdp || (e.dim == Dim::kTp && e.op == Op::kAllReduce)) {
      bwd.emplace_back(e.dim, e.op, e.dim == Dim::kTp ? e.bytes : 0);
    }
  }
  EXPECT_EQ(bwd, (std::vector<B>{{Dim::kEfsdp, Op::kAllGather, 0}, {Dim::kFsdp, Op::kAllGather, 0},
                                 {Dim::kEfsdp, Op::kReduceScatter, 0}, {Dim::kTp, Op::kAllReduce, 576 * 256 * 2},
                                 {Dim::kTp, Op::kAllReduce, 512 * 2}, {Dim::kTp, Op::kAllReduce, 256 * 2},
                                 {Dim::kTp, Op::kAllReduce, 256 * 2}, {Dim::kTp, Op::kAllReduce, 8 * 256 * 2},
                                 {Dim::kFsdp, Op::kReduceScatter, 0}}));
  EXPECT_TRUE(check_step(job, {.all_ranks = true}).ok);
}

TEST(StepLayout, RefusesWhatTorchtitanRefuses) {
  Job j = small_job({2, 1, 2, 1, 2}, 4);
  j.stages_per_rank = 2;
  EXPECT_THROW(
      {
        try {
          layout(j);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("Single stage schedule requires exactly 1 stage per rank"), std::string::npos);
          throw;
        }
      },
      InvalidArgument);
  j = small_job({2, 1, 1, 1, 1}, 4, "Interleaved1F1B");
  j.stages_per_rank = 1;
  EXPECT_THROW(layout(j), InvalidArgument);  // Multi-stage schedule requires at least 2 stages per rank
  j = small_job({8, 1, 1, 1, 1}, 8);
  j.stages_per_rank = 0;
  j.schedule = "Interleaved1F1B";  // 16 stages > 6 + 2 effective layers
  EXPECT_THROW(layout(j), InvalidArgument);
  j = small_job({2, 1, 1, 1, 1}, 4, "ZBVZeroBubble");
  j.stages_per_rank = 3;
  EXPECT_THROW(layout(j), InvalidArgument);  // ZBV requires exactly 2 stages per rank
  j = small_job({2, 1, 1, 1, 1}, 4, "DualPipeV");
  EXPECT_THROW(layout(j), InvalidArgument);  // not built: read it from a CSV
  j = small_job({1, 1, 2, 1, 1, 2});  // ep without experts
  EXPECT_THROW(layout(j), InvalidArgument);
  j.model = builtin_model("deepseek_v3-debugmodel");
  EXPECT_NO_THROW(layout(j));
  j.parallel = laid({1, 1, 3, 1, 1, 3});  // 8 experts over ep 3
  EXPECT_THROW(layout(j), InvalidArgument);
  j = small_job({1, 1, 1, 1, 32});  // 16 heads over tp 32
  EXPECT_THROW(layout(j), InvalidArgument);
  j = small_job({1, 1, 1, 4, 2});
  j.seq_len = 24;  // not a multiple of 2 x cp x tp = 16
  EXPECT_THROW(layout(j), InvalidArgument);
  j = small_job({1, 1, 1, 1, 1});
  for (const Reshard r : {Reshard::kDefault, Reshard::kAlways, Reshard::kNever}) EXPECT_EQ(parse_reshard(reshard_name(r)), r);
  EXPECT_EQ(parse_reshard("NEVER"), Reshard::kNever);
  EXPECT_THROW(parse_reshard("sometimes"), InvalidArgument);
  j = small_job({1, 1, 1, 1, 1});
  j.seq_len = int64_t{1} << 40;
  EXPECT_THROW(layout(j), InvalidArgument);
  j = small_job({1, 1, 1, 1, 1});
  j.microbatches = 0;  // torchtitan: num_pp_microbatches must be greater than 0, pp or not
  EXPECT_THROW(layout(j), InvalidArgument);
  j = small_job({16, 1, int64_t{1} << 16, 1, 8});  // 2^23 ranks: over the bound, refused up front
  EXPECT_THROW(layout(j), ResourceExhausted);
  j = small_job({1, 1, 1, 1, 1});
  j.model.layers = int64_t{1} << 20;
  EXPECT_THROW(layout(j), InvalidArgument);
  j = small_job({1, 1, 1, 1, 1});
  j.local_batch_size = int64_t{1} << 32;
  j.seq_len = int64_t{1} << 32;
  EXPECT_THROW(check_step(j, {}), OverflowError);
  // A lowered CSV is held to PyTorch's validation of its compute actions: a stage on the wrong
  // rank, or a microbatch run twice, is refused before any program is built.
  j = small_job({2, 1, 1, 1, 1}, 2);
  j.schedule_override = read_csv("0F0,0SEND_F0,1F1\n1RECV_F0,1F0,1B0\n", 2, 2, true);
  EXPECT_THROW(layout(j), InvalidArgument);
  j.schedule_override = read_csv("0F0,0SEND_F0,0F0\n1RECV_F0,1F0,1B0\n", 2, 2, true);
  EXPECT_THROW(layout(j), InvalidArgument);
  EXPECT_THROW(parse_fault("skip"), InvalidArgument);
  EXPECT_THROW(parse_fault("drop@3"), InvalidArgument);
  EXPECT_THROW(parse_fault("skip@99999999999999999999"), OverflowError);
  EXPECT_THROW(check_step(small_job({1, 1, 2, 1, 2}), {.faults = {{FaultKind::kSkip, 4}}}), OutOfRange);
  EXPECT_THROW(check_step(small_job({1, 1, 2, 1, 2}), {.faults = {{FaultKind::kWrongPeer, 1}}}), InvalidArgument);
}

TEST(StepCheck, HealthyJobsPassExactlyAndByClass) {
  for (const auto& [p, sched, m] : std::vector<std::tuple<Parallel, std::string, int64_t>>{
           {{1, 1, 2, 1, 2}, "1F1B", 1},
           {{2, 2, 2, 1, 2}, "1F1B", 4},
           {{4, 1, 2, 1, 1}, "GPipe", 4},
           {{2, 1, 2, 2, 2}, "Interleaved1F1B", 4},
           {{3, 1, 1, 1, 2}, "1F1B", 5},
           {{2, 1, 2, 1, 2}, "ZBVZeroBubble", 4},
           {{3, 1, 1, 1, 2}, "ZBVZeroBubble", 2},
           {{2, 1, 1, 2, 2}, "LoopedBFS", 3},
           {{2, 2, 1, 1, 2}, "InterleavedZeroBubble", 4}}) {
    SCOPED_TRACE(sched);
    const Job job = small_job(p, m, sched);
    const Report byclass = check_step(job, {});
    EXPECT_TRUE(byclass.ok) << byclass.diagnosis;
    EXPECT_EQ(byclass.programs, p.pp);
    const Report exact = check_step(job, {.all_ranks = true});
    EXPECT_TRUE(exact.ok) << exact.diagnosis;
    EXPECT_EQ(exact.ranks_simulated, world_size(p));
    EXPECT_TRUE(check_step(job, {.semantics = SendSemantics::kEager}).ok);
  }
}

// Every planted fault, at random ranks of random small jobs, ends in a diagnosis naming the
// rank — by the class check and by simulating every rank.
TEST(StepCheck, PlantedFaultsNameTheRank) {
  std::mt19937_64 rng(20261127);
  const std::vector<Parallel> shapes = {{2, 1, 2, 1, 2}, {4, 1, 2, 1, 1}, {2, 2, 1, 2, 2}, {3, 1, 2, 1, 2}};
  int planted = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const Parallel p = shapes[trial % shapes.size()];
    const char* schedules[] = {"1F1B", "GPipe", "ZBVZeroBubble"};
    // At least pp microbatches: PyTorch's Schedule1F1B refuses fewer.
    const Job job = small_job(p, std::max<int64_t>(2 + trial % 3, p.pp), schedules[trial % 3]);
    const int64_t world = world_size(p);
    const auto kind = static_cast<FaultKind>(trial % 4);
    const int64_t rank = static_cast<int64_t>(rng() % static_cast<uint64_t>(world));
    for (bool all : {false, true}) {
      SCOPED_TRACE(testing::Message() << "trial " << trial << " kind " << static_cast<int>(kind) << " rank " << rank
                                      << (all ? " exact" : " by class"));
      const Report r = check_step(job, {.faults = {{kind, rank}}, .all_ranks = all});
      EXPECT_FALSE(r.ok);
      EXPECT_TRUE(names(r, rank)) << r.diagnosis;
      EXPECT_EQ(r.diagnosis.rfind("FAILED: ", 0), 0u) << r.diagnosis;
      EXPECT_EQ(r.diagnosis.find('\n'), std::string::npos);
      ++planted;
    }
  }
  EXPECT_EQ(planted, 48);
}

// pytorch/pytorch#172668: two pipeline ranks each send before they receive; under rendezvous
// both wait in their sends, under eager it runs.
TEST(StepCheck, BlockingSendDeadlockFoundUnderRendezvousOnly) {
  Job job = small_job({2, 1, 1, 1, 2}, 2);
  job.schedule_override = read_csv(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n",
      2, 2, true);
  const Report r = check_step(job, {});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.ranks, (std::vector<int64_t>{0, 2}));
  EXPECT_NE(r.diagnosis.find("rank 0 waits in its send to rank 2"), std::string::npos) << r.diagnosis;
  EXPECT_NE(r.diagnosis.find("rank 2 waits in its send to rank 0"), std::string::npos) << r.diagnosis;
  EXPECT_TRUE(check_step(job, {.semantics = SendSemantics::kEager}).ok);
  EXPECT_FALSE(check_step(job, {.all_ranks = true}).ok);
}

// Bytes per link: with one GPU per host every byte crosses hosts; with the world on one host none.
TEST(StepBytes, LinksSplitByHost) {
  const Job job = small_job({2, 1, 2, 1, 2}, 2);
  const Report spread = check_step(job, {.gpus_per_host = 1});
  ASSERT_TRUE(spread.by_link);
  EXPECT_EQ(spread.by_link->intra_host, 0);
  EXPECT_GT(spread.by_link->inter_host, 0);
  const Report one = check_step(job, {.gpus_per_host = 8});
  EXPECT_EQ(one.by_link->inter_host, 0);
  EXPECT_EQ(one.by_link->intra_host, spread.by_link->inter_host);
  // tp pairs (2 ranks) on 2-GPU hosts stay inside; pp pairs (ranks 4 apart) cross.
  const Report pairs = check_step(job, {.gpus_per_host = 2});
  EXPECT_EQ(pairs.link_by_dim.at("tp").inter_host, 0);
  EXPECT_EQ(pairs.link_by_dim.at("pp").intra_host, 0);
  // The tp ring of 2: each rank sends half of each all-gather's output; summed over the world.
  int64_t tp_sent = 0;
  for (int64_t pp = 0; pp < 2; ++pp) {
    for (const Event& e : program(job, layout(job), pp)) {
      if (e.dim == Dim::kTp) tp_sent += e.op == Op::kAllReduce ? e.bytes : e.bytes / 2;
    }
  }
  EXPECT_EQ(pairs.link_by_dim.at("tp").intra_host, tp_sent * 4);  // 4 ranks per pp coordinate
}

}  // namespace
}  // namespace meshsim::step

namespace meshsim::step {
namespace {

// ---- Megatron-core's step -------------------------------------------------------------------

StepSpec megatron_spec(const std::string& preset, const std::string& model = "llama3-debugmodel", int64_t microbatches = 4) {
  StepSpec s;
  s.preset = preset;
  s.model = model;
  s.seq_len = 1024;
  s.local_batch_size = 1;
  s.microbatches = microbatches;
  return s;
}

int64_t calls(const Report& r, const std::string& dim, const std::string& op) {
  auto d = r.by_dim.find(dim);
  if (d == r.by_dim.end()) return 0;
  auto o = d->second.find(op);
  return o == d->second.end() ? 0 : o->second.calls;
}
int64_t bytes(const Report& r, const std::string& dim, const std::string& op) {
  auto d = r.by_dim.find(dim);
  if (d == r.by_dim.end()) return 0;
  auto o = d->second.find(op);
  return o == d->second.end() ? 0 : o->second.bytes;
}

TEST(MegatronStep, GroupsMatchTheMegatronPresetViews) {
  // Megatron's default order and others the preset accepts (pp not last among them): the step
  // lays the ranks out by the preset's own views (megatron_parallel), so every dim's groups are
  // the views' groups.
  for (const std::string preset :
       {"megatron:tp=2,pp=2,cp=2,dp=2", "megatron:tp=4,pp=2,dp=2,ep=4,etp=1", "megatron:tp=2,cp=2,dp=4,ep=2,etp=1",
        "megatron:pp=4,dp=2", "megatron:tp=2,pp=2,cp=2,dp=2,order=tp-dp-cp-pp",
        "megatron:tp=2,pp=2,cp=2,dp=2,order=cp-tp-dp-pp", "megatron:tp=2,pp=2,dp=2,order=tp-pp-dp",
        "megatron:tp=2,pp=2,dp=3,order=pp-tp-dp", "megatron:tp=2,pp=2,dp=4,ep=2,etp=1,order=tp-ep-dp-pp",
        "megatron:tp=2,pp=2,cp=2,dp=2,ep=4,etp=1,order=ep-tp-dp-cp-pp"}) {
    SCOPED_TRACE(preset);
    const preset::Megatron mg = preset::megatron_spec(preset);
    const BuiltMeshes b = apply(preset::megatron_recipe(mg, std::nullopt));
    const Parallel p = megatron_parallel(mg, std::nullopt);
    EXPECT_EQ(p.dp_shard, *mg.dp);
    auto ours = [&](Dim d) { return groups_of(p, d); };
    const auto& theirs = view_groups;
    EXPECT_EQ(ours(Dim::kTp), theirs(b.handles.at("dense"), "tp"));
    EXPECT_EQ(ours(Dim::kCp), theirs(b.handles.at("dense"), "cp"));
    EXPECT_EQ(ours(Dim::kPp), theirs(b.handles.at("dense"), "pp"));
    EXPECT_EQ(ours(Dim::kBatch), theirs(b.handles.at("dense"), "dp"));
    EXPECT_EQ(ours(Dim::kFsdp), theirs(b.handles.at("dp_cp"), "dp_cp"));
    EXPECT_EQ(ours(Dim::kMp), theirs(b.handles.at("mp"), "mp"));
    if (mg.etp.value_or(mg.tp) == 1) {  // the expert view meshsim step lays out (expert tp 1)
      EXPECT_EQ(ours(Dim::kEp), theirs(b.handles.at("expert"), "ep"));
      EXPECT_EQ(ours(Dim::kEfsdp), theirs(b.handles.at("expert"), "edp"));
    }
    EXPECT_EQ(ours(Dim::kWorld).size(), 1u);
  }
}

TEST(MegatronStep, TheDistributedOptimizersBucketIsTheStagesParametersPadded) {
  // llama3-8b at tp=2, dp=4, no pp: one bucket (overlap_grad_reduce off) of this rank's
  // parameters, every one a multiple of 64 elements, its end padded to lcm(4, 128) = 128:
  // the embedding and the output layer over a vocabulary padded to 128 x tp (128256 = 501 x 256),
  // per layer two norms, QKV ((32 + 2 x 8) heads x 128 / 2), the projection, SwiGLU's fc1 (2 x
  // 14336 / 2) and fc2, and the final norm. Reduce-scattered over dp x cp in fp32 (under --bf16
  // Megatron-LM reduces gradients in fp32 unless --grad-reduce-in-bf16), then gathered in bf16.
  StepSpec s = megatron_spec("megatron:tp=2,dp=4", "llama3-8b", 1);
  s.seq_len = 8192;
  const StepRun run = run_step(s);
  ASSERT_TRUE(run.report.ok) << run.report.diagnosis;
  const int64_t D = 4096;
  const int64_t layer = 2 * D + 3072 * D + D * 2048 + 2 * 7168 * D + D * 7168;
  const int64_t params = 2 * (128256 / 2) * D + 32 * layer + D;
  const int64_t padded = (params + 127) / 128 * 128;
  EXPECT_EQ(bytes(run.report, "dp_cp", "reduce_scatter"), padded * 4);
  EXPECT_EQ(bytes(run.report, "dp_cp", "all_gather"), padded * 2);
  EXPECT_EQ(calls(run.report, "dp_cp", "reduce_scatter"), 1);
  // The sequence-parallel norms' gradients: one all-reduce over tp of 2 x 32 + 1 norms, fp32
  // slices of the gradient buffer, beside the loss's 3 (fp32, one per token).
  EXPECT_EQ(calls(run.report, "tp", "all_reduce"), 1 + 3);
  EXPECT_EQ(bytes(run.report, "tp", "all_reduce"), (2 * 32 + 1) * D * 4 + 3 * 8192 * 4);
  // The rerun state machine's int32 and the gradient norm over the world; update_successful and
  // the norm's max over mp.
  EXPECT_EQ(calls(run.report, "world", "all_reduce"), 2);
  EXPECT_EQ(calls(run.report, "mp", "all_reduce"), 2);
  EXPECT_EQ(calls(run.report, "dp_cp", "all_reduce"), 1);  // the loss report
}

TEST(MegatronStep, SequenceParallelCollectivesPerMicrobatch) {
  // No pp, 3 microbatches, 6 layers: per microbatch each layer gathers twice forward (QKV, fc1)
  // and four times backward (the projection's and fc2's output gradients, QKV's and fc1's
  // inputs again), reduce-scatters twice each way; the embedding reduce-scatters forward and
  // gathers backward; the output layer gathers forward, gathers and reduce-scatters backward.
  const StepRun run = run_step(megatron_spec("megatron:tp=2,dp=2", "llama3-debugmodel", 3));
  ASSERT_TRUE(run.report.ok) << run.report.diagnosis;
  const int64_t L = run.job.model.layers;
  EXPECT_EQ(calls(run.report, "tp", "all_gather"), 3 * (6 * L + 1 + 2));
  EXPECT_EQ(calls(run.report, "tp", "reduce_scatter"), 3 * (4 * L + 1 + 1));
  // A gather moves the whole sequence's hidden states: 1024 tokens x dim x 2 bytes.
  EXPECT_EQ(bytes(run.report, "tp", "all_gather"), calls(run.report, "tp", "all_gather") * 1024 * run.job.model.dim * 2);
  // Full recomputation issues each layer's forward collectives again in its backward.
  StepSpec full = megatron_spec("megatron:tp=2,dp=2", "llama3-debugmodel", 3);
  full.activation_checkpoint = "full";
  EXPECT_EQ(calls(run_step(full).report, "tp", "all_gather"), 3 * (8 * L + 1 + 2));
}

TEST(MegatronStep, MoeDispatchesOverEpAndReducesExpertsOverEdp) {
  const StepRun run = run_step(megatron_spec("megatron:tp=2,dp=2,ep=2,etp=1", "deepseek_v3-debugmodel", 2));
  ASSERT_TRUE(run.report.ok) << run.report.diagnosis;
  const Model& m = run.job.model;
  const int64_t moe_layers = m.layers - m.dense_layers;
  // Per MoE layer and microbatch: the tokens per expert gathered; tokens, probabilities and the
  // combine each way (6 all-to-alls).
  EXPECT_EQ(calls(run.report, "ep", "all_gather"), 2 * moe_layers);
  EXPECT_EQ(calls(run.report, "ep", "all_to_all"), 2 * moe_layers * 6);
  EXPECT_EQ(calls(run.report, "edp", "reduce_scatter"), 1);
  EXPECT_EQ(calls(run.report, "edp", "all_gather"), 1);
  // The expert buffer: E / ep experts of (2F x D + D x F) per MoE layer, padded to lcm(edp, 128);
  // its gradients reduced in fp32 (--bf16 without --grad-reduce-in-bf16), its parameters gathered
  // in bf16.
  const int64_t experts = moe_layers * (m.experts / 2) * 3 * m.moe_ffn_dim * m.dim;
  EXPECT_EQ(bytes(run.report, "edp", "reduce_scatter"), (experts + 127) / 128 * 128 * 4);
  EXPECT_EQ(bytes(run.report, "edp", "all_gather"), (experts + 127) / 128 * 128 * 2);
}

TEST(MegatronArgs, MegatronLmsFlagsAreTheSameStepAsThePreset) {
  // llama3-8b's shape in Megatron-LM's flags (bias-free, RMSNorm, as its launch scripts say); the
  // same job as --preset and --model.
  StepSpec a;
  a.megatron_args = "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 1 "
                    "--global-batch-size 32 --seq-length 8192 --bf16 --sequence-parallel --use-distributed-optimizer "
                    "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
                    "--group-query-attention --num-query-groups 8 --swiglu --vocab-size 128256 "
                    "--untie-embeddings-and-output-weights --disable-bias-linear --normalization RMSNorm "
                    "--lr 3e-4 --train-iters 10 --data-path /x";
  a.world_size = 16;
  const StepRun ma = run_step(a);
  StepSpec p = megatron_spec("megatron:tp=2,pp=2,dp=4", "llama3-8b", 8);
  p.seq_len = 8192;
  const StepRun mp = run_step(p);
  ASSERT_TRUE(ma.report.ok) << ma.report.diagnosis;
  EXPECT_EQ(ma.job.microbatches, 8);  // 32 / (1 x dp 4)
  EXPECT_EQ(step_json(ma)["by_dim"], step_json(mp)["by_dim"]);
  EXPECT_EQ(ma.job.model.layers, 32);
  ASSERT_EQ(ma.notes.size(), 1u);  // the flags that move no collective
  EXPECT_NE(ma.notes[0].find("--lr --train-iters --data-path"), std::string::npos) << ma.notes[0];
  // --grad-reduce-in-bf16 halves the gradients' bytes; --rerun-mode disabled drops the world's int32.
  StepSpec b = a;
  b.megatron_args += " --grad-reduce-in-bf16 --rerun-mode disabled";
  const StepRun mb = run_step(b);
  EXPECT_EQ(bytes(mb.report, "dp_cp", "reduce_scatter") * 2, bytes(ma.report, "dp_cp", "reduce_scatter"));
  EXPECT_EQ(bytes(mb.report, "dp_cp", "all_gather"), bytes(ma.report, "dp_cp", "all_gather"));
  EXPECT_EQ(calls(mb.report, "world", "all_reduce") + 1, calls(ma.report, "world", "all_reduce"));
  // Megatron-LM's defaults: a bias in every linear layer and LayerNorm. Per layer and pipeline
  // rank of 16 layers: the QKV's (32 + 2 x 8) x 128 / tp and fc1's 2 x 14336 / tp split over tp,
  // linear_proj's and fc2's 4096 whole, a second 4096 per norm (two a layer, the final one on the
  // last stage); the row-parallel biases and the norms all-reduced over tp (sequence parallel).
  StepSpec d = a;
  for (const char* flag : {" --disable-bias-linear", " --normalization RMSNorm"}) {
    d.megatron_args.erase(d.megatron_args.find(flag), std::string(flag).size());
  }
  const StepRun md = run_step(d);
  ASSERT_TRUE(md.report.ok) << md.report.diagnosis;
  const int64_t h = 4096, layers = 16, dp = 4;
  const int64_t biases = layers * ((32 + 2 * 8) * 128 / 2 + 2 * 14336 / 2 + 2 * h);  // rank 0: stage 0
  const int64_t norm_biases = layers * 2 * h;
  auto pad = [](int64_t v, int64_t to) { return (v + to - 1) / to * to; };
  const int64_t before = bytes(ma.report, "dp_cp", "reduce_scatter") / 4;  // one bucket, padded to lcm(dp, 128)
  EXPECT_EQ(bytes(md.report, "dp_cp", "reduce_scatter") / 4, pad(before + biases + norm_biases, std::lcm(dp, int64_t{128})));
  EXPECT_EQ(bytes(md.report, "tp", "all_reduce") - bytes(ma.report, "tp", "all_reduce"), (layers * 2 * h + norm_biases) * 4);
  // The report's parameters count them: 32 layers' biases (QKV, proj, fc1's two halves, fc2) and
  // norm biases, and the final norm's.
  EXPECT_EQ(job_parameter_count(md.job) - job_parameter_count(ma.job), 32 * ((32 + 2 * 8) * 128 + h + 2 * 14336 + h + 2 * h) + h);
  EXPECT_EQ(job_parameter_count(ma.job), parameter_count(ma.job.model));
  // --add-qkv-bias alone: the QKV's bias only.
  StepSpec q = a;
  q.megatron_args += " --add-qkv-bias";
  EXPECT_EQ(bytes(run_step(q).report, "dp_cp", "reduce_scatter") / 4, pad(before + layers * (32 + 2 * 8) * 128 / 2, 128));
  // The vocabulary's padding: 128256 is a multiple of 128 x tp, not of 1024 x tp.
  StepSpec w = a;
  w.megatron_args += " --make-vocab-size-divisible-by 1024";
  EXPECT_GT(bytes(run_step(w).report, "dp_cp", "reduce_scatter"), bytes(ma.report, "dp_cp", "reduce_scatter"));
  // Virtual stages: 32 layers / pp 2 / 4 layers per virtual stage = 4 per rank.
  StepSpec v = a;
  v.megatron_args += " --num-layers-per-virtual-pipeline-stage 4";
  const StepRun mv = run_step(v);
  EXPECT_EQ(mv.report.layout.stages, 8);
  EXPECT_EQ(mv.job.schedule, "MegatronInterleaved");
}

// Megatron-LM's settings are resolved in one place (megatron_args.hpp): the degrees, the data
// parallel size and the microbatches a world size makes, Megatron's virtual stages.
TEST(MegatronArgs, AJobsSettingsAreResolvedWhereTheFlagsAreRead) {
  const MegatronArgs a = parse_megatron_args(
      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel --bf16 "
      "--use-distributed-optimizer --micro-batch-size 2 --global-batch-size 32 --seq-length 128 "
      "--num-layers-per-virtual-pipeline-stage 2");
  const MegatronJob j = megatron_job(a, 16, 8);
  EXPECT_EQ(j.degrees.tp, 2);
  EXPECT_EQ(j.degrees.pp, 2);
  ASSERT_TRUE(j.degrees.dp);
  EXPECT_EQ(*j.degrees.dp, 4);
  EXPECT_EQ(j.micro_batch_size, 2);
  EXPECT_EQ(j.microbatches, 4);  // 32 / (2 x 4)
  ASSERT_TRUE(j.stages);
  EXPECT_EQ(*j.stages, 4);       // 8 layers / pp 2 / 2 per virtual stage, times pp
  EXPECT_THROW(megatron_job(a, 12, 8), InvalidArgument);  // 12 ranks: dp 3, 32 % (2 x 3) != 0
  EXPECT_THROW(megatron_job(a, 10, 8), InvalidArgument);  // not a multiple of tp x pp
  EXPECT_THROW(megatron_job(a, 16, 6), InvalidArgument);  // 3 layers per rank, 2 per virtual stage
  // The step takes them as they are resolved here: --world-size 16 and --num-layers 8.
  StepSpec spec;
  spec.megatron_args = "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel --bf16 "
                       "--use-distributed-optimizer --micro-batch-size 2 --global-batch-size 32 --seq-length 128 "
                       "--num-layers-per-virtual-pipeline-stage 2 --num-layers 8 --hidden-size 256 "
                       "--num-attention-heads 8 --vocab-size 1024 --swiglu --disable-bias-linear --normalization RMSNorm "
                       "--untie-embeddings-and-output-weights";
  spec.world_size = 16;
  const StepRun r = run_step(spec);
  EXPECT_EQ(r.job.microbatches, j.microbatches);
  EXPECT_EQ(r.job.stages_per_rank, *j.stages / 2);
  EXPECT_EQ(r.job.parallel.dp_shard, *j.degrees.dp);
}

TEST(MegatronArgs, WhatMegatronRefusesOrMeshsimDoesNotModelIsNamed) {
  const std::string base = "--tensor-model-parallel-size 2 --micro-batch-size 1 --seq-length 256 --bf16 "
                           "--sequence-parallel --use-distributed-optimizer";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--tensor-model-parallel-size 2 --seq-length 256 --sequence-parallel --use-distributed-optimizer", "--bf16"},
      {base + " --fp16", "--fp16"},
      {base + " --overlap-grad-reduce", "--overlap-grad-reduce"},
      {base + " --tensor-model-paralel-size 2", "did you mean '--tensor-model-parallel-size'"},
      {base + " --micro-batch-size 2", "given twice"},
      {base + " --global-batch-size 3", "global batch size (3) is not divisible by micro batch size (1) times data parallel size (4)"},
      {"--tensor-model-parallel-size 2 --seq-length 256 --bf16 --use-distributed-optimizer", "--sequence-parallel"},
      {base + " --rerun-mode sometimes", "invalid choice"},
      {base + " --micro-batch-size", "given twice"},
      {base + " --context-parallel-size x", "not an integer"},
      {base + " --context-parallel-size 0", "not a positive integer"},
      {base + " --context-parallel-size 99999999999999999999", "--context-parallel-size"},
      {base + " --num-layers 4", "needs --hidden-size"},
      {base + " --num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2", "mutually exclusive"},
      {base + " 'unclosed", "unclosed"},
      {base + " stray", "is not a flag"},
      {base + " --bogus-flag 3", "is not a flag of Megatron-LM"},
      // TransformerConfig.__post_init__'s recomputation rules, in its words.
      {base + " --recompute-granularity full", "recompute_method must be \"block\" or \"uniform\""},
      {base + " --recompute-granularity full --recompute-method uniform", "recompute_num_layers must be between 1"},
      {base + " --recompute-granularity selective --recompute-num-layers 1", "recompute_num_layers must be None"},
      {base + " --recompute-granularity selective --recompute-method bogus", "recompute_method: bogus must be"},
      {base + " --recompute-granularity full --recompute-method block --recompute-num-layers 1",
       "recomputes 1 of the 6 layers"},
      {base + " --hidden-size 99999999999 --num-layers 2 --num-attention-heads 2 --vocab-size 8", "over 2^32"},
      {base + " --normalization rmsnorm", "invalid choice (choose from LayerNorm, RMSNorm)"},
      {base + " --qk-layernorm", "--qk-layernorm"},
      // TransformerConfig.__post_init__: softmax over one selected expert has no gradient.
      {base + " --num-layers 2 --hidden-size 256 --num-attention-heads 4 --vocab-size 1024 --swiglu --disable-bias-linear "
              "--num-experts 4 --moe-router-topk 1 --expert-model-parallel-size 2",
       "Please use --moe-router-pre-softmax when topk is 1."},
      {base + " --num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 64 --swiglu --num-experts 4",
       "give --disable-bias-linear"},
  };
  for (const auto& [args, says] : cases) {
    StepSpec s;
    s.megatron_args = args;
    s.world_size = 8;
    s.model = "llama3-debugmodel";
    try {
      (void)run_step(s);
      ADD_FAILURE() << args << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << args << "\n" << e.what();
    }
  }
  // Flags Megatron-LM's parser defines are never near misses of others: noted as not read, with
  // every value they take (--recompute-modules takes several).
  StepSpec real;
  real.megatron_args = base + " --num-workers 2 --vocab-file v.json --ckpt-format torch_dist --recompute-modules core_attn mlp "
                              "--moe-router-dtype fp32 --mtp-num-layers 1 --fp8-param-gather --encoder-num-layers 2";
  real.world_size = 8;
  real.model = "llama3-debugmodel";
  const StepRun read = run_step(real);
  ASSERT_EQ(read.notes.size(), 1u);
  for (const char* f : {"--num-workers", "--vocab-file", "--ckpt-format", "--recompute-modules", "--moe-router-dtype",
                        "--mtp-num-layers", "--fp8-param-gather", "--encoder-num-layers"}) {
    EXPECT_NE(read.notes[0].find(f), std::string::npos) << f << ": " << read.notes[0];
  }
  EXPECT_EQ(read.notes[0].find("mlp"), std::string::npos) << read.notes[0];  // a value, not a flag
  // Full recomputation of every layer: uniform with 1, or block with every layer of the rank.
  StepSpec every = real;
  every.megatron_args = base + " --recompute-granularity full --recompute-method block --recompute-num-layers 6";
  EXPECT_EQ(run_step(every).job.activation_checkpoint, Checkpoint::kFull);
  // --activation-checkpoint beside Megatron's own recomputation says it overrides it.
  every.activation_checkpoint = "none";
  const StepRun over = run_step(every);
  EXPECT_EQ(over.job.activation_checkpoint, Checkpoint::kNone);
  ASSERT_FALSE(over.notes.empty());
  EXPECT_NE(over.notes[0].find("--activation-checkpoint none overrides the recomputation of --megatron-args (full)"),
            std::string::npos) << over.notes[0];
  // --make-vocab-size-divisible-by pads the vocabulary (2,048) to a multiple of it x tp (2): 1
  // and 128 leave it as it is, 3 pads it to 2,052 rows, which the parameter gather moves.
  auto gathered = [&](const std::string& extra) {
    StepSpec v = real;
    v.megatron_args = base + extra;
    return bytes(run_step(v).report, "dp_cp", "all_gather");
  };
  const int64_t at128 = gathered("");
  EXPECT_EQ(gathered(" --make-vocab-size-divisible-by 1"), at128);
  EXPECT_GT(gathered(" --make-vocab-size-divisible-by 3"), at128);
  // FSDP's reshard choice means nothing to a Megatron step: refused, not ignored.
  StepSpec reshard = real;
  reshard.reshard_after_forward = "always";
  EXPECT_THROW((void)run_step(reshard), InvalidArgument);
  StepSpec no_world;
  no_world.megatron_args = base;
  no_world.model = "llama3-debugmodel";
  EXPECT_THROW((void)run_step(no_world), InvalidArgument);
}

TEST(MegatronStep, TheEvenOddRuleKeepsTheInterleavedPipelineGoing) {
  // llama3-debugmodel has 6 layers: pp 3 x 2 virtual stages.
  StepSpec s = megatron_spec("megatron:tp=2,pp=3,dp=2", "llama3-debugmodel", 6);
  s.stages = 6;
  const StepRun ok = run_step(s);
  EXPECT_TRUE(ok.report.ok) << ok.report.diagnosis;
  EXPECT_EQ(ok.job.schedule, "MegatronInterleaved");
  for (int64_t rank : {0, 7, 11}) {
    StepSpec f = s;
    f.faults = {"no-parity@" + std::to_string(rank)};
    const StepRun bad = run_step(f);
    EXPECT_FALSE(bad.report.ok);
    EXPECT_EQ(bad.report.diagnosis.rfind("FAILED: the step cannot progress (rendezvous sends): rank " + std::to_string(rank) +
                                             " waits in its send",
                                         0),
              0u)
        << bad.report.diagnosis;
    EXPECT_TRUE(std::find(bad.report.ranks.begin(), bad.report.ranks.end(), rank) != bad.report.ranks.end());
  }
  // The rule is the interleaved schedule's: 1F1B batches each call.
  StepSpec one = megatron_spec("megatron:tp=2,pp=3,dp=2", "llama3-debugmodel", 6);
  one.faults = {"no-parity@1"};
  EXPECT_THROW(run_step(one), InvalidArgument);
}

TEST(MegatronStep, PlantedFaultsNameTheRankAndMegatronsRefusals) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 8; ++trial) {
    StepSpec s = megatron_spec(trial % 2 ? "megatron:tp=2,pp=2,dp=2" : "megatron:tp=2,pp=3,dp=2", "llama3-debugmodel", 6);
    const int64_t world = trial % 2 ? 8 : 12;
    const int64_t rank = static_cast<int64_t>(rng() % static_cast<uint64_t>(world));
    const char* kinds[] = {"skip@", "swap@", "wrong-group@", "wrong-peer@"};
    s.faults = {kinds[trial % 4] + std::to_string(rank)};
    const StepRun run = run_step(s);
    EXPECT_FALSE(run.report.ok) << s.faults[0];
    EXPECT_TRUE(std::find(run.report.ranks.begin(), run.report.ranks.end(), rank) != run.report.ranks.end())
        << s.faults[0] << ": " << run.report.diagnosis;
  }
  EXPECT_THROW(run_step(megatron_spec("megatron:tp=2,dp=2,ep=2", "deepseek_v3-debugmodel")), InvalidArgument);  // etp = tp
  EXPECT_THROW(run_step(megatron_spec("megatron:dp=2", "deepseek_v3-debugmodel")), InvalidArgument);  // MoE with ep 1
  // Any order the preset accepts is checked (its groups are the preset's views'); one it refuses
  // is refused with Megatron's reason.
  const StepRun ordered = run_step(megatron_spec("megatron:tp=2,pp=2,dp=2,order=pp-tp-dp"));
  EXPECT_TRUE(ordered.report.ok) << ordered.report.diagnosis;
  StepSpec ordered_fault = megatron_spec("megatron:tp=2,pp=2,dp=2,order=pp-tp-dp");
  ordered_fault.faults = {"wrong-peer@5"};
  const StepRun named = run_step(ordered_fault);
  EXPECT_FALSE(named.report.ok);
  EXPECT_NE(std::find(named.report.ranks.begin(), named.report.ranks.end(), 5), named.report.ranks.end())
      << named.report.diagnosis;
  EXPECT_THROW(run_step(megatron_spec("megatron:tp=2,pp=2,cp=2,dp=2,order=tp-dp-pp-cp")), InvalidArgument);
  StepSpec uneven = megatron_spec("megatron:pp=4,dp=1");  // 6 layers over 4 stages
  EXPECT_THROW(run_step(uneven), InvalidArgument);
  StepSpec csv = megatron_spec("megatron:pp=2,dp=1");
  csv.schedule = "GPipe";
  EXPECT_THROW(run_step(csv), InvalidArgument);
}

}  // namespace
}  // namespace meshsim::step
