// reduce.hpp — what the backends that move data on the host (threaded, fiber, Gloo's
// reductions) share: the reduction kernel and a rank's posting at a rendezvous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshsim/communicator.hpp"

namespace meshsim::detail {

// Arrival is what one rank posted at a rendezvous of the shared-memory backends.
struct Arrival {
  bool arrived = false;
  CollectiveDesc desc;
  const void* in = nullptr;
  void* out = nullptr;
};

// reduce_into writes dst[i] = ins[0][i] op ins[1][i] op ... in rank order (so floating-point
// results do not depend on timing); kAvg divides the sum by ins.size(). 16-bit floats
// accumulate in float32 and round once at the end. dst may alias none of ins.
void reduce_into(std::byte* dst, const std::vector<const std::byte*>& ins, int64_t count, DType t,
                 ReduceOp op);

}  // namespace meshsim::detail
