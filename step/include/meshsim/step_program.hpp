// meshsim/step_program.hpp — one torchtitan training step's collectives, every rank, checked
// before the job: each rank's ordered program (collectives with their group, dtype and bytes;
// pipeline sends and receives with their peer), the check that every group's members issue the
// same sequence and that the step makes progress under rendezvous or eager sends, and the bytes
// each dim moves, inside a host and across hosts.
//
//   Job job{.parallel = {.pp = 4, .dp_shard = 8, .tp = 2}, .model = builtin_model("llama3-8b"),
//           .seq_len = 8192, .local_batch_size = 8, .microbatches = 8, .schedule = "1F1B"};
//   Report r = check_step(job, {.gpus_per_host = 8});   // r.ok, r.diagnosis, r.by_dim, r.by_link
//
// What a step issues is torchtitan's (pytorch/torchtitan b5bcd76c66d0acb1a08b176d9639425bc55e0b2a;
// docs/step.md says where each collective comes from): the global token count, each pipeline
// microbatch's forward and backward in the schedule's order (FSDP2 all-gathers and reduce-scatters,
// TP with sequence parallel, CP's K/V all-gathers, loss parallel, pipeline sends and receives),
// the gradient norm, the finite-loss check and the metrics of a logged step.
//
// Scale: a rank's program depends only on its pp coordinate (and a planted fault), so a world is
// checked by one program per pp rank, each group kind once, and the progress of one pipeline
// group (plus every pipeline group that holds a faulted rank); `ranks` in Options simulates any
// set exactly. Bytes per link count every rank's groups (O(world x dims), no events stored).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/schedule.hpp"

