// meshsim/fiber_backend.hpp — the fiber backend ("fiber"): every rank of an SPMD program runs as
// a fiber (its own stack) in one thread; a collective suspends its rank until every member of
// the group has arrived, and the last arrival computes it for all of them.
//
//   auto b = std::make_shared<FiberBackend>(FiberBackend::Options{.world_size = 8});
//   b->run([&](int64_t rank) { ... b->world(rank)->all_reduce(...) ... });   // one thread
//
// Semantics equal the threaded backend's: the same checks, reductions in group-rank order (bit
// for bit the same floats), the same mismatch and departure diagnoses. What one thread cannot
// express is refused, never approximated: sleep_for (a rank waiting in time while the others
// wait for it) throws InvalidArgument naming the rank. A program in which every unfinished rank
// waits in a collective that can never complete (a cycle, or a group some members never reach)
// is diagnosed at once as a stall listing who waits for whom: in one thread nothing else could
// ever happen, so there is no timeout to wait for.
//
// Thread safety: run() executes every rank on the calling thread; abort(), diagnosis(),
// waits() and collectives() may be called from other threads (a watchdog).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/registry_backend.hpp"

namespace meshsim {

namespace detail {
struct FiberState;
}

class FiberBackend final : public RegistryBackend {
 public:
  // kMaxRanks: fibers per run (each has its own stack).
  static constexpr int64_t kMaxRanks = 65536;
  // A rank's stack when Options::stack_bytes is 0: kDefaultStackBytes, or less where the
  // address-space limit (RLIMIT_AS, `ulimit -v`) cannot hold the world's stacks in 5/8 of it,
  // down to kMinAutoStackBytes (65,536 ranks then fit a 16 GB limit).
  static constexpr std::size_t kDefaultStackBytes = 512 * 1024;
  static constexpr std::size_t kMinAutoStackBytes = 128 * 1024;

  struct Options {
    int64_t world_size = 1;
    std::size_t stack_bytes = 0;  // per rank (reserved, committed as touched); 0: see kDefaultStackBytes
    // on_switch(rank) is called on the running thread whenever `rank` stops running (it waits
    // in a collective or its program ended): whatever the program reported since it last
    // started running belongs to that rank (used to attribute GoogleTest results).
    std::function<void(int64_t)> on_switch;
  };

  explicit FiberBackend(Options options);
  ~FiberBackend() override;

  // run executes rank_main(r) for every rank as fibers on this thread until every one returned
  // (rank_main must catch its own exceptions). Once only.
  void run(const std::function<void(int64_t)>& rank_main);
  bool runs_ranks() const override { return true; }
  void run_ranks(const std::function<void(int64_t)>& rank_main) override { run(rank_main); }

  std::string name() const override { return "fiber"; }
  std::shared_ptr<Communicator> new_group(int64_t rank, std::span<const int64_t> ranks,
                                          const BackendConfig& config) override;

  bool abort(Diagnosis d) override;
  // sleep_for cannot be expressed in one thread: it throws InvalidArgument.
  bool sleep_for(std::chrono::milliseconds d) override;

 private:
  std::shared_ptr<detail::FiberState> s_;
};

}  // namespace meshsim
