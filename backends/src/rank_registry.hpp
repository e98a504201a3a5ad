// rank_registry.hpp (backends-private) — the bookkeeping the transport backends (Gloo, NCCL)
// share for the SPMD runner: the run's one diagnosis, which rank of this process is inside
// which collective, departures, and what a blocked rank waits for.
//
// Thread safety: every member locks the registry's mutex; safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "meshsim/spmd_backend.hpp"
#include "meshsim/rank_placement.hpp"
#include "meshsim/store.hpp"

namespace meshsim::detail {

// GroupInfo is what this process knows of one group: how far each member got (members of other
// processes stay at 0 and are never reported missing).
struct GroupInfo {
  std::vector<int64_t> ranks;
  std::vector<uint64_t> entered;  // collectives each member has entered (guarded by the registry)
  std::vector<bool> local;
  // The collective members of this process wait in (guarded by the registry): how many wait,
  // and the highest sequence number any waits at with its description. Collectives complete in
  // order, so a member that entered fewer than wait_seq + 1 of them is one they wait for.
  int64_t waiters = 0;
  int64_t departed = 0;     // members of this process that joined it, then ended their program
  int64_t joined = 0;       // members of this process that created it (called group())
  int64_t local_count = 0;  // members of this process
  uint64_t wait_seq = 0;
  CollectiveDesc wait_desc;
};

std::string rank_list(const std::vector<int64_t>& v, std::size_t limit = 16);

// group_digest keys a group by its ranks (in order) and config, the same in every process: the
// one group digest of every backend (FNV-style, one step per rank rather than per byte: every
// rank of a 16384-rank group hashes it).
uint64_t group_digest(std::span<const int64_t> ranks, uint64_t config_fingerprint);

// check_backend refuses a group config that names another backend than the run's.
void check_backend(const BackendConfig& config, const char* backend);

// check_member validates what each member of a new group checks for itself: the config names
// no other backend, rank runs here ([first, first + count)), the group is not empty and rank is
// a member of it. O(group size).
void check_member(int64_t rank, std::span<const int64_t> ranks, int64_t first, int64_t count,
                  const BackendConfig& config, const char* backend);
// check_members validates what is the same for every member, so it is checked once per group:
// the members are distinct and in [0, world). O(group size), plus a sorted copy when the group
// is not in increasing order.
void check_members(std::span<const int64_t> ranks, int64_t world);

// this_host is gethostname(); process_alive says whether /proc/<pid> is a live (not zombie)
// process of this host.
std::string this_host();
bool process_alive(const std::string& pid);

// hex64 writes v as 16 lowercase hex digits (group keys in the store).
std::string hex64(uint64_t v);

// publish_failure tells the other processes of a run why it stopped: `d` under `key` in the
// store unless a diagnosis is there already; a lost store is ignored (each process then keeps
// its own diagnosis).
void publish_failure(Store& store, const std::string& key, const Diagnosis& d);

// lookup_key reads `key` without waiting; nullopt when absent or the store is unreachable.
std::optional<std::string> lookup_key(Store& store, const std::string& key);

// check_placement validates a transport backend's placement: world >= 1, the ranks run here
// [first_rank, first_rank + local_ranks) within it (local_ranks becomes ranks_here(world)), a
// positive timeout, and a store shared by the processes when not every rank runs here (a null
// store becomes an InProcessStore for rank threads).
void check_placement(const char* backend, int64_t world, RankPlacement* placement, std::chrono::milliseconds timeout);

// The wire form of a CollectiveDesc for the agreement check (op, dtype, count, root, reduce).
inline constexpr std::size_t kDescWords = 5;
void encode_desc(const CollectiveDesc& d, int64_t* out);
CollectiveDesc decode_desc(const int64_t* in);

// mismatch_diagnosis: when the members of `group` (global ranks, in group order) did not all
// call the same collective #seq (`descs`, one per member), the "mismatch" diagnosis naming the
// ranks whose description is held by fewer ranks than the most common one (on a tie, every
// rank involved) and every description; nullopt when they agree.
std::optional<Diagnosis> mismatch_diagnosis(const std::vector<CollectiveDesc>& descs,
                                            const std::vector<int64_t>& group, uint64_t seq);

class RankRegistry {
 public:
  using Clock = std::chrono::steady_clock;

