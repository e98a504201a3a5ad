#pragma once
// RankPlacement: where the ranks run in this process stand in a run's world, and what the
// processes of one run share. One value, handed down unchanged from the runner (SpmdOptions)
// through the registry (BackendRequest) to a backend that spans processes (Gloo's and NCCL's
// Options).
//
//   run_spmd({.world_size = 8, .backend = "gloo",
//             .placement = {.first_rank = rank, .local_ranks = 1, .store = store}}, program);
//
// The world's size stays beside it (every backend needs it; only a spanning one reads this).

#include <cstdint>
#include <memory>
#include <string>

#include "meshsim/store.hpp"

namespace meshsim {

struct RankPlacement {
  // The ranks run here: [first_rank, first_rank + local_ranks); local_ranks 0 means every rank
  // of the world (rank threads of one process).
  int64_t first_rank = 0;
  int64_t local_ranks = 0;
  // local_rank: where first_rank stands among its host's ranks (a launcher's LOCAL_RANK); a
  // backend with one device per rank runs rank first_rank + i on device local_rank + i.
  int64_t local_rank = 0;
  // The store the run's processes share (needed when not every rank runs here; null for rank
  // threads: the backend makes an in-process one).
  std::shared_ptr<Store> store;
  // prefix namespaces the run's keys in the store (the run's processes must agree on it).
  std::string prefix = "meshsim";

  // ranks_here: how many ranks of a world of `world` run here (local_ranks, or the world when
  // both local_ranks and first_rank are 0).
  int64_t ranks_here(int64_t world) const { return local_ranks == 0 && first_rank == 0 ? world : local_ranks; }
};

}  // namespace meshsim
