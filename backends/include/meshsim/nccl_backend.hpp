// meshsim/nccl_backend.hpp — one GPU per rank, over NCCL (through NcclApi, so a fake can stand
// in for tests without a GPU).
//
//   auto b = std::make_shared<NcclBackend>(NcclBackend::Options{
//       .world_size = 4, .api = make_cuda_nccl_api()});            // 4 rank threads, 4 GPUs
//   // on rank r's thread: b->world(r), b->new_group(r, ranks, config), b->split_group(...)
//
// The world communicator: rank 0 makes a unique id and publishes it in the store
// ("<prefix>/nccl/world"); every rank reads it and joins. Groups of a mesh dim that covers the
// world are split from the world communicator (ncclCommSplit, color = the group's smallest rank,
// key = the rank's place in the group), so every world rank takes part, as PyTorch's DeviceMesh
// does; the universe's group cache (MeshCommunicators) makes a dim's split happen once. Other
// groups get their own unique id through the store, made by their first member.
//
// Buffers: the Communicator interface takes host memory; each collective copies in, runs on the
// rank's stream and copies out. Every wait polls the stream and ncclCommGetAsyncError against
// the deadline and the run's diagnosis: a deadline, an async error or another rank's failure
// aborts the communicator (ncclCommAbort) and throws, naming the rank at fault when it is known
// (the run's diagnosis here or in the store). With `verify` ranks all-gather what they are about
// to call first, so a mismatch names the odd rank. Reductions follow NCCL's order (not the
// threaded backend's group-rank order); bfloat16 and float16 are NCCL's own types.
//
// Thread safety: the backend is shared by the process's rank threads; a communicator belongs to
// one rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/nccl_api.hpp"
#include "meshsim/rank_placement.hpp"
#include "meshsim/registry_backend.hpp"
#include "meshsim/store.hpp"

namespace meshsim {

namespace detail {
struct NcclState;
}

class NcclBackend final : public StoreBackend {
 public:
  struct Options {
    int64_t world_size = 1;
    // placement: the ranks of this process (default: all, as rank threads), the store (null: a
    // new InProcessStore, rank threads only), and the first GPU they use (placement.local_rank:
    // rank first_rank + i runs on device local_rank + i).
    RankPlacement placement;
    std::chrono::milliseconds timeout{30000};
    bool verify = true;
    std::shared_ptr<NcclApi> api;  // required
  };

  explicit NcclBackend(Options options);
  ~NcclBackend() override;

  std::string name() const override { return "nccl"; }
  std::shared_ptr<Communicator> new_group(int64_t rank, std::span<const int64_t> ranks,
                                          const BackendConfig& config) override;
  bool splits_world() const override { return true; }
  std::shared_ptr<Communicator> split_group(int64_t rank, std::span<const int64_t> ranks,
                                            const BackendConfig& config) override;

  // splits and inits count the communicators made each way (for tests and reports).
  int64_t splits() const;
  int64_t inits() const;

 private:
  std::shared_ptr<detail::NcclState> s_;
};

}  // namespace meshsim
