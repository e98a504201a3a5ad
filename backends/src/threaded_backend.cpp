#include "meshsim/threaded_backend.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "member_communicator.hpp"
#include "rank_registry.hpp"
#include "reduce.hpp"

namespace meshsim {

namespace {

using Clock = std::chrono::steady_clock;

std::string rank_list(std::span<const int64_t> v) { return format_ranks(v); }

using detail::Arrival;

// Slot is one rendezvous: a (group, sequence number), or one point-to-point message.
struct Slot {
  explicit Slot(std::size_t n) : at(n) {}
  std::vector<Arrival> at;
  // Written under the group's mutex; atomic so that a waiter may spin on them without it.
  std::atomic<int> arrived{0};
  CollectiveDesc first;  // the first arrival's description
  std::atomic<int> finished{0};
  int left = 0;
  bool mismatch = false;
};

// Group is the rendezvous of one group; its members, and how far each got for the SPMD
// bookkeeping, are the registry's record (info).
struct Group {
  std::shared_ptr<detail::GroupInfo> info;
  std::chrono::milliseconds timeout{0};
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::shared_ptr<Slot>> slots;
  // point to point: (src, dst, n-th message on that pair) -> slot of two arrivals [src, dst]
  std::map<std::tuple<int, int, uint64_t>, std::shared_ptr<Slot>> p2p;
};

}  // namespace

struct detail::ThreadedState {
  explicit ThreadedState(const ThreadedBackend::Options& o)
      : options(o), reg(o.world_size, 0, o.world_size), departed(std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(o.world_size))) {}

  ThreadedBackend::Options options;
  // The SPMD bookkeeping every registry backend shares: the run's diagnosis, who waits in what,
  // departures, the counts of collectives.
  RankRegistry reg;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // aborted mirrors reg.aborted() (set after the diagnosis is recorded) so that waiters test
  // it inside their group's lock without taking the registry's.
  std::atomic<bool> aborted{false};

  mutable std::mutex groups_mu;  // group creation only
  std::vector<std::shared_ptr<Group>> groups;
  // The rendezvous of each group record (by digest and instance, as the registry keys them).
  std::map<std::pair<uint64_t, int64_t>, std::shared_ptr<Group>> by_key;

  // A waiter's own test for a member that ended its program (a member that never created the
  // group is in no record of the registry's): set by on_depart, read without a lock.
  std::unique_ptr<std::atomic<bool>[]> departed;
  std::atomic<int64_t> departures{0};  // how many ranks departed (waiters scan only when > 0)

  void wake_all() {
    std::vector<std::shared_ptr<Group>> gs;
    {
      std::lock_guard lk(groups_mu);
      gs = groups;
    }
    for (auto& g : gs) {
      std::lock_guard lk(g->mu);
      g->cv.notify_all();
    }
  }

  [[noreturn]] void throw_aborted() const { reg.throw_aborted(); }
};

namespace {

class ThreadedCommunicator final : public detail::MemberCommunicator {
 public:
  ThreadedCommunicator(std::shared_ptr<detail::ThreadedState> s, ThreadedBackend* owner,
                       std::shared_ptr<Group> g, int me)
      : MemberCommunicator(std::shared_ptr<const std::vector<int64_t>>(g, &g->info->ranks), me, "threaded"),
        s_(std::move(s)), owner_(owner), g_(std::move(g)), me_(me) {}

  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) override {
    check_count(count);
    const CollectiveDesc d{CollectiveOp::kAllReduce, t, count, -1, op};
    const std::size_t es = dtype_size(t);
    // Rank k owns chunk k of every rank's buffer: it alone reads and writes that chunk, so it
    // reduces the chunk tile by tile (in group-rank order) into a cache-sized buffer and writes
    // the result straight into every rank's buffer. Each rank reads and writes count/n elements
    // of each buffer once: one memcpy's worth of traffic per rank, no shared scratch.
    collective(d, buf, buf, [&](Slot& slot, int n) {
      const int64_t lo = count * me_ / n, hi = count * (me_ + 1) / n;
      constexpr std::size_t kTileBytes = 32 * 1024;
      const int64_t tile = static_cast<int64_t>(kTileBytes / es);
      alignas(64) std::byte acc[kTileBytes];
      std::vector<const std::byte*> ins(static_cast<std::size_t>(n));
      for (int64_t at = lo; at < hi; at += tile) {
        const int64_t len = std::min(tile, hi - at);
        for (int r = 0; r < n; ++r) {
          ins[static_cast<std::size_t>(r)] =
              static_cast<const std::byte*>(slot.at[static_cast<std::size_t>(r)].in) + at * es;
        }
        detail::reduce_into(acc, ins, len, t, op);
        for (int r = 0; r < n; ++r) {
          std::memcpy(static_cast<std::byte*>(slot.at[static_cast<std::size_t>(r)].out) + at * es,
                      acc, static_cast<std::size_t>(len) * es);
        }
      }
    });
  }

