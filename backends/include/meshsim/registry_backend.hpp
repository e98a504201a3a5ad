// meshsim/registry_backend.hpp — the base of the backends whose SPMD bookkeeping is a rank
// registry (threaded, Gloo, NCCL, fiber): the run's one diagnosis, departures, what a blocked rank waits
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
#include "meshsim/store.hpp"

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

// StoreBackend is the layer of the registry backends whose ranks may span processes meeting
// through a Store (Gloo, NCCL), written once: the run's diagnosis is published under
// "<prefix>/failure" as it is recorded; across processes a rank whose program returned is
// published under "<prefix>/departed/<rank>", so a peer's census names it; a rank that exits
// abruptly under "<prefix>/exit/<rank>". A backend adds what each does to its transport.
class StoreBackend : public RegistryBackend {
 public:
  // abort records `d` (false when the run already has a diagnosis), publishes it, then on_abort.
  bool abort(Diagnosis d) final;
  // exit_abruptly ends `rank` (of this process; OutOfRange otherwise) the way a killed process
  // ends: the store learns "<prefix>/exit/<rank>" and on_exit closes its transport; no diagnosis
  // is written, so its peers must find out for themselves. false where the backend cannot.
  bool exit_abruptly(int64_t rank) final;

 protected:
  StoreBackend() = default;
  // attach_store names the run's store and key prefix (once, in the backend's constructor).
  void attach_store(std::shared_ptr<Store> store, std::string prefix);
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  virtual void on_abort() {}
  virtual void on_departed(int64_t rank) { (void)rank; }
  // can_exit: the backend can close one rank's transport (on_exit) as a killed process would.
  virtual bool can_exit() const { return false; }
  virtual void on_exit(int64_t rank) { (void)rank; }

 private:
  void on_depart(int64_t rank) final;
  std::shared_ptr<Store> store_;
  std::string prefix_;
};

}  // namespace meshsim
