// meshsim/spmd_backend.hpp — what the SPMD runner needs from a backend beyond making groups:
// one diagnosis per run, failure propagation, departures and a view of blocked ranks.
//
//   SpmdBackend& b = ...;                     // any registered backend (create_backend)
//   b.abort({DiagnosisKind::kError, {3}, "rank 3 failed: ...", {}, {}});  // first diagnosis wins
//   for (const WaitInfo& w : b.waits()) ...;  // what every blocked rank waits for
//
// Contract shared by every implementation: abort(d) records the first diagnosis only and makes
// every collective blocked on a rank of this process fail soon after (Aborted naming the rank at
// fault) — at once for shared memory, within a socket round trip for Gloo (whose waiters are
// woken by closing the connections of ranks that are not inside a collective); depart(r) says
// rank r's program ended, so a collective still waiting for r fails naming it; waits() lists
// the ranks blocked in a collective now, with the members that have not arrived where the
// backend can know them (every rank of this process).
//
// Thread safety: every member is safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/communicator.hpp"
#include "meshsim/rank_text.hpp"

namespace meshsim {

// DiagnosisKind is what kind of failure stopped a run; to_string gives its one name ("departed"),
// the one reports print and the store carries; diagnosis_kind parses it back (nullopt for an
// unknown name).
//   error      a rank's program threw          mismatch  members called different collectives
//   stall      a wait passed the timeout       mesh      ranks built different meshes
//   departed   a rank ended without joining    check     a rank's own check failed (ctx.fail)
//   exit       a rank's process or thread died  store     the store was lost
//   connect    a group could not be connected  assertion a test's fatal assertion on a rank
enum class DiagnosisKind { kError, kMismatch, kStall, kMesh, kDeparted, kCheck, kExit, kStore, kConnect, kAssertion };
std::string_view to_string(DiagnosisKind kind);
std::optional<DiagnosisKind> diagnosis_kind(std::string_view name);

// Diagnosis is why a run stopped: its kind, the ranks at fault, a readable message, and for
// stalls the ranks that were waiting and the ranks they waited for.
struct Diagnosis {
  DiagnosisKind kind = DiagnosisKind::kError;
  std::vector<int64_t> ranks;
  std::string message;
  std::vector<int64_t> waiting;
  std::vector<int64_t> missing;
};

// SharedRanks is an immutable list of global ranks that many values share (every rank waiting
// in one group holds the same list): copying one is O(1), so a world of ranks waiting in the
// world group costs O(world), not O(world^2). Built from a vector or a brace list; reads as a
// const std::vector<int64_t>&.
class SharedRanks {
 public:
  SharedRanks() = default;
  SharedRanks(std::vector<int64_t> ranks) : p_(std::make_shared<const std::vector<int64_t>>(std::move(ranks))) {}
  SharedRanks(std::initializer_list<int64_t> ranks) : SharedRanks(std::vector<int64_t>(ranks)) {}
  explicit SharedRanks(std::shared_ptr<const std::vector<int64_t>> ranks) : p_(std::move(ranks)) {}
  const std::vector<int64_t>& get() const { return p_ ? *p_ : none(); }
  operator const std::vector<int64_t>&() const { return get(); }
  operator std::span<const int64_t>() const { return get(); }
  auto begin() const { return get().begin(); }
  auto end() const { return get().end(); }
  std::size_t size() const { return get().size(); }
  bool empty() const { return get().empty(); }
  int64_t operator[](std::size_t i) const { return get()[i]; }
  // identity: the same list object (equal lists built apart are not the same).
  const void* identity() const { return p_.get(); }
  friend bool operator==(const SharedRanks& a, const SharedRanks& b) { return a.get() == b.get(); }