  void broadcast(void* buf, int64_t count, DType t, int root) override {
    check_count(count);
    check_peer(root, "broadcast root", false);
    const CollectiveDesc d{CollectiveOp::kBroadcast, t, count, root, ReduceOp::kSum};
    collective(d, buf, buf, [&](Slot& slot, int) {
      if (me_ != root && count > 0) {
        std::memcpy(buf, slot.at[static_cast<std::size_t>(root)].in,
                    static_cast<std::size_t>(count) * dtype_size(t));
      }
    });
  }

  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    check_count(count);
    const CollectiveDesc d{CollectiveOp::kAllGather, t, count, -1, ReduceOp::kSum};
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(t);
    collective(d, in, out, [&](Slot& slot, int n) {
      for (int r = 0; r < n; ++r) {
        if (bytes) {
          std::memmove(static_cast<std::byte*>(out) + static_cast<std::size_t>(r) * bytes,
                       slot.at[static_cast<std::size_t>(r)].in, bytes);
        }
      }
    });
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t, ReduceOp op) override {
    check_count(count);
    const CollectiveDesc d{CollectiveOp::kReduceScatter, t, count, -1, op};
    const std::size_t es = dtype_size(t);
    collective(d, in, out, [&](Slot& slot, int n) {
      std::vector<const std::byte*> ins(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        ins[static_cast<std::size_t>(r)] =
            static_cast<const std::byte*>(slot.at[static_cast<std::size_t>(r)].in) +
            static_cast<std::size_t>(me_) * static_cast<std::size_t>(count) * es;
      }
      std::vector<std::byte> tmp(static_cast<std::size_t>(count) * es);
      detail::reduce_into(tmp.data(), ins, count, t, op);
      if (!tmp.empty()) std::memcpy(out, tmp.data(), tmp.size());
    });
  }

  void all_to_all(const void* in, void* out, int64_t count, DType t) override {
    check_count(count);
    const CollectiveDesc d{CollectiveOp::kAllToAll, t, count, -1, ReduceOp::kSum};
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(t);
    collective(d, in, out, [&](Slot& slot, int n) {
      for (int r = 0; r < n; ++r) {
        if (bytes) {
          std::memcpy(static_cast<std::byte*>(out) + static_cast<std::size_t>(r) * bytes,
                      static_cast<const std::byte*>(slot.at[static_cast<std::size_t>(r)].in) +
                          static_cast<std::size_t>(me_) * bytes,
                      bytes);
        }
      }
    });
  }

  void barrier() override {
    const CollectiveDesc d{CollectiveOp::kBarrier, DType::kInt64, 0, -1, ReduceOp::kSum};
    collective(d, nullptr, nullptr, nullptr);
  }

  void send(const void* buf, int64_t count, DType t, int peer) override {
    check_count(count);
    check_peer(peer, "send peer", true);
    point_to_point(CollectiveDesc{CollectiveOp::kSend, t, count, peer, ReduceOp::kSum}, buf,
                   nullptr, me_, peer, send_seq_[peer]++);
  }

  void recv(void* buf, int64_t count, DType t, int peer) override {
    check_count(count);
    check_peer(peer, "recv peer", true);
    point_to_point(CollectiveDesc{CollectiveOp::kRecv, t, count, peer, ReduceOp::kSum}, nullptr,
                   buf, peer, me_, recv_seq_[peer]++);
  }

 private:
  using Work = std::function<void(Slot&, int)>;

  int64_t global(int r) const { return g_->info->ranks[static_cast<std::size_t>(r)]; }
  const std::vector<int64_t>& ranks() const { return g_->info->ranks; }

  void check_count(int64_t count) const {
    if (count < 0) throw InvalidArgument("collective count " + std::to_string(count) + " is negative");
    if (count > (int64_t{1} << 40)) {
      throw OutOfRange("collective count " + std::to_string(count) + " exceeds 2^40 elements");
    }
  }

  // label names the collective numbered `seq` (counted from 1 here) as every backend does (#0 first).
  static std::string label(const CollectiveDesc& d, uint64_t seq) { return collective_label(d, seq - 1); }

  Clock::time_point deadline() const {
    const auto t = g_->timeout.count() > 0 ? g_->timeout : s_->options.timeout;
    return Clock::now() + t;
  }

  // Entered is a rank's wait in the registry (what the watchdog and a departure read), left
  // however the call ends.
  // A collective's members are let go together by the member that completed it (left = true).
  struct Entered {
    detail::RankRegistry& reg;
    int64_t rank;
    bool left = false;
    ~Entered() {
      if (!left) reg.leave(rank);
    }
  };

  // enter records the wait (a departed member that never entered ends the run, naming it).
  void enter(const CollectiveDesc& d, uint64_t seq) {
    if (auto gone = s_->reg.enter(global(me_), g_->info, static_cast<std::size_t>(me_), seq - 1, d)) {
      owner_->abort(std::move(*gone));
      s_->throw_aborted();
    }
  }
  void enter_p2p(const CollectiveDesc& d, int peer, uint64_t n_th) {
    if (auto gone = s_->reg.enter_p2p(global(me_), g_->info, global(peer), d, n_th)) {
      owner_->abort(std::move(*gone));
      s_->throw_aborted();
    }
  }

  // wait blocks until done(), failing on abort, on a departed member that is still missing
  // (missing() lists group ranks not yet there), and at the deadline.
  // `what` describes the wait for error messages; it is built only when one is written (a
  // description lists the group: O(group size), too much to build on every call).
  template <class Done, class Missing, class What>
  void wait(std::unique_lock<std::mutex>& lk, Done done, Missing missing, Clock::time_point until,
            const What& what, bool p2p = false) {
    while (!done()) {
      if (s_->aborted.load()) {
        lk.unlock();
        s_->throw_aborted();
      }
      for (int r : s_->departures.load() > 0 ? missing() : std::vector<int>{}) {
        if (s_->departed[static_cast<std::size_t>(global(r))].load()) {
          // A point-to-point message has one waiter (this rank); a collective, the whole group.
          Diagnosis dg = departed_diagnosis({global(r)}, what(), ranks(),
                                            p2p ? std::vector<int64_t>{global(me_)} : std::vector<int64_t>{});
          lk.unlock();
          owner_->abort(std::move(dg));
          s_->throw_aborted();
        }
      }
      if (g_->cv.wait_until(lk, until) == std::cv_status::timeout && !done() &&
          !s_->aborted.load()) {
        std::vector<int64_t> gone;
        for (int r : missing()) gone.push_back(global(r));
        throw DeadlineExceeded("rank " + std::to_string(global(me_)) + " waited past its deadline in " +
                               what() + " of group " + rank_list(ranks()) + "; ranks " + rank_list(gone) +
                               " never arrived");
      }
    }
  }

  std::vector<int> not_arrived(const Slot& slot) const {
    std::vector<int> out;
    for (std::size_t r = 0; r < slot.at.size(); ++r) {
      if (!slot.at[r].arrived) out.push_back(static_cast<int>(r));
    }
    return out;
  }

  // mismatch_of describes what the arrived ranks called, one entry per distinct description.
  Diagnosis mismatch_of(const Slot& slot, uint64_t seq) const {
    std::vector<std::pair<CollectiveDesc, std::vector<int64_t>>> kinds;
    for (std::size_t r = 0; r < slot.at.size(); ++r) {
      if (!slot.at[r].arrived) continue;
      auto it = std::find_if(kinds.begin(), kinds.end(),
                             [&](const auto& k) { return k.first == slot.at[r].desc; });
      if (it == kinds.end()) {
        kinds.push_back({slot.at[r].desc, {}});
        it = kinds.end() - 1;
      }
      it->second.push_back(global(static_cast<int>(r)));
    }
    std::vector<std::pair<std::string, std::vector<int64_t>>> calls;
    for (auto& [d, ranks] : kinds) calls.emplace_back(d.to_string(), std::move(ranks));
    return mismatch_diagnosis("#" + std::to_string(seq - 1), ranks(), calls);
  }

  // collective runs one rendezvous: arrive, check agreement, do the work (reading the other
  // ranks' buffers, or writing into them where each rank owns a disjoint part), then a barrier so
  // that no rank returns, and reuses its buffers, while another still touches them.
  void collective(const CollectiveDesc& d, const void* in, void* out, const Work& work) {
    if (s_->aborted.load()) s_->throw_aborted();
    const int n = size();
    const uint64_t seq = ++seq_;
    auto what = [&] { return label(d, seq); };
    const auto until = deadline();
    enter(d, seq);
    Entered entered{s_->reg, global(me_)};
    std::unique_lock lk(g_->mu);
    auto& ref = g_->slots[seq];
    if (!ref) ref = std::make_shared<Slot>(static_cast<std::size_t>(n));
    std::shared_ptr<Slot> slot = ref;
    Arrival& a = slot->at[static_cast<std::size_t>(me_)];
    a.arrived = true;
    a.desc = d;
    a.in = in;
    a.out = out;
    ++slot->arrived;
    auto all_here = [&] { return slot->arrived == n; };
    auto missing = [&] { return not_arrived(*slot); };
    // Compare with the first arrival only: O(1) per rank (the mismatch path names everyone).
    if (slot->arrived == 1) slot->first = d;
    const bool differs = !(slot->first == d);
    if (differs && !slot->mismatch) {
      // Give the rest of the group a moment so the diagnosis can name the odd rank out.
      slot->mismatch = true;
      g_->cv.notify_all();
      const auto grace = std::min(until, Clock::now() + s_->options.mismatch_grace);
      g_->cv.wait_until(lk, grace, [&] { return all_here() || s_->aborted.load(); });
      Diagnosis dg = mismatch_of(*slot, seq);
      lk.unlock();
      owner_->abort(std::move(dg));
      s_->throw_aborted();
    }
    const bool completed_here = all_here();
    if (completed_here) {
      g_->cv.notify_all();
    } else {
      lk.unlock();
      spin([&] { return slot->arrived.load() == n; });
      lk.lock();
    }
    wait(lk, [&] { return all_here() || slot->mismatch; }, missing, until, what);
    if (slot->mismatch) {
      lk.unlock();
      // The rank that found the mismatch aborts the run; wait for its diagnosis.
      wait_abort(until);
    }
    // Every member is here: none waits any more. The member that completed the rendezvous lets
    // them all go at once (after the lock: a member already in its next wait is left alone).
    entered.left = true;
    lk.unlock();
    if (completed_here) s_->reg.leave_collective(g_->info, seq - 1);
    // From here every rank of the group has arrived and only moves memory: the phase waits
    // neither abort nor time out, so no rank leaves while another still reads its buffers.
    std::exception_ptr err;
    auto run_phase = [&](const Work& w) {
      try {
        if (w) w(*slot, n);
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    };
    run_phase(work);
    lk.lock();
    if (++slot->finished == n) {
      g_->cv.notify_all();
    } else {
      lk.unlock();
      spin([&] { return slot->finished.load() == n; });
      lk.lock();
    }
    g_->cv.wait(lk, [&] { return slot->finished == n; });
    if (++slot->left == n) g_->slots.erase(seq);
    lk.unlock();
    if (err) std::rethrow_exception(err);
    s_->reg.count_collective();
  }

  // spin waits briefly for `ready` when the group fits on the machine's cores, so that a
  // rendezvous of a few ranks costs no sleep and wake-up; larger groups go straight to sleep.
  template <class Ready>
  void spin(Ready ready) const {
    if (size() > s_->cores) return;
    for (int i = 0; i < 2000 && !ready(); ++i) std::this_thread::yield();
  }

  void wait_abort(Clock::time_point until) {
    for (auto now = Clock::now(); !s_->aborted.load() && now < until; now = Clock::now()) {
      s_->reg.sleep_for(std::chrono::ceil<std::chrono::milliseconds>(until - now));
    }
    // This rank's deadline can come before the member that found the mismatch records it (that
    // member first waits its grace for the rest of the group): a deadline, not a fault of ours.
    if (!s_->aborted.load()) {
      throw DeadlineExceeded("rank " + std::to_string(global(me_)) + " waited past its deadline in group " +
                             rank_list(ranks()) + " for the diagnosis of a mismatched collective");
    }
    s_->throw_aborted();
  }

  void point_to_point(const CollectiveDesc& d, const void* in, void* out, int src, int dst,
                      uint64_t n_th) {
    if (s_->aborted.load()) s_->throw_aborted();
    const bool sender = d.op == CollectiveOp::kSend;
    auto what = [&] { return message_label(d, n_th, global(src), global(dst)); };
    const auto key = std::make_tuple(src, dst, n_th);
    const auto until = deadline();
    enter_p2p(d, sender ? dst : src, n_th);
    Entered entered{s_->reg, global(me_)};
    std::unique_lock lk(g_->mu);
    auto& ref = g_->p2p[key];
    if (!ref) ref = std::make_shared<Slot>(2);
    std::shared_ptr<Slot> slot = ref;
    Arrival& a = slot->at[sender ? 0 : 1];
    a.arrived = true;
    a.desc = d;
    a.in = in;
    a.out = out;
    ++slot->arrived;
    g_->cv.notify_all();
    const int other = sender ? dst : src;
    auto missing = [&] { return slot->arrived == 2 ? std::vector<int>{} : std::vector<int>{other}; };
    wait(lk, [&] { return slot->arrived == 2; }, missing, until, what, true);
    const Arrival& s = slot->at[0];
    const Arrival& r = slot->at[1];
    if (s.desc.dtype != r.desc.dtype || s.desc.count != r.desc.count) {
      Diagnosis dg = p2p_mismatch_diagnosis(ranks(), global(src), s.desc.to_string(), global(dst), r.desc.to_string());
      lk.unlock();
      owner_->abort(std::move(dg));
      s_->throw_aborted();
    }
    if (!sender) {
      if (d.count > 0) {
        std::memcpy(out, s.in, static_cast<std::size_t>(d.count) * dtype_size(d.dtype));
      }
      slot->finished = 1;
      g_->p2p.erase(key);
      g_->cv.notify_all();
    } else {
      wait(lk, [&] { return slot->finished == 1; }, [&] { return std::vector<int>{}; }, until,
           what, true);
    }
    lk.unlock();
    s_->reg.count_collective();
  }

  std::shared_ptr<detail::ThreadedState> s_;
  ThreadedBackend* owner_;
  std::shared_ptr<Group> g_;
  int me_;
  uint64_t seq_ = 0;
  std::map<int, uint64_t> send_seq_, recv_seq_;
};

}  // namespace

