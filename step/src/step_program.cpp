// The step's vocabulary (dims, ops, dtypes, phases, an event in words), the world's groups, and
// the entry points: program (one pp rank's program) and check_step. The parts, by concept:
// model_catalog.cpp (models), stage_layout.cpp (stages and their schedule), step_builder.* (the
// builders' base and the schedule's walk), titan_step.cpp (torchtitan's collectives),
// megatron_step.cpp (Megatron-core's), faults.cpp (--fault), step_check.* (agreement and the
// progress event loop), step_diagnosis.cpp (the wait cycle), link_bytes.cpp (bytes per link).
#include "meshsim/step_program.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "step_builder.hpp"
#include "step_check.hpp"
#include "step_internal.hpp"

namespace meshsim::step {

using namespace detail;

namespace {

constexpr std::array<std::string_view, kDims> kDimNames = {"pp",    "dp_replicate", "fsdp",  "cp", "tp",   "batch",
                                                           "loss",  "ep",           "efsdp", "mp", "world"};

}  // namespace

std::string_view dim_name(Dim d) { return kDimNames[static_cast<int>(d)]; }

std::string_view framework_name(Framework f) { return f == Framework::kMegatron ? "megatron" : "torchtitan"; }
std::string_view reshard_name(Reshard r) {
  return r == Reshard::kAlways ? "always" : r == Reshard::kNever ? "never" : "default";
}
std::string_view checkpoint_name(Checkpoint c) {
  return c == Checkpoint::kFull ? "full" : c == Checkpoint::kNone ? "none" : "selective";
}

Reshard parse_reshard(std::string_view text) {
  const std::string policy = lower_case(std::string(text));
  if (policy == "default") return Reshard::kDefault;
  if (policy == "always") return Reshard::kAlways;
  if (policy == "never") return Reshard::kNever;
  throw InvalidArgument("Invalid reshard_after_forward_policy: " + quote_input(text) + ". [torchtitan: always, never or default]");
}

Checkpoint parse_checkpoint(std::string_view text, Framework f) {
  const std::string ac = lower_case(std::string(text));
  if (ac == "selective") return Checkpoint::kSelective;
  if (ac == "full") return Checkpoint::kFull;
  if (ac == "none") return Checkpoint::kNone;
  throw InvalidArgument("--activation-checkpoint " + quote_input(text) +
                        (f == Framework::kMegatron ? " is not none (Megatron's default), selective (core attention: no collectives) or full"
                                                   : " is not selective (torchtitan's default, per op), full or none"));
}

std::string_view dim_label(const Job& job, Dim d) {
  if (job.framework == Framework::kMegatron) {
    switch (d) {
      case Dim::kFsdp: return "dp_cp";
      case Dim::kBatch: return "dp";
      case Dim::kLoss: return "dp_cp";
      case Dim::kEfsdp: return "edp";
      default: break;
    }
  }
  return dim_name(d);
}

std::string_view view_name(Dim d) {
  switch (d) {
    case Dim::kFsdp: return "dense[dp_shard,cp]";
    case Dim::kBatch: return "dataloading";
    case Dim::kLoss: return "loss";
    case Dim::kEp:
    case Dim::kEfsdp: return "sparse";
    case Dim::kMp: return "mp";
    case Dim::kWorld: return "world";
    default: return "dense";
  }
}

std::string_view op_name(Op o) {
  switch (o) {
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllReduce: return "all_reduce";
    case Op::kAllToAll: return "all_to_all";
    case Op::kSend: return "send";
    case Op::kRecv: return "recv";
  }
  return "?";
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kF32: return "float32";
    case DType::kI64: return "int64";
    case DType::kI32: return "int32";
  }
  return "?";
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::kTokens: return "tokens";
    case Phase::kFwd: return "fwd";
    case Phase::kBwd: return "bwd";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kMetrics: return "metrics";
  }
  return "?";
}

std::string describe(const Event& e) {
  std::string s = std::string(op_name(e.op)) + " " + std::string(dtype_name(e.dtype)) + " " + std::to_string(e.bytes) +
                  " B (" + std::string(phase_name(e.phase));
  if (e.stage >= 0) s += " stage " + std::to_string(e.stage);
  if (e.layer >= 0) s += " layer " + std::to_string(e.layer);
  if (e.microbatch >= 0) s += " microbatch " + std::to_string(e.microbatch);
  if (*e.what) s += " " + std::string(e.what);
  if (e.recompute) s += " recomputed";
  if (e.routed) s += ", bytes as routed";
  return s + ")";
}
int64_t GroupLayout::size() const {
  int64_t n = 1;
  for (int i = 0; i < modes; ++i) n *= shape[i];
  return n;
}
int64_t GroupLayout::leader(int64_t rank) const {
  int64_t lead = rank;
  for (int i = 0; i < modes; ++i) lead -= rank / stride[i] % shape[i] * stride[i];
  return lead;
}
int64_t GroupLayout::member(int64_t lead, int64_t k) const {
  for (int i = 0; i < modes; ++i) {  // colexicographic: the first (smallest-stride) mode fastest
    lead += k % shape[i] * stride[i];
    k /= shape[i];
  }
  return lead;
}

