// reduce.hpp — the reduction kernel shared by the backends that reduce on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshsim/communicator.hpp"

namespace meshsim::detail {

// reduce_into writes dst[i] = ins[0][i] op ins[1][i] op ... in rank order (so floating-point
// results do not depend on timing); kAvg divides the sum by ins.size(). 16-bit floats
// accumulate in float32 and round once at the end. dst may alias none of ins.
void reduce_into(std::byte* dst, const std::vector<const std::byte*>& ins, int64_t count, DType t,
                 ReduceOp op);

}  // namespace meshsim::detail
