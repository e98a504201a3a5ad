#include "meshsim/threaded_backend.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
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

struct Group {
  std::vector<int64_t> ranks;
  std::chrono::milliseconds timeout{0};
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::shared_ptr<Slot>> slots;
  // point to point: (src, dst, n-th message on that pair) -> slot of two arrivals [src, dst]
  std::map<std::tuple<int, int, uint64_t>, std::shared_ptr<Slot>> p2p;
};

// RankWait is what the watchdog reads about one rank.
struct RankWait {
  std::mutex mu;
  bool active = false;
  std::shared_ptr<Group> group;
  uint64_t seq = 0;
  bool p2p = false;
  std::tuple<int, int, uint64_t> p2p_key;
  CollectiveDesc desc;
  Clock::time_point since;
};

}  // namespace

struct detail::ThreadedState {
  ThreadedBackend::Options options;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<bool> aborted{false};
  mutable std::mutex diag_mu;
  std::optional<Diagnosis> diagnosis;
  std::condition_variable sleep_cv;  // with diag_mu

  mutable std::mutex groups_mu;  // group creation only
  std::vector<std::shared_ptr<Group>> groups;
  // Groups by (digest of ranks and config, n-th creation); instances counts each rank's creations
  // per digest. Digests keep per-rank bookkeeping O(1) whatever the group size.
  std::map<std::pair<uint64_t, int64_t>, std::shared_ptr<Group>> by_key;
  std::map<std::pair<int64_t, uint64_t>, int64_t> instances;
  std::shared_ptr<Group> world;  // created once

  std::unique_ptr<std::atomic<bool>[]> departed;
  std::atomic<int64_t> departures{0};  // how many ranks departed (waiters scan only when > 0)
  std::unique_ptr<RankWait[]> waits;
  std::atomic<int64_t> collectives{0};
  std::atomic<int64_t> arrivals{0};  // ranks that began to wait in a collective or message

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
    std::lock_guard lk(diag_mu);
    sleep_cv.notify_all();
  }

  [[noreturn]] void throw_aborted() const {
    std::lock_guard lk(diag_mu);
    throw Aborted(diagnosis ? diagnosis->message : std::string("the run was aborted"));
  }
};

namespace {

class ThreadedCommunicator final : public detail::MemberCommunicator {
 public:
  ThreadedCommunicator(std::shared_ptr<detail::ThreadedState> s, ThreadedBackend* owner,
                       std::shared_ptr<Group> g, int me)
      : MemberCommunicator(std::shared_ptr<const std::vector<int64_t>>(g, &g->ranks), me, "threaded"),
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

  int64_t global(int r) const { return g_->ranks[static_cast<std::size_t>(r)]; }

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

