// megatron_lm_flags.hpp — whether a flag is one Megatron-LM's own parser defines.
#pragma once

#include <cstddef>
#include <string_view>

namespace meshsim::step {

// is_megatron_lm_flag: `flag` ("--num-workers") is defined by Megatron-LM's argument parser
// (core_v0.16.1); megatron_lm_flag_count is how many it defines (681).
bool is_megatron_lm_flag(std::string_view flag);
std::size_t megatron_lm_flag_count();

}  // namespace meshsim::step
