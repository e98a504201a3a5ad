// meshsim/gloo_backend.hpp — ranks that talk over Gloo's TCP transport: rank threads of one
// process (sharing one TCP device) or one rank per process, rendezvousing through a Store.
//
//   // 8 rank threads in this process, loopback, an in-process store:
//   auto b = std::make_shared<GlooBackend>(GlooBackend::Options{.world_size = 8});
//   // one rank of a job launched by `meshsim launch` (MESHSIM_STORE names the TCP store):
//   auto store = std::make_shared<TcpStoreClient>(TcpStoreOptions{.host = h, .port = p});
//   auto b = std::make_shared<GlooBackend>(GlooBackend::Options{
//       .world_size = 4, .placement = {.first_rank = r, .local_ranks = 1, .store = store}});
//
// Groups are Gloo contexts: every member of a new group connects a full mesh over the store
// under a prefix unique to (ranks, config, instance), reusing the process's device. Every
// collective of the Communicator interface runs with the group's deadline:
//   - all_reduce: Gloo's allreduce with meshsim's pairwise kernels (kAvg = sum, then divide);
//     bfloat16/float16 all-gather and reduce in float32 in group-rank order, as the threaded
//     backend does. For float32/float64 the ring's order is fixed, so results repeat from run
//     to run, but they may differ from the threaded backend's group-rank order in the last bits.
//   - reduce_scatter (this Gloo has no options-API one): an alltoall of the blocks, then each
//     rank reduces the blocks it received in group-rank order, so results equal the threaded
//     backend's bit for bit. Gloo's old ReduceScatterHalvingDoubling is never used: it slows
//     every later call on its context ~300x.
//   - broadcast, all_gather, all_to_all, barrier: Gloo's options API; send/recv: unbound buffers.
// With `verify` (the default) ranks first all-gather what they are about to call (op, dtype,
// count, root, reduce op), so a mismatched collective fails at once on every member with a
// "mismatch" diagnosis naming the odd rank(s), instead of corrupting data or hanging as raw
// Gloo does. It costs one small all-gather per collective; benchmarks turn it off.
//
// Failure: abort(d) records the diagnosis, writes it to the store ("<prefix>/failure", the
// first writer wins, so other processes can name the rank at fault) and closes the connections
// of the ranks of this process that are not inside a collective (departed, failed, sleeping):
// their peers' blocked calls then fail within a round trip, close their own connections as
// they unwind, and so on, instead of waiting for the deadline. A rank whose collective fails
// explains why before it throws: the run's diagnosis if there is one here or in the store, or
// a member whose process ended abruptly ("<prefix>/exit/<rank>", set by the store server when
// that process's connection dropped, see TcpStoreClient::set_will, or by exit_abruptly for a
// thread). Only then does it report the raw transport error.
//
// Process state: constructing a GlooBackend sets SIGPIPE to ignored when it has the default
// action (a write to a peer that died would otherwise kill the process).
//
// Limits (measured on 2 cores, see README): connect time grows as n² binds (0.14 s for a world
// of 32 rank threads, 0.9 s at 64), and every context holds a socket per peer, so a process's
// descriptor limit (raised to its hard limit here) bounds the pairs: a group that would pass it
// is refused with ResourceExhausted, and more than kMaxThreadRanks rank threads in one process
// are refused outright (128 need more than the 20000 descriptors typical machines allow).
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

#include "meshsim/rank_placement.hpp"
#include "meshsim/registry_backend.hpp"
#include "meshsim/store.hpp"

namespace meshsim {

namespace detail {
struct GlooState;
}

class GlooBackend final : public StoreBackend {
 public:
  // kMaxThreadRanks: rank threads in one process (each pair is a socket: n(n-1) descriptors).
  static constexpr int64_t kMaxThreadRanks = 64;

  struct Options {
    int64_t world_size = 1;
    // placement: the ranks that run in this process (default: all of them, as rank threads) and
    // the rendezvous store (null: a new InProcessStore, only for rank threads).
    RankPlacement placement;
    // hostname or iface of the TCP device (hostname wins when both are set).
    std::string hostname = "127.0.0.1";
    std::string iface;
    std::chrono::milliseconds timeout{30000};
    bool verify = true;
  };

  explicit GlooBackend(Options options);
  ~GlooBackend() override;

  std::string name() const override { return "gloo"; }
  // new_group (and world) connect a Gloo context: every member must call them (SPMD).
  std::shared_ptr<Communicator> new_group(int64_t rank, std::span<const int64_t> ranks,
                                          const BackendConfig& config) override;

  // connect_seconds is the time spent connecting contexts, summed over this process's ranks.
  double connect_seconds() const override;

 private:
  // After an abort, ranks outside any collective close their connections (their peers then
  // fail fast); a rank that departs after the abort closes its own; a rank that exits abruptly
  // closes them as a killed process's would (exit_abruptly: the caller's thread must then stop
  // using the rank).
  void on_abort() override;
  void on_departed(int64_t rank) override;
  bool can_exit() const override { return true; }
  void on_exit(int64_t rank) override;
  std::shared_ptr<detail::GlooState> s_;
};


}  // namespace meshsim