  // RankWait bookkeeping for the watchdog.
  struct Waiting {
    RankWait& w;
    Waiting(RankWait& rw, std::shared_ptr<Group> g, uint64_t seq, const CollectiveDesc& d,
            bool p2p, std::tuple<int, int, uint64_t> key)
        : w(rw) {
      std::lock_guard lk(w.mu);
      w.active = true;
      w.group = std::move(g);
      w.seq = seq;
      w.desc = d;
      w.p2p = p2p;
      w.p2p_key = key;
      w.since = Clock::now();
    }
    ~Waiting() {
      std::lock_guard lk(w.mu);
      w.active = false;
      w.group.reset();
    }
  };

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
          Diagnosis dg = departed_diagnosis({global(r)}, what(), g_->ranks,
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
                               what() + " of group " + rank_list(g_->ranks) + "; ranks " + rank_list(gone) +
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
    return mismatch_diagnosis("#" + std::to_string(seq - 1), g_->ranks, calls);
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
    RankWait& rw = s_->waits[static_cast<std::size_t>(global(me_))];
    s_->arrivals.fetch_add(1, std::memory_order_relaxed);
    Waiting waiting(rw, g_, seq, d, false, {});
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
    if (all_here()) {
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
    lk.unlock();
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
    s_->collectives.fetch_add(1, std::memory_order_relaxed);
  }

  // spin waits briefly for `ready` when the group fits on the machine's cores, so that a
  // rendezvous of a few ranks costs no sleep and wake-up; larger groups go straight to sleep.
  template <class Ready>
  void spin(Ready ready) const {
    if (size() > s_->cores) return;
    for (int i = 0; i < 2000 && !ready(); ++i) std::this_thread::yield();
  }

  void wait_abort(Clock::time_point until) {
    std::unique_lock lk(s_->diag_mu);
    s_->sleep_cv.wait_until(lk, until, [&] { return s_->aborted.load(); });
    lk.unlock();
    s_->throw_aborted();
  }

  void point_to_point(const CollectiveDesc& d, const void* in, void* out, int src, int dst,
                      uint64_t n_th) {
    if (s_->aborted.load()) s_->throw_aborted();
    const bool sender = d.op == CollectiveOp::kSend;
    auto what = [&] { return message_label(d, n_th, global(src), global(dst)); };
    const auto key = std::make_tuple(src, dst, n_th);
    const auto until = deadline();
    RankWait& rw = s_->waits[static_cast<std::size_t>(global(me_))];
    s_->arrivals.fetch_add(1, std::memory_order_relaxed);
    Waiting waiting(rw, g_, n_th, d, true, key);
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
      Diagnosis dg = p2p_mismatch_diagnosis(g_->ranks, global(src), s.desc.to_string(), global(dst), r.desc.to_string());
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
    s_->collectives.fetch_add(1, std::memory_order_relaxed);
  }

  std::shared_ptr<detail::ThreadedState> s_;
  ThreadedBackend* owner_;
  std::shared_ptr<Group> g_;
  int me_;
  uint64_t seq_ = 0;
  std::map<int, uint64_t> send_seq_, recv_seq_;
};

}  // namespace

ThreadedBackend::ThreadedBackend(Options options) : s_(std::make_shared<detail::ThreadedState>()) {
  if (options.world_size < 1 || options.world_size > (int64_t{1} << 20)) {
    throw InvalidArgument("threaded backend: world size " + std::to_string(options.world_size) +
                          " is out of range [1, 2^20]");
  }
  check_timeout("threaded backend", options.timeout);
  s_->options = options;
  const auto n = static_cast<std::size_t>(options.world_size);
  s_->departed = std::make_unique<std::atomic<bool>[]>(n);
  s_->waits = std::make_unique<RankWait[]>(n);
  s_->world = std::make_shared<Group>();
  s_->world->ranks.resize(n);
  for (std::size_t i = 0; i < n; ++i) s_->world->ranks[i] = static_cast<int64_t>(i);
  s_->groups.push_back(s_->world);
}

ThreadedBackend::~ThreadedBackend() = default;

int64_t ThreadedBackend::world_size() const { return s_->options.world_size; }

std::shared_ptr<Communicator> ThreadedBackend::world(int64_t rank) {
  // One world group for every rank, built once: O(1) per rank.
  if (rank < 0 || rank >= s_->options.world_size) {
    throw OutOfRange("rank " + std::to_string(rank) + " is out of range [0, " +
                     std::to_string(s_->options.world_size) + ")");
  }
  return std::make_shared<ThreadedCommunicator>(s_, this, s_->world, static_cast<int>(rank));
}

std::shared_ptr<Communicator> ThreadedBackend::new_group(int64_t rank,
                                                        std::span<const int64_t> ranks,
                                                        const BackendConfig& config) {
  const int64_t world = s_->options.world_size;
  if (rank < 0 || rank >= world) {
    throw OutOfRange("rank " + std::to_string(rank) + " is out of range [0, " + std::to_string(world) + ")");
  }
  detail::check_backend(config, "threaded");
  if (ranks.empty()) throw InvalidArgument("new_group: a group needs at least one rank");
  auto pos = std::find(ranks.begin(), ranks.end(), rank);
  if (pos == ranks.end()) {
    throw InvalidArgument("new_group: rank " + std::to_string(rank) + " is not a member of " +
                          rank_list(ranks));
  }
  // The n-th creation of the same (ranks, config) by a rank meets the n-th by every other member.
  const uint64_t digest = detail::group_digest(ranks, config.fingerprint());
  std::shared_ptr<Group> g;
  {
    std::lock_guard lk(s_->groups_mu);
    const int64_t instance = s_->instances[{rank, digest}]++;
    auto& ref = s_->by_key[{digest, instance}];
    if (!ref) {
      // The first member validates the ranks once for the whole group.
      std::vector<int64_t> sorted(ranks.begin(), ranks.end());
      std::sort(sorted.begin(), sorted.end());
      for (std::size_t i = 0; i < sorted.size(); ++i) {
        if (sorted[i] < 0 || sorted[i] >= world) {
          s_->instances[{rank, digest}]--;
          throw OutOfRange("new_group: rank " + std::to_string(sorted[i]) + " is out of range [0, " +
                           std::to_string(world) + ")");
        }
        if (i && sorted[i] == sorted[i - 1]) {
          s_->instances[{rank, digest}]--;
          throw InvalidArgument("new_group: rank " + std::to_string(sorted[i]) + " appears twice");
        }
      }
      ref = std::make_shared<Group>();
      ref->ranks.assign(ranks.begin(), ranks.end());
      ref->timeout = config.timeout;
      s_->groups.push_back(ref);
    } else if (!std::equal(ranks.begin(), ranks.end(), ref->ranks.begin(), ref->ranks.end())) {
      throw Internal("new_group: two different groups share the digest " + std::to_string(digest));
    }
    g = ref;
  }
  auto comm = std::make_shared<ThreadedCommunicator>(s_, this, g, static_cast<int>(pos - ranks.begin()));
  comm->set_config(config);  // the group hands its config back
  return comm;
}

bool ThreadedBackend::abort(Diagnosis d) {
  {
    std::lock_guard lk(s_->diag_mu);
    if (s_->diagnosis) return false;
    s_->diagnosis = std::move(d);
    s_->aborted.store(true);
  }
  s_->wake_all();
  return true;
}

bool ThreadedBackend::aborted() const { return s_->aborted.load(); }

std::optional<Diagnosis> ThreadedBackend::diagnosis() const {
  std::lock_guard lk(s_->diag_mu);
  return s_->diagnosis;
}

void ThreadedBackend::depart(int64_t rank) {
  if (rank < 0 || rank >= s_->options.world_size) return;
  if (!s_->departed[static_cast<std::size_t>(rank)].exchange(true)) s_->departures.fetch_add(1);
  s_->wake_all();
}

std::vector<WaitInfo> ThreadedBackend::waits() const {
  std::vector<WaitInfo> out;
  const auto now = Clock::now();
  // Ranks waiting in one collective share its group's list and one missing list (computed once):
  // a world waiting in the world group is O(world), not O(world^2).
  std::map<std::pair<const Group*, uint64_t>, SharedRanks> missing;
  for (int64_t r = 0; r < s_->options.world_size; ++r) {
    RankWait& w = s_->waits[static_cast<std::size_t>(r)];
    std::shared_ptr<Group> g;
    WaitInfo info;
    bool p2p = false;
    std::tuple<int, int, uint64_t> key;
    {
      std::lock_guard lk(w.mu);
      if (!w.active) continue;
      g = w.group;
      info.rank = r;
      info.seq = w.seq;
      info.desc = w.desc;
      info.seconds = std::chrono::duration<double>(now - w.since).count();
      p2p = w.p2p;
      key = w.p2p_key;
    }
    info.group = SharedRanks(std::shared_ptr<const std::vector<int64_t>>(g, &g->ranks));
    if (p2p) {
      std::lock_guard lk(g->mu);
      auto it = g->p2p.find(key);
      if (it == g->p2p.end() || it->second->arrived < 2) {
        const int other = info.desc.op == CollectiveOp::kSend ? std::get<1>(key) : std::get<0>(key);
        info.missing = SharedRanks{g->ranks[static_cast<std::size_t>(other)]};
      }
    } else {
      auto [it, fresh] = missing.try_emplace({g.get(), info.seq});
      if (fresh) {
        std::vector<int64_t> m;
        std::lock_guard lk(g->mu);
        auto slot = g->slots.find(info.seq);
        for (std::size_t i = 0; i < g->ranks.size(); ++i) {
          if (slot == g->slots.end() || !slot->second->at[i].arrived) m.push_back(g->ranks[i]);
        }
        it->second = SharedRanks(std::move(m));
      }
      info.missing = it->second;
      --info.seq;  // collectives are numbered from 0 in what ranks read (slots count from 1)
    }
    out.push_back(std::move(info));
  }
  return out;
}

double ThreadedBackend::oldest_wait() const {
  // What the watchdog asks every period: O(ranks) with no group list copied and no group lock
  // taken (waits() is for the diagnosis only).
  std::optional<Clock::time_point> oldest;
  for (int64_t r = 0; r < s_->options.world_size; ++r) {
    RankWait& w = s_->waits[static_cast<std::size_t>(r)];
    std::lock_guard lk(w.mu);
    if (w.active && (!oldest || w.since < *oldest)) oldest = w.since;
  }
  return oldest ? std::chrono::duration<double>(Clock::now() - *oldest).count() : 0.0;
}

bool ThreadedBackend::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lk(s_->diag_mu);
  return !s_->sleep_cv.wait_for(lk, d, [&] { return s_->aborted.load(); });
}

int64_t ThreadedBackend::collectives() const { return s_->collectives.load(); }
int64_t ThreadedBackend::progress() const { return s_->collectives.load() + s_->arrivals.load(); }

}  // namespace meshsim