namespace meshsim::step {

// Model is a decoder's shape in torchtitan's terms: llama3's grouped-query attention (head_dim =
// dim / heads, kv_heads) and SwiGLU FFN of ffn_dim; or, with kv_lora_rank > 0, deepseek_v3's
// multi-head latent attention (q_lora_rank 0: one wq), and with experts > 0 its MoE: layers from
// dense_layers on route each token to top_k of `experts` experts of moe_ffn_dim, beside
// shared_experts always-on ones (the first dense_layers keep a dense FFN of ffn_dim).
struct Model {
  std::string name;
  int64_t layers = 0, dim = 0, ffn_dim = 0, heads = 0, kv_heads = 0, vocab = 0;
  bool weight_tying = false;
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t experts = 0, top_k = 0, moe_ffn_dim = 0, shared_experts = 0, dense_layers = 0;
  // load_balance: torchtitan's MoE sets load_balance_coeff (its default, 1e-3): the optimizer's
  // pre-step hook all-reduces every MoE layer's tokens per expert to move the experts' biases.
  bool load_balance = true;
};

// builtin_model: "llama3-debugmodel", "llama3-1b", "llama3-3b", "llama3-8b", "llama3-70b",
// "llama3-405b", "deepseek_v3-debugmodel", "deepseek_v3-16b", "deepseek_v3-236b",
// "deepseek_v3-671b" (case-insensitive); NotFound naming the known ones otherwise.
Model builtin_model(std::string_view name);
std::vector<std::string> builtin_model_names();
// model_from_toml reads a [model] table (name, n_layers, dim, ffn_dim, n_heads, n_kv_heads,
// vocab_size, enable_weight_tying; for MLA q_lora_rank, kv_lora_rank, qk_nope_head_dim,
// qk_rope_head_dim, v_head_dim; for MoE num_experts, top_k, moe_ffn_dim, num_shared_experts,
// n_dense_layers); ParseError / InvalidArgument name the key.
Model model_from_toml(const std::string& path);
// validate_model: every size >= 1, dim a multiple of heads, heads of kv_heads; InvalidArgument.
void validate_model(const Model& m);
// parameter_count: embeddings, blocks (attention, FFN or MoE, two norms), norm, lm_head (not
// counted twice when tied); buffers (the MoE's expert bias) are not parameters.
// llama3-8b: 8,030,261,248.
int64_t parameter_count(const Model& m);

// Dim names a group kind over the world laid out row-major as (pp, dp_replicate, dp_shard, cp,
// tp): pp, dp_replicate, fsdp (dp_shard x cp, FSDP's mesh), cp, tp, batch (dp_replicate x
// dp_shard, the token count's mesh) and loss (batch x cp, torchtitan's loss mesh); and over
// torchtitan's sparse view (pp, dp_replicate, efsdp, ep), dp_shard x cp x tp unflattened with ep
// the faster: ep (the experts' all-to-alls) and efsdp (the routed experts' FSDP mesh).
// Megatron's steps add mp (pp x tp, its model-parallel group) and world (every rank).
enum class Dim { kPp, kDpReplicate, kFsdp, kCp, kTp, kBatch, kLoss, kEp, kEfsdp, kMp, kWorld };
inline constexpr int kDims = 11;

// GroupLayout is one kind of group as a CuTe layout over the world's ranks: its modes
// (shape_i : stride_i), the smallest stride first, each a dim of a view the preset unflattens
// the world into (a flattened group, fsdp = dp_shard x cp, has two). Rank r's group is
// {leader(r) + crd2idx(k) : 0 <= k < size()}, k read colexicographically (the first mode
// fastest), so member k is the group's k-th rank in ascending order; leader(r) =
// r - sum_i ((r / stride_i) % shape_i) * stride_i. Each O(modes).
struct GroupLayout {
  static constexpr int kMaxModes = 5;
  int modes = 0;
  std::array<int64_t, kMaxModes> shape{}, stride{};
  int64_t size() const;
  int64_t leader(int64_t rank) const;
  int64_t member(int64_t leader, int64_t k) const;  // 0 <= k < size()
  // coordinate: rank's index along mode i (0 when i is past the modes).
  int64_t coordinate(int64_t rank, int i) const { return i < modes ? rank / stride[i] % shape[i] : 0; }
};

// Parallel holds torchtitan's degrees (dp_shard resolved; ep divides dp_shard x cp x tp) and each
// Dim's group layout, read from the preset's views by titan_parallel and megatron_parallel
// (step_job.hpp), so any rank order the preset accepts is the step's. Degrees alone (no layouts,
// or layouts of other degrees) are refused by every check (InvalidArgument).
struct Parallel {
  int64_t pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, ep = 1;
  std::array<GroupLayout, kDims> groups{};
  const GroupLayout& group(Dim d) const { return groups[static_cast<std::size_t>(d)]; }
};

std::string_view dim_name(Dim d);
// view_name: the torchtitan view (as `--preset torchtitan:...` builds it) whose dim the group is:
// "dense" (pp, dp_replicate, cp, tp), "dense[dp_shard,cp]" (fsdp, FSDP's flattened mesh),
// "dataloading" (batch), "loss" (loss_mesh), "sparse" (ep, efsdp).
std::string_view view_name(Dim d);

enum class Op { kAllGather, kReduceScatter, kAllReduce, kAllToAll, kSend, kRecv };
std::string_view op_name(Op o);
enum class DType { kBF16, kF32, kI64, kI32 };
std::string_view dtype_name(DType t);
enum class Phase { kTokens, kFwd, kBwd, kOptimizer, kMetrics };
std::string_view phase_name(Phase p);

// Event is one entry of a rank's program. bytes follow Flight Recorder: all_gather its output,
// reduce_scatter its input, all_reduce its buffer, all_to_all its input, send/recv the tensor.
struct Event {
  Op op = Op::kAllReduce;
  Dim dim = Dim::kTp;
  DType dtype = DType::kBF16;
  int64_t bytes = 0;
  Phase phase = Phase::kFwd;
  int32_t stage = -1, layer = -1, microbatch = -1;
  int64_t peer = -1;     // send/recv: the peer's pp coordinate
  const char* what = "";  // "attention", "mlp", "params", "grads", "activation", ...
  bool recompute = false;  // issued again by activation checkpointing in backward
  // routed: an all-to-all whose input is the tokens the router sent this rank (an MoE's combine,
  // its dispatch's gradient): its bytes follow the routing, planned as the balanced share.
  bool routed = false;
  // batch: a send or receive posted with the others of its batch (PyTorch's batch_isend_irecv:
  // consecutive events of one id >= 0, in the order the call lists them); -1 alone.
  int32_t batch = -1;
  friend bool operator==(const Event& a, const Event& b) {
    return a.op == b.op && a.dim == b.dim && a.dtype == b.dtype && a.bytes == b.bytes && a.phase == b.phase &&
           a.stage == b.stage && a.layer == b.layer && a.microbatch == b.microbatch && a.peer == b.peer &&
           std::string_view(a.what) == b.what && a.recompute == b.recompute && a.routed == b.routed && a.batch == b.batch;
  }
};
std::string describe(const Event& e);  // "all_gather bf16 33554432 B (fwd stage 0 layer 3 microbatch 1 attention)"

// Framework: whose step is built (torchtitan's, or Megatron-core's: megatron_step.cpp).
// Reshard: torchtitan's FSDP reshard_after_forward policy. Checkpoint: the activation
// checkpointing mode (Megatron's selective recomputes core attention: no collectives, so its
// step holds it as none). Each read once at the edge (run_step) by parse_*, case folded as
// torchtitan reads them; *_name is the one spelling the reports print.
enum class Framework { kTorchtitan, kMegatron };
enum class Reshard { kDefault, kAlways, kNever };
enum class Checkpoint { kSelective, kFull, kNone };
std::string_view framework_name(Framework f);
std::string_view reshard_name(Reshard r);
std::string_view checkpoint_name(Checkpoint c);
// parse_reshard: default, always or never (torchtitan's own error otherwise: "Invalid
// reshard_after_forward_policy: 'X'. [torchtitan: always, never or default]").
Reshard parse_reshard(std::string_view text);
// parse_checkpoint: selective, full or none, as --activation-checkpoint (InvalidArgument naming
// the framework's default otherwise).
Checkpoint parse_checkpoint(std::string_view text, Framework f);

// Job is one torchtitan configuration's step.
struct Job {
  Parallel parallel;
  Model model;
  int64_t seq_len = 0, local_batch_size = 0;
  int64_t microbatches = 1;        // pipeline microbatches (num_pp_microbatches), 1 without pp
  int64_t grad_accum_steps = 1;    // torchtitan's gradient accumulation: forward-backwards per step
  std::string schedule = "1F1B";   // GPipe, 1F1B, Interleaved1F1B
  std::optional<Schedule> schedule_override;  // a CSV, read elsewhere (compute only or lowered)
  Lowering lowering = Lowering::kRuntime;     // of multi-stage schedules and compute-only CSVs
  bool override_as_written = true;            // schedule_override held its sends and receives (else lowered `lowering`)
  int64_t stages_per_rank = 0;     // 0: torchtitan's default (1 for single-stage schedules, else 2)
  int64_t first_stage_less_layers = 1, last_stage_less_layers = 1;
  Reshard reshard_after_forward = Reshard::kDefault;  // always with pp is refused
  Checkpoint activation_checkpoint = Checkpoint::kSelective;  // torchtitan's default
  bool log_metrics = true;         // a logged step (torchtitan logs step 1)
  // torchtitan 0.3.0's ChunkedLossWrapper with loss.num_chunks chunks (0: no wrapper, the loss
  // whole, as torchtitan's TOML-era trainer): the lm_head and the loss run per sequence chunk
  // inside the last stage's forward, the lm_head's gradients reduced at the last chunk and its
  // FSDP unit resharded, so gathered again (titan_step.cpp).
  int64_t loss_chunks = 0;
  // Megatron-core's step: the distributed optimizer's buckets, TP with sequence parallel, the
  // alltoall MoE dispatcher, its pipeline schedules; megatron_parity false turns off the
  // interleaved schedule's even/odd p2p rule.
  Framework framework = Framework::kTorchtitan;
  bool megatron_parity = true;
  // Megatron-LM's --bf16 step: the gradient buffers (and so the reduce-scatters and the
  // sequence-parallel norms' all-reduce) are fp32 unless --grad-reduce-in-bf16 (arguments.py
  // validate_args: accumulate_allreduce_grads_in_fp32); --rerun-mode validate_results, the
  // default, all-reduces one int32 over the world after the forward-backward
  // (rerun_state_machine.py should_run_forward_backward).
  bool megatron_grad_reduce_in_bf16 = false;
  // Megatron-LM pads the vocabulary to a multiple of this x tp (--make-vocab-size-divisible-by).
  int64_t megatron_vocab_divisible = 128;
  // Megatron's biases and norms: a bias in each linear layer (the row-parallel ones' gradients
  // all-reduced over tp with the norms'), in the QKV alone, LayerNorm's bias beside each norm's
  // weight. `--preset megatron:` leaves them out (a Llama-style model); --megatron-args takes
  // Megatron-LM's defaults (biases, LayerNorm) and its flags.
  bool megatron_bias_linear = false, megatron_qkv_bias = false, megatron_layernorm = false;
  bool megatron_rerun_validate = true;
};

// job_parameter_count: the job's model's, with the biases and LayerNorm biases of a Megatron
// job that has them (Megatron-LM's defaults: every linear layer's bias, a bias per norm).
int64_t job_parameter_count(const Job& job);

// dim_label: the dim as the job's framework names it: Megatron's dp_cp (fsdp), dp (batch), edp
// (efsdp); the others as dim_name.
std::string_view dim_label(const Job& job, Dim d);

// Fault plants a defect in one rank's program: kSkip drops its last microbatch, kSwap swaps its
// first two differing collectives on one group, kWrongGroup issues its first tp (else first)
// collective on another dim's group, kWrongPeer sends its first send to the wrong pp rank.
enum class FaultKind { kSkip, kSwap, kWrongGroup, kWrongPeer };
struct Fault {
  FaultKind kind = FaultKind::kSkip;
  int64_t rank = 0;
};
// parse_fault: "skip@R", "swap@R", "wrong-group@R", "wrong-peer@R"; InvalidArgument otherwise.
Fault parse_fault(std::string_view text);

// Layout is the job's stage layout: stages, stages per rank, which layers each stage holds.
struct StageLayout {
  int64_t stages = 1, stages_per_rank = 1;
  std::vector<int64_t> first_layer, layer_count;  // per stage
  Schedule schedule;                               // lowered (empty ranks without pp)
  std::string lowering;  // how: "runtime", "add_send_recv", "megatron" or "as written" (a lowered CSV); "" without pp
};
// layout resolves and checks a job as torchtitan does (its reasons in the errors):
// InvalidArgument for sizes < 1, heads / kv_heads / ffn_dim / vocab not divisible by tp, ep > 1
// without experts or not dividing them,
// seq_len not divisible by cp x tp (and 2 cp for the head-tail load balancer), microbatches > 1
// without pp, a single-stage schedule with stages_per_rank != 1, more stages than effective layers.
StageLayout layout(const Job& job);

// program builds the ordered program of every rank at pp coordinate `pp_rank`, with `fault`
// applied when it names that rank (pass its rank's coordinates through `rank`).
std::vector<Event> program(const Job& job, const StageLayout& layout, int64_t pp_rank);
void apply_fault(const Job& job, const Fault& f, std::vector<Event>& events);

// The world's size (the degrees' product), a group's size and a rank's pp coordinate and group,
// each by the Dim's GroupLayout.
int64_t world_size(const Parallel& p);
int64_t dim_size(const Parallel& p, Dim d);
int64_t pp_coordinate(const Parallel& p, int64_t rank);
// group_members: the ranks of `rank`'s group on `d`, ascending (the group's order);
// group_member: its k-th (0-based) without listing the rest.
std::vector<int64_t> group_members(const Parallel& p, Dim d, int64_t rank);
int64_t group_member(const Parallel& p, Dim d, int64_t rank, int64_t k);

struct Options {
  SendSemantics semantics = SendSemantics::kRendezvous;
  std::optional<int64_t> gpus_per_host;
  std::vector<Fault> faults;
  int64_t rank = 0;              // the rank whose program by_dim reports
  std::vector<int64_t> ranks;    // simulate exactly these ranks (empty: the default set)
  bool all_ranks = false;        // simulate every rank exactly
};

struct OpTotal {
  int64_t calls = 0, bytes = 0;
};
struct LinkBytes {
  int64_t intra_host = 0, inter_host = 0;
};

// Report is the check's answer.
struct Report {
  bool ok = true;
  std::string diagnosis;          // one line, "FAILED: ..." when not ok
  std::vector<int64_t> ranks;     // the ranks the diagnosis names
  int64_t world_size = 0, rank = 0;
  StageLayout layout;
  std::vector<Event> program;     // the reported rank's program
  std::map<std::string, std::map<std::string, OpTotal>> by_dim;  // that rank: dim -> op -> totals
  std::optional<LinkBytes> by_link;                              // the world, with gpus_per_host
  std::map<std::string, LinkBytes> link_by_dim;                  // the world, per dim
  int64_t programs = 0, groups_checked = 0, ranks_simulated = 0;
};

// check_step builds the programs, checks agreement and progress, and counts bytes.
Report check_step(const Job& job, const Options& options);

}  // namespace meshsim::step