 private:
  static const std::vector<int64_t>& none() {
    static const std::vector<int64_t> kNone;
    return kNone;
  }
  std::shared_ptr<const std::vector<int64_t>> p_;
};

// WaitInfo is one blocked rank: the group (global ranks), the collective and its sequence number,
// the group members that have not arrived, and how long it has waited. Ranks waiting in one
// collective share its group and missing lists.
struct WaitInfo {
  int64_t rank = 0;
  SharedRanks group;
  uint64_t seq = 0;
  CollectiveDesc desc;
  SharedRanks missing;
  double seconds = 0;
  // to_string: "rank 3 waits in all_gather(int64, count=1) #2 of group [0, 1, 2, 3] for [1]".
  std::string to_string() const;
};

// The diagnosis texts, written once for every backend and local mode, so that one fault reads
// the same everywhere:
//
// - A collective is named with its arguments and its number in its group: `#0` is the group's
//   first collective, counted by every member alike (point-to-point messages are not counted).
//   collective_label(desc, 2) == "all_reduce(sum, int64, count=1) #2".
// - format_ranks (rank_text.hpp): "[0, 1, 2, 3]", at most `limit` ranks listed.
// - departed_diagnosis: members that ended their program without joining a collective the others
//   wait in: "rank 3 ended its program without joining all_reduce(sum, int64, count=1) #2 of group
//   [0, 1, 2, 3] (ranks [0, 1, 2] wait for it)" (the waiting ranks: the group's other members,
//   sorted, whichever of them noticed first; a point-to-point message names its one waiter).
// - mismatch_diagnosis: members of one collective that called different things; `calls` pairs
//   each description with the ranks that called it (listed sorted, calls by their lowest rank); the culprits are the ranks holding a
//   description fewer ranks hold than the most common one (on a tie, every rank):
//   "collective mismatch at #0 of group [0, 1, 2, 3]: ranks [0, 1, 2] called all_reduce(sum,
//   int64, count=2); rank 3 called all_reduce(sum, int64, count=3)". The first 16 calls are
//   listed, the others counted ("... and 24 more different calls").
std::string collective_label(const std::string& call, uint64_t number);
std::string collective_label(const CollectiveDesc& d, uint64_t number);
// message_label names the n-th message (counted from 0) from global rank src to dst:
// "send(int64, count=3, peer=2) #0 from rank 1 to rank 2" (d: the send or the recv).
std::string message_label(const CollectiveDesc& d, uint64_t nth, int64_t src, int64_t dst);
Diagnosis departed_diagnosis(std::vector<int64_t> gone, const std::string& collective, std::span<const int64_t> group,
                             std::vector<int64_t> waiting = {});
// `at`: the collective's number ("#0"), or its name where the caller does not count (local mode).
Diagnosis mismatch_diagnosis(const std::string& at, std::span<const int64_t> group,
                             std::vector<std::pair<std::string, std::vector<int64_t>>> calls);
// p2p_mismatch_diagnosis: a send and the recv that met it disagree on dtype or count (every
// backend words it so): "send/recv mismatch in group [0, 1, 2, 3]: rank 1 called send(int64,
// count=3, peer=2), rank 2 called recv(int64, count=2, peer=1)"; both ranks are at fault.
Diagnosis p2p_mismatch_diagnosis(std::span<const int64_t> group, int64_t src, const std::string& send, int64_t dst,
                                 const std::string& recv);
// mesh_diagnosis: ranks `odd` built a different mesh than the recipe's (against_recipe) or than
// the other ranks': "rank 2 built a different mesh than the recipe's: its rank map differs (this
// rank built DeviceMesh(...))"; `parts` are the parts that differ, in the order shape, names,
// layout, rank map; `built` is the odd rank's mesh as text.
Diagnosis mesh_diagnosis(std::vector<int64_t> odd, const std::vector<std::string>& parts, bool against_recipe,
                         const std::string& built);

// encode_diagnosis / decode_diagnosis: the store form of a Diagnosis (kind, ranks, message), how
// processes of one run tell each other why it stopped; decode is nullopt on malformed text.
std::string encode_diagnosis(const Diagnosis& d);
std::optional<Diagnosis> decode_diagnosis(const std::string& text);

// stall_diagnosis explains what every blocked rank waits for ("stall: <why>; ranks [..] never
// arrived; <each distinct wait>; <extra>"); the ranks at fault are those missing from some
// collective while waiting in none (on a cycle, every missing rank; with no missing rank known,
// the waiting ones). Ranks waiting in the same collective are one entry ("ranks [0, 1, ...
// (4095 ranks)] wait in ... for rank 5"); at most 16 entries are written, then a count, so the
// message stays a few kilobytes at any world size, and the work is O(waiting ranks + distinct
// lists).
Diagnosis stall_diagnosis(const std::vector<WaitInfo>& waits, const std::string& why, const std::string& extra = "");

// check_timeout is the one rule for a wait's deadline: InvalidArgument naming `who` unless the
// timeout is > 0 ms.
void check_timeout(const std::string& who, std::chrono::milliseconds timeout);

class SpmdBackend : public Backend {
 public:
  // abort records `d` if no diagnosis was recorded before (returns whether it was) and wakes
  // every waiter.
  virtual bool abort(Diagnosis d) = 0;
  virtual bool aborted() const = 0;
  virtual std::optional<Diagnosis> diagnosis() const = 0;
  // depart marks rank's program as ended.
  virtual void depart(int64_t rank) = 0;
  // waits lists every rank blocked in a collective now.
  virtual std::vector<WaitInfo> waits() const = 0;
  // oldest_wait is how long the longest-blocked rank has waited, in seconds (0: none). A
  // watchdog asks it every period: a backend answers without copying every waiter's group.
  virtual double oldest_wait() const;
  // sleep_for sleeps unless aborted first; returns false when woken by an abort.
  virtual bool sleep_for(std::chrono::milliseconds d) = 0;
  // collectives counts the collectives completed by the ranks of this process (summed).
  virtual int64_t collectives() const = 0;
  // progress grows with every arrival in a collective and every completion: what a watchdog
  // watches to tell a slow world from a stalled one (default: completions only).
  virtual int64_t progress() const { return collectives(); }
  // steps counts the bookkeeping records the ranks' own calls visited (a group's members read
  // to create it, a departure scan, a scheduler's pass over its ranks), not a watchdog's reads;
  // -1 where the backend does not count. Divided by progress(), it is the work per arrival, which
  // tests hold constant as the world grows.
  virtual int64_t steps() const { return -1; }

  // runs_ranks: the backend runs the ranks' programs itself (run_ranks, e.g. as fibers of the
  // calling thread) instead of a runner's thread per rank. run_ranks calls rank_main(r) for every
  // rank and returns when all returned (rank_main catches its own exceptions); the default throws
  // InvalidArgument.
  virtual bool runs_ranks() const { return false; }
  virtual void run_ranks(const std::function<void(int64_t)>& rank_main);
  // exit_abruptly ends rank (of this process) the way a killed process ends, where the backend
  // can show that (its connections dropped, its will in the store); false where it cannot (the
  // runner then records an "exit" diagnosis).
  virtual bool exit_abruptly(int64_t rank) {
    (void)rank;
    return false;
  }
  // connect_seconds: time spent connecting groups, summed over this process's ranks (0 where
  // groups cost nothing to make).
  virtual double connect_seconds() const { return 0; }
};

}  // namespace meshsim
