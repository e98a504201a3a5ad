// meshsim/registry_backend.hpp — the base of the backends whose SPMD bookkeeping is a rank
// registry (Gloo, NCCL, fiber): the run's one diagnosis, departures, what a blocked rank waits
// for, and the count of completed collectives are answered here once; a backend adds how it
// makes groups and what an abort does to its transport.
//
// Thread safety: every member is safe to call from any thread (the registry locks its own mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "meshsim/spmd_backend.hpp"

namespace meshsim {

namespace detail {
class RankRegistry;
}

class RegistryBackend : public SpmdBackend {
 public:
  int64_t world_size() const final;
  // world is new_group over every rank 0..world_size-1 (every rank calls it: SPMD).
  std::shared_ptr<Communicator> world(int64_t rank) final;
  bool aborted() const final;
  std::optional<Diagnosis> diagnosis() const final;
  // depart marks rank's program as ended (a rank of another process: nothing). A rank of this
  // process blocked in a collective that `rank` never entered then ends the run: abort with the
  // "departed" diagnosis.
  void depart(int64_t rank) final;
  std::vector<WaitInfo> waits() const final;
  double oldest_wait() const final;
  // sleep_for sleeps unless aborted first; returns false when woken by an abort.
  bool sleep_for(std::chrono::milliseconds d) override;
  int64_t collectives() const final;
  int64_t progress() const final;
  int64_t steps() const final;

 protected:
  RegistryBackend() = default;
  // attach hands over the registry the backend's state keeps (once, in its constructor).
  void attach(std::shared_ptr<detail::RankRegistry> registry) { registry_ = std::move(registry); }
  detail::RankRegistry& registry() const { return *registry_; }
  // on_depart runs after rank's departure is recorded and before the run aborts for it (Gloo
  // tells the other processes through the store).
  virtual void on_depart(int64_t rank) { (void)rank; }

 private:
  std::shared_ptr<detail::RankRegistry> registry_;
};

}  // namespace meshsim
