// step/src/step_internal.hpp — what step/'s files share and users do not: the bounds of a
// check, checked arithmetic, and the world's mixed-radix arithmetic behind group_members (the
// dense view (pp, dp_replicate, dp_shard, cp, tp) and torchtitan's sparse view for ep and efsdp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "meshsim/error.hpp"
#include "meshsim/step_program.hpp"
#include "meshsim/text_fields.hpp"

namespace meshsim::step::detail {

// kMaxEvents bounds the events of the programs held at once (one per pp rank and faulted rank),
// and kMaxSimulatedEvents the events an exact simulation steps through.
inline constexpr int64_t kMaxEvents = int64_t{1} << 22;
inline constexpr int64_t kMaxSimulatedEvents = int64_t{1} << 27;
// kMaxSize bounds a model's sizes and the job's (far past any model, far from overflow in the
// products below, which are checked anyway).
inline constexpr int64_t kMaxSize = int64_t{1} << 32;
// kMaxLayers bounds a model's layers (the largest models have a few hundred) and kMaxWorld the
// world a step is checked over (bytes per link walk every rank's groups).
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;
inline constexpr int64_t kMaxWorld = int64_t{1} << 22;

// The house's checked arithmetic and case folding (text_fields.hpp).
using text::checked_add;
using text::checked_mul;
using text::lower_case;

// Axis masks over the dense view (pp, dp_replicate, dp_shard, cp, tp), or for ep and efsdp over
// the sparse view (pp, dp_replicate, efsdp, ep, 1): torchtitan's "sparse" mesh unflattens
// dp_shard x cp x tp into efsdp x ep, ep the faster.
inline constexpr std::array<std::array<bool, 5>, kDims> kAxes = {{
    {true, false, false, false, false},   // pp
    {false, true, false, false, false},   // dp_replicate
    {false, false, true, true, false},    // fsdp
    {false, false, false, true, false},   // cp
    {false, false, false, false, true},   // tp
    {false, true, true, false, false},    // batch
    {false, true, true, true, false},     // loss
    {false, false, false, true, false},   // ep (sparse view)
    {false, false, true, false, false},   // efsdp (sparse view)
    {true, false, false, false, true},    // mp (Megatron's model-parallel group: pp x tp)
    {true, true, true, true, true},       // world
}};

inline bool sparse(Dim d) { return d == Dim::kEp || d == Dim::kEfsdp; }

inline std::array<int64_t, 5> radix(const Parallel& p, Dim d = Dim::kPp) {
  if (sparse(d)) return {p.pp, p.dp_replicate, p.dp_shard * p.cp * p.tp / p.ep, p.ep, 1};
  return {p.pp, p.dp_replicate, p.dp_shard, p.cp, p.tp};
}

// axis_order: the view's axes in row-major order, slowest first (Parallel::order).
inline const std::array<int8_t, 5>& axis_order(const Parallel& p, Dim d = Dim::kPp) {
  return sparse(d) ? p.expert_order : p.order;
}

// coords: a rank's coordinate on each axis (indexed by axis, not by place in the order).
inline std::array<int64_t, 5> coords(const Parallel& p, int64_t rank, Dim d = Dim::kPp) {
  const auto r = radix(p, d);
  const auto& o = axis_order(p, d);
  std::array<int64_t, 5> c{};
  for (int j = 4; j >= 0; --j) {
    c[o[j]] = rank % r[o[j]];
    rank /= r[o[j]];
  }
  return c;
}
inline int64_t rank_of(const Parallel& p, const std::array<int64_t, 5>& c, Dim d = Dim::kPp) {
  const auto r = radix(p, d);
  const auto& o = axis_order(p, d);
  int64_t rank = 0;
  for (int j = 0; j < 5; ++j) rank = rank * r[o[j]] + c[o[j]];
  return rank;
}
// leader: the lowest rank of `rank`'s group on d.
inline int64_t leader(const Parallel& p, Dim d, int64_t rank) {
  auto c = coords(p, rank, d);
  for (int i = 0; i < 5; ++i) {
    if (kAxes[static_cast<int>(d)][i]) c[i] = 0;
  }
  return rank_of(p, c, d);
}
inline int64_t with_pp(const Parallel& p, int64_t rank, int64_t pp) {
  auto c = coords(p, rank);
  c[0] = pp;
  return rank_of(p, c);
}

// member_at: the k-th member (0-based, rank order) of `rank`'s group on d.
inline int64_t member_at(const Parallel& p, Dim d, int64_t rank, int64_t k) {
  const auto r = radix(p, d);
  const auto& o = axis_order(p, d);
  auto c = coords(p, rank, d);
  for (int j = 4; j >= 0; --j) {  // the fastest axis first: members in rank order
    const int i = o[j];
    if (!kAxes[static_cast<int>(d)][i]) continue;
    c[i] = k % r[i];
    k /= r[i];
  }
  return rank_of(p, c, d);
}


inline bool is_p2p(Op o) { return o == Op::kSend || o == Op::kRecv; }
inline bool same_collective(const Event& a, const Event& b) {
  return a.op == b.op && a.dtype == b.dtype && a.bytes == b.bytes;
}

// group_text: "tp group [16, 17]", the first 8 members of a larger group then its size.
std::string group_text(const Job& job, Dim d, int64_t rank);

// mla: the model's attention is deepseek_v3's multi-head latent attention; moe_layer: `layer`
// routes its tokens to experts.
inline bool mla(const Model& m) { return m.kv_lora_rank > 0; }
inline bool moe_layer(const Model& m, int64_t layer) { return m.experts > 0 && layer >= m.dense_layers; }

// split_layers is torchtitan's _generate_llm_fqn_per_model_part (stage_layout.cpp).
void split_layers(StageLayout& l, int64_t layers, int64_t input_weight, int64_t output_weight);

}  // namespace meshsim::step::detail
