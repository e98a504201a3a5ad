// meshsim/threaded_backend.hpp — ranks as threads of one process, meeting in shared memory.
//
//   auto backend = std::make_shared<ThreadedBackend>(ThreadedBackend::Options{.world_size = 8});
//   // on the thread of rank r:
//   auto world = backend->world(r);
//   auto tp = backend->new_group(r, tp_ranks, BackendConfig{});
//
// Each group keeps one rendezvous per sequence number: ranks post their buffers, wait until the
// group has arrived, and then each rank moves its own share of the data (a reduction of one
// chunk, a copy of the blocks it receives) directly between the other ranks' buffers. There is
// no lock shared by groups on the data path; a group's mutex guards only its bookkeeping.
// Reductions combine ranks in group order, so results are bit-identical from run to run.
//
// Failure: abort(d) records the first diagnosis and wakes every waiter, which throws Aborted with
// the diagnosis (naming the rank at fault); depart(r) says rank r's program ended, so a collective
// still waiting for r fails at once naming it. waits() tells a watchdog, per blocked rank, the
// collective it waits in and the ranks that have not arrived. That bookkeeping (the diagnosis,
// waits, departures, counts) is the rank registry Gloo, NCCL and fibers keep too
// (RegistryBackend); this backend adds the rendezvous and the memory moves.
//
// Thread safety: every member is safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/registry_backend.hpp"

namespace meshsim {

namespace detail {
struct ThreadedState;
}

class ThreadedBackend final : public RegistryBackend {
 public:
  struct Options {
    int64_t world_size = 1;
    // timeout is the deadline of every wait unless a group's BackendConfig sets one.
    std::chrono::milliseconds timeout{30000};
    // mismatch_grace is how long a rank that found a mismatch waits for the rest of the group,
    // so the diagnosis can name the odd rank(s) out rather than whoever arrived first.
    std::chrono::milliseconds mismatch_grace{200};
  };

  explicit ThreadedBackend(Options options);
  ~ThreadedBackend() override;

  std::string name() const override { return "threaded"; }
  std::shared_ptr<Communicator> new_group(int64_t rank, std::span<const int64_t> ranks,
                                          const BackendConfig& config) override;
  // abort records the run's one diagnosis and wakes every waiter (false if it had one).
  bool abort(Diagnosis d) override;

 private:
  // A rank's departure wakes the waiters, which look for a departed member they still wait for.
  void on_depart(int64_t rank) override;
  std::shared_ptr<detail::ThreadedState> s_;
};

}  // namespace meshsim