  RankRegistry(int64_t world, int64_t first, int64_t count);

  int64_t world() const { return world_; }
  int64_t first() const { return first_; }
  int64_t count() const { return count_; }
  bool all_local() const { return count_ == world_; }
  bool runs_here(int64_t rank) const { return rank >= first_ && rank < first_ + count_; }

  // world_ranks is [0, world), built once: a backend's world(rank) passes it to new_group,
  // and key() knows it without reading it.
  std::span<const int64_t> world_ranks() const { return world_ranks_; }

  // GroupKey is what every member of a new group computes first: the group's digest and the
  // member's index in it. key() checks the member (check_member) and hashes the ranks, O(group
  // size) per member, except for world_ranks() itself, which is O(1): with a world of 65,536
  // fibers, every rank reading the world's members made creating it O(world^2).
  struct GroupKey {
    uint64_t digest = 0;
    std::size_t member = 0;
  };
  GroupKey key(int64_t rank, std::span<const int64_t> ranks, const BackendConfig& config, const char* backend);

  // group returns the shared record of the n-th group with this digest that `rank` (member
  // `key.member`) creates (the n-th creation by each member meets the n-th by every other)
  // and its instance number. The first member here to create it checks the members
  // (check_members, once per group: a sorted copy of a 16,384-rank group per member would be
  // O(n^2 log n) for the group); the others compare their list with its (Internal if two
  // groups share a digest).
  std::shared_ptr<GroupInfo> group(int64_t rank, const GroupKey& key, std::span<const int64_t> ranks,
                                   int64_t* instance);

  // enter marks `rank` (member `member` of `g`) inside collective `seq`; throws Aborted when the
  // run is diagnosed. Returns the diagnosis to record when a member of this process departed
  // without entering this collective (the caller aborts with it), else nullopt.
  std::optional<Diagnosis> enter(int64_t rank, const std::shared_ptr<GroupInfo>& g, std::size_t member,
                                 uint64_t seq, const CollectiveDesc& d);
  // enter_p2p marks `rank` inside its nth message (d: send or recv) with `peer` (global) in group `g`:
  // a wait for one peer, not a collective of the group (messages are not numbered and leave
  // the group's collective bookkeeping alone). Returns the "departed" diagnosis when the peer
  // runs here and already ended its program, else nullopt; throws Aborted when diagnosed.
  std::optional<Diagnosis> enter_p2p(int64_t rank, const std::shared_ptr<GroupInfo>& g, int64_t peer,
                                     const CollectiveDesc& d, uint64_t nth);
  // enter_connect marks `rank` as connecting group `g` (a wait without a collective).
  void enter_connect(int64_t rank, const std::shared_ptr<GroupInfo>& g);
  void leave(int64_t rank);
  // leave_collective: every member of `g` here still waiting in its collective `seq` leaves
  // it, under one lock (the member whose arrival completed a collective of thousands of rank
  // threads lets them all go at once, instead of each taking the lock on its way out).
  // O(group size). A member may enter its next wait first: entering leaves the wait before, so
  // the two may come in either order; leave() after it is harmless.
  void leave_collective(const std::shared_ptr<GroupInfo>& g, uint64_t seq);
  bool in_op(int64_t rank) const;
  Clock::time_point entered_at(int64_t rank) const;

  // record keeps `d` if it is the first diagnosis (returns whether it was) and wakes sleepers.
  bool record(Diagnosis d);
  bool aborted() const;
  std::optional<Diagnosis> diagnosis() const;
  [[noreturn]] void throw_aborted() const;

  // depart marks rank's program as ended; returns the diagnosis of a rank of this process
  // blocked in a collective that `rank` never entered (nullopt when none, or when diagnosed).
  std::optional<Diagnosis> depart(int64_t rank);
  bool departed(int64_t rank) const;

