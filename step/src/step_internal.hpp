// step/src/step_internal.hpp — what step/'s files share and users do not: the bounds of a
// check, checked arithmetic, and a rank's group members by the Dim's GroupLayout.
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

// leader: the lowest rank of `rank`'s group on d; member_at: its k-th member (0-based, rank
// order); with_pp: the rank of `rank`'s pipeline group at pp coordinate `pp` (each the Dim's
// GroupLayout, read from the preset's views).
inline int64_t leader(const Parallel& p, Dim d, int64_t rank) { return p.group(d).leader(rank); }
inline int64_t member_at(const Parallel& p, Dim d, int64_t rank, int64_t k) {
  const GroupLayout& g = p.group(d);
  return g.member(g.leader(rank), k);
}
inline int64_t with_pp(const Parallel& p, int64_t rank, int64_t pp) {
  const GroupLayout& g = p.group(Dim::kPp);
  return g.modes == 0 ? rank : rank + (pp - g.coordinate(rank, 0)) * g.stride[0];
}

// validate_groups: every Dim's layout nested in the world and as large as the degrees make it
// (InvalidArgument naming the dim otherwise: degrees given without the preset's layouts).
void validate_groups(const Parallel& p);

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