void detail::validate_groups(const Parallel& p) {
  const int64_t world = world_size(p);
  const int64_t dp = p.dp_replicate * p.dp_shard;
  const int64_t sizes[kDims] = {p.pp, p.dp_replicate, p.dp_shard * p.cp, p.cp, p.tp, dp, dp * p.cp,
                                p.ep, p.ep >= 1 ? p.dp_shard * p.cp * p.tp / p.ep : 0, p.pp * p.tp, world};
  for (int d = 0; d < kDims; ++d) {
    const GroupLayout& g = p.groups[static_cast<std::size_t>(d)];
    const std::string what = "the job's " + std::string(dim_name(static_cast<Dim>(d))) + " groups";
    const std::string hint = " (lay the ranks out with titan_parallel or megatron_parallel, from the preset's views)";
    if (g.modes < 0 || g.modes > GroupLayout::kMaxModes) throw InvalidArgument(what + ": " + std::to_string(g.modes) + " modes" + hint);
    // Nested modes over the world: each stride a multiple of the last mode's extent, the last
    // extent dividing the world, so leader and member stay in [0, world).
    int64_t extent = 1, size = 1;
    for (int i = 0; i < g.modes; ++i) {
      if (g.shape[i] < 1 || g.stride[i] < 1 || g.stride[i] % extent != 0 || g.stride[i] > world / g.shape[i]) {
        throw InvalidArgument(what + ": mode " + std::to_string(g.shape[i]) + ":" + std::to_string(g.stride[i]) +
                              " is not nested in a world of " + std::to_string(world) + hint);
      }
      extent = g.stride[i] * g.shape[i];
      size *= g.shape[i];
    }
    if (world % extent != 0 || size != sizes[d]) {
      throw InvalidArgument(what + " have " + std::to_string(size) + " ranks over a world of " + std::to_string(world) +
                            "; the degrees make " + std::to_string(sizes[d]) + hint);
    }
  }
}

int64_t world_size(const Parallel& p) {
  int64_t w = 1;
  for (int64_t v : {p.pp, p.dp_replicate, p.dp_shard, p.cp, p.tp}) w = checked_mul(w, v, "the world size");
  return w;
}

int64_t dim_size(const Parallel& p, Dim d) { return p.group(d).size(); }

int64_t pp_coordinate(const Parallel& p, int64_t rank) { return p.group(Dim::kPp).coordinate(rank, 0); }

int64_t group_member(const Parallel& p, Dim d, int64_t rank, int64_t k) {
  if (k < 0 || k >= dim_size(p, d)) {
    throw OutOfRange("member " + std::to_string(k) + " of a " + std::string(dim_name(d)) + " group of " +
                     std::to_string(dim_size(p, d)));
  }
  return member_at(p, d, rank, k);
}

std::vector<int64_t> group_members(const Parallel& p, Dim d, int64_t rank) {
  const GroupLayout& g = p.group(d);
  const int64_t lead = g.leader(rank), n = g.size();
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(n));
  for (int64_t k = 0; k < n; ++k) out.push_back(g.member(lead, k));  // ascending ranks
  return out;
}

std::string detail::group_text(const Job& job, Dim d, int64_t rank) {
  const Parallel& p = job.parallel;
  const int64_t n = dim_size(p, d);
  std::string s = std::string(dim_label(job, d)) + " group [";
  for (int64_t k = 0; k < std::min<int64_t>(n, 8); ++k) s += (k ? ", " : "") + std::to_string(member_at(p, d, rank, k));
  if (n > 8) s += ", ... (" + std::to_string(n) + " ranks)";
  return s + "]";
}

std::vector<Event> program(const Job& job, const StageLayout& l, int64_t pp_rank) {
  if (pp_rank < 0 || pp_rank >= job.parallel.pp) {
    throw OutOfRange("pp rank " + std::to_string(pp_rank) + " is out of range [0, " + std::to_string(job.parallel.pp) + ")");
  }
  return make_builder(job, l)->build(pp_rank);
}

Report check_step(const Job& job, const Options& o) {
  Report r;
  r.layout = layout(job);
  const Parallel& p = job.parallel;
  r.world_size = world_size(p);
  auto check_rank = [&](int64_t rank, const std::string& what) {
    if (rank < 0 || rank >= r.world_size) {
      throw OutOfRange(what + " " + std::to_string(rank) + " is out of range [0, " + std::to_string(r.world_size) + ")");
    }
  };
  check_rank(o.rank, "--rank");
  for (const Fault& f : o.faults) check_rank(f.rank, "--fault's rank");
  for (int64_t rank : o.ranks) check_rank(rank, "--ranks' rank");
  if (o.gpus_per_host && (*o.gpus_per_host < 1 || *o.gpus_per_host > (int64_t{1} << 40))) {
    throw InvalidArgument("--gpus-per-host " + std::to_string(*o.gpus_per_host) + " is out of range [1, 2^40]");
  }
  r.rank = o.rank;
  Checker c(job, r.layout, o);
  r.programs = c.programs();
  r.program = c.program_of(o.rank);
  for (const Event& e : r.program) {
    OpTotal& t = r.by_dim[std::string(dim_label(job, e.dim))][std::string(op_name(e.op))];
    ++t.calls;
    t.bytes = checked_add(t.bytes, e.bytes, "rank " + std::to_string(o.rank) + "'s bytes");
  }
  if (o.gpus_per_host) c.links(*o.gpus_per_host, r);
  c.check_agreement(r);
  if (r.ok) c.simulate(r);
  return r;
}

}  // namespace meshsim::step