  // waits lists every waiting rank (ranks in one collective share its group and missing
  // lists): O(waiting ranks + distinct waits x group size), for a diagnosis. oldest_wait is the
  // age of the oldest wait in seconds (0: none), O(1) (the waits are a list in the order they
  // began), for a watchdog that asks often.
  std::vector<WaitInfo> waits() const;
  double oldest_wait() const;
  // any_waiting: some rank of this process is in a wait (O(1)).
  bool any_waiting() const;
  bool sleep_for(std::chrono::milliseconds d);

  // count_collective: a rank of this process completed a collective; collectives sums them.
  void count_collective() { completed_.fetch_add(1, std::memory_order_relaxed); }
  int64_t collectives() const { return completed_.load(std::memory_order_relaxed); }
  // progress: completions plus arrivals (enter), for the watchdog.
  int64_t progress() const { return completed_.load(std::memory_order_relaxed) + arrivals_.load(std::memory_order_relaxed); }
  // steps counts the records the ranks' own calls visited (a member in a departure scan, a
  // group's members read to create it, a scheduler's pass over its ranks: count_steps), not the
  // watchdog's reads: what a test divides by the arrivals to prove an arrival costs O(1).
  void count_steps(int64_t n) { steps_.fetch_add(n, std::memory_order_relaxed); }
  int64_t steps() const { return steps_.load(std::memory_order_relaxed); }

 private:
  // Slot is one rank of this process. Its wait holds no copy of the group's members (the
  // group is wait_group, shared; waits() copies it): entering a collective is O(1).
  struct Slot {
    bool in_op = false;
    bool departed = false;
    std::optional<WaitInfo> wait;
    std::shared_ptr<GroupInfo> wait_group;  // the group of the wait (a collective or a connect)
    bool in_collective = false;             // wait_group's collective, not its connect
    int64_t p2p_peer = -1;                  // the peer of the message it waits in (-1: none)
    int64_t p2p_waiters = 0;                // ranks here waiting in a message with this one
    Clock::time_point since;
    // The waiting slots form a list in the order their waits began (since only grows).
    int64_t prev = -1, next = -1;
    bool linked = false;
    std::map<uint64_t, int64_t> instances;
    // The groups this rank is a member of, and its index in each: what depart() looks at.
    std::vector<std::pair<std::shared_ptr<GroupInfo>, std::size_t>> memberships;
  };
  Slot& slot(int64_t rank) { return slots_[static_cast<std::size_t>(rank - first_)]; }
  const Slot& slot(int64_t rank) const { return slots_[static_cast<std::size_t>(rank - first_)]; }

  // clear_wait ends the slot's wait, if any (under mu_).
  void clear_wait(Slot& s);
  // start_wait / end_wait keep the list of waiting slots (under mu_).
  void start_wait(Slot& s);
  void end_wait(Slot& s);

  const int64_t world_, first_, count_;
  std::vector<int64_t> world_ranks_;
  mutable std::mutex mu_;
  int64_t wait_head_ = -1, wait_tail_ = -1;  // slot indices, oldest wait first
  std::map<uint64_t, uint64_t> world_digests_;  // by config fingerprint
  // Messages entered per (group, src, dst, op: send or recv): a peer that entered the matching
  // message (its count past the waiter's number) is no longer awaited.
  std::map<std::tuple<const GroupInfo*, int64_t, int64_t, int>, uint64_t> messages_;
  // peer_joined: the peer of the message `w` waits in has entered its side of it.
  bool peer_joined(const GroupInfo* g, const WaitInfo& w, int64_t peer) const;
  std::condition_variable cv_;
  std::optional<Diagnosis> diag_;
  std::vector<Slot> slots_;
  std::map<std::pair<uint64_t, int64_t>, std::shared_ptr<GroupInfo>> groups_;
  int64_t departed_ = 0;  // ranks of this process whose program ended
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> arrivals_{0};
  std::atomic<int64_t> steps_{0};
};

}  // namespace meshsim::detail