ThreadedBackend::ThreadedBackend(Options options) {
  if (options.world_size < 1 || options.world_size > (int64_t{1} << 20)) {
    throw InvalidArgument("threaded backend: world size " + std::to_string(options.world_size) +
                          " is out of range [1, 2^20]");
  }
  check_timeout("threaded backend", options.timeout);
  s_ = std::make_shared<detail::ThreadedState>(options);
  attach(std::shared_ptr<detail::RankRegistry>(s_, &s_->reg));
}

ThreadedBackend::~ThreadedBackend() = default;

std::shared_ptr<Communicator> ThreadedBackend::new_group(int64_t rank,
                                                        std::span<const int64_t> ranks,
                                                        const BackendConfig& config) {
  // The registry checks the member (O(group size) each) and the group (once), and meets the
  // n-th creation of the same (ranks, config) by a rank with the n-th by every other member.
  const detail::RankRegistry::GroupKey key = s_->reg.key(rank, ranks, config, "threaded");
  int64_t instance = 0;
  std::shared_ptr<detail::GroupInfo> info = s_->reg.group(rank, key, ranks, &instance);
  std::shared_ptr<Group> g;
  {
    std::lock_guard lk(s_->groups_mu);
    auto& ref = s_->by_key[{key.digest, instance}];
    if (!ref) {
      ref = std::make_shared<Group>();
      ref->info = info;
      ref->timeout = config.timeout;
      s_->groups.push_back(ref);
    }
    g = ref;
  }
  auto comm = std::make_shared<ThreadedCommunicator>(s_, this, g, static_cast<int>(key.member));
  comm->set_config(config);  // the group hands its config back
  return comm;
}

bool ThreadedBackend::abort(Diagnosis d) {
  if (!s_->reg.record(std::move(d))) return false;
  s_->aborted.store(true);
  s_->wake_all();
  return true;
}

void ThreadedBackend::on_depart(int64_t rank) {
  if (!s_->departed[static_cast<std::size_t>(rank)].exchange(true)) s_->departures.fetch_add(1);
  // Only a rank in a wait can be waiting for this one: a waiter that begins later reads the
  // flag above before it sleeps. (Waking every group on each departure made the end of a run
  // of thousands of ranks O(ranks x groups).)
  if (s_->reg.any_waiting()) s_->wake_all();
}

}  // namespace meshsim
