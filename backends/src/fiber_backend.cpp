#include "meshsim/fiber_backend.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "meshsim/error.hpp"
#include "member_communicator.hpp"
#include "rank_registry.hpp"
#include "reduce.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define MESHSIM_ASAN_FIBERS 1
#endif

namespace meshsim {

namespace {

using detail::GroupInfo;
using detail::rank_list;

using detail::Arrival;

struct Slot {
  int arrived = 0, left = 0;
  bool done = false;
  std::vector<Arrival> at;
  std::vector<int64_t> waiting;  // ranks suspended here
};

// P2P is one message: the send and the receive meet here.
struct P2P {
  Arrival send, recv;
  bool done = false;
  int64_t waiting = -1;
};

struct Group {
  std::shared_ptr<GroupInfo> info;
  std::map<uint64_t, Slot> slots;
  std::map<std::tuple<int, int, uint64_t>, P2P> p2p;  // (src, dst, n-th message)
};

struct Fiber {
  ucontext_t ctx{};
  void* stack = nullptr;
  std::size_t stack_size = 0;
  bool blocked = false, done = false;
  void* fake_stack = nullptr;  // AddressSanitizer's per-fiber bookkeeping
};

}  // namespace

struct detail::FiberState {
  explicit FiberState(const FiberBackend::Options& o) : opt(o), reg(o.world_size, 0, o.world_size) {}
  FiberBackend::Options opt;
  detail::RankRegistry reg;
  std::map<std::pair<uint64_t, int64_t>, std::shared_ptr<Group>> groups;

  // The scheduler (the run() thread only).
  void* stacks = nullptr;  // every fiber's stack, one mapping
  std::size_t stacks_bytes = 0;
  std::vector<Fiber> fibers;
  std::deque<int64_t> runnable;
  int64_t current = -1;
  ucontext_t main_ctx{};
  const void* main_bottom = nullptr;
  std::size_t main_size = 0;
  void* main_fake = nullptr;
  const std::function<void(int64_t)>* rank_main = nullptr;
  bool ran = false;
  std::thread::id runner;

  void wake(int64_t r) {
    Fiber& f = fibers[static_cast<std::size_t>(r)];
    if (f.blocked) {
      f.blocked = false;
      runnable.push_back(r);
    }
  }
  void wake_all() {
    for (std::size_t r = 0; r < fibers.size(); ++r) wake(static_cast<int64_t>(r));
  }

  // suspend: the running rank waits; the scheduler runs others until it is woken.
  void suspend() {
    const int64_t r = current;
    Fiber& f = fibers[static_cast<std::size_t>(r)];
    f.blocked = true;
    if (opt.on_switch) opt.on_switch(r);
#ifdef MESHSIM_ASAN_FIBERS
    __sanitizer_start_switch_fiber(&f.fake_stack, main_bottom, main_size);
#endif
    swapcontext(&f.ctx, &main_ctx);
#ifdef MESHSIM_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(f.fake_stack, &main_bottom, &main_size);
#endif
  }

  void resume(int64_t r) {
    Fiber& f = fibers[static_cast<std::size_t>(r)];
    current = r;
#ifdef MESHSIM_ASAN_FIBERS
    __sanitizer_start_switch_fiber(&main_fake, f.stack, f.stack_size);
#endif
    swapcontext(&main_ctx, &f.ctx);
#ifdef MESHSIM_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(main_fake, nullptr, nullptr);
#endif
    current = -1;
  }

  static void trampoline(unsigned lo, unsigned hi) {
    auto* s = reinterpret_cast<FiberState*>(static_cast<uintptr_t>(lo) | (static_cast<uintptr_t>(hi) << 32));
    const int64_t r = s->current;
#ifdef MESHSIM_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(nullptr, &s->main_bottom, &s->main_size);
#endif
    try {
      (*s->rank_main)(r);
    } catch (...) {
      // rank_main catches its own; nothing may unwind past a fiber's first frame.
    }
    Fiber& f = s->fibers[static_cast<std::size_t>(r)];
    f.done = true;
    if (s->opt.on_switch) s->opt.on_switch(r);
#ifdef MESHSIM_ASAN_FIBERS
    __sanitizer_start_switch_fiber(nullptr, s->main_bottom, s->main_size);  // this fiber ends
#endif
    setcontext(&s->main_ctx);
  }

  // stall: every unfinished rank waits in a collective that nothing can complete any more.
  Diagnosis stall() const {
    Diagnosis d = stall_diagnosis(reg.waits(), "every unfinished rank waits in a collective that cannot complete "
                                               "(fiber backend: nothing else can happen)");
    if (d.ranks.empty()) d.ranks = d.waiting;
    return d;
  }
};

namespace {

class FiberCommunicator final : public detail::MemberCommunicator {
 public:
  FiberCommunicator(std::shared_ptr<detail::FiberState> s, FiberBackend* owner, std::shared_ptr<Group> g, int me)
      : MemberCommunicator(std::shared_ptr<const std::vector<int64_t>>(g, &g->info->ranks), me, "fiber"),
        s_(std::move(s)), owner_(owner), g_(std::move(g)), me_(me) {}

  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) override {
    check_count(count);
    const std::size_t es = dtype_size(t);
    collective({CollectiveOp::kAllReduce, t, count, -1, op}, buf, buf, [&](Slot& slot, int n) {
      std::vector<const std::byte*> ins;
      for (int r = 0; r < n; ++r) ins.push_back(static_cast<const std::byte*>(slot.at[static_cast<std::size_t>(r)].in));
      std::vector<std::byte> acc(static_cast<std::size_t>(count) * es);
      detail::reduce_into(acc.data(), ins, count, t, op);
      for (int r = 0; r < n; ++r) {
        if (!acc.empty()) std::memcpy(slot.at[static_cast<std::size_t>(r)].out, acc.data(), acc.size());
      }
    });
  }

  void broadcast(void* buf, int64_t count, DType t, int root) override {
    check_count(count);
    check_peer(root, "broadcast root", false);
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(t);
    collective({CollectiveOp::kBroadcast, t, count, root, ReduceOp::kSum}, buf, buf, [&](Slot& slot, int n) {
      for (int r = 0; r < n; ++r) {
        if (r != root && bytes) {
          std::memcpy(slot.at[static_cast<std::size_t>(r)].out, slot.at[static_cast<std::size_t>(root)].in, bytes);
        }
      }
    });
  }

  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    check_count(count);
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(t);
    collective({CollectiveOp::kAllGather, t, count, -1, ReduceOp::kSum}, in, out, [&](Slot& slot, int n) {
      if (!bytes) return;
      // Gather into a copy first: a rank's input may alias another's output.
      std::vector<std::byte> all(bytes * static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) std::memcpy(all.data() + bytes * static_cast<std::size_t>(r), slot.at[static_cast<std::size_t>(r)].in, bytes);
      for (int r = 0; r < n; ++r) std::memcpy(slot.at[static_cast<std::size_t>(r)].out, all.data(), all.size());
    });
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t, ReduceOp op) override {
    check_count(count);
    const std::size_t block = static_cast<std::size_t>(count) * dtype_size(t);
    collective({CollectiveOp::kReduceScatter, t, count, -1, op}, in, out, [&](Slot& slot, int n) {
      std::vector<std::vector<std::byte>> results(static_cast<std::size_t>(n), std::vector<std::byte>(block));
      for (int k = 0; k < n; ++k) {
        std::vector<const std::byte*> ins;
        for (int r = 0; r < n; ++r) {
          ins.push_back(static_cast<const std::byte*>(slot.at[static_cast<std::size_t>(r)].in) + block * static_cast<std::size_t>(k));
        }
        detail::reduce_into(results[static_cast<std::size_t>(k)].data(), ins, count, t, op);
      }
      for (int k = 0; k < n; ++k) {
        if (block) std::memcpy(slot.at[static_cast<std::size_t>(k)].out, results[static_cast<std::size_t>(k)].data(), block);
      }
    });
  }

  void all_to_all(const void* in, void* out, int64_t count, DType t) override {
    check_count(count);
    const std::size_t block = static_cast<std::size_t>(count) * dtype_size(t);
    collective({CollectiveOp::kAllToAll, t, count, -1, ReduceOp::kSum}, in, out, [&](Slot& slot, int n) {
      if (!block) return;
      const std::size_t whole = block * static_cast<std::size_t>(n);
      std::vector<std::byte> all(whole * static_cast<std::size_t>(n));  // every input, copied first
      for (int r = 0; r < n; ++r) std::memcpy(all.data() + whole * static_cast<std::size_t>(r), slot.at[static_cast<std::size_t>(r)].in, whole);
      for (int dst = 0; dst < n; ++dst) {
        for (int src = 0; src < n; ++src) {
          std::memcpy(static_cast<std::byte*>(slot.at[static_cast<std::size_t>(dst)].out) + block * static_cast<std::size_t>(src),
                      all.data() + whole * static_cast<std::size_t>(src) + block * static_cast<std::size_t>(dst), block);
        }
      }
    });
  }

  void barrier() override {
    collective({CollectiveOp::kBarrier, DType::kInt64, 0, -1, ReduceOp::kSum}, nullptr, nullptr, [](Slot&, int) {});
  }

  void send(const void* buf, int64_t count, DType t, int peer) override {
    check_count(count);
    check_peer(peer, "send peer", true);
    p2p({CollectiveOp::kSend, t, count, peer, ReduceOp::kSum}, buf, nullptr, me_, peer,
        sent_[peer]++);
  }

  void recv(void* buf, int64_t count, DType t, int peer) override {
    check_count(count);
    check_peer(peer, "recv peer", true);
    p2p({CollectiveOp::kRecv, t, count, peer, ReduceOp::kSum}, nullptr, buf, peer, me_,
        received_[peer]++);
  }

 private:
  int64_t global(int r) const { return g_->info->ranks[static_cast<std::size_t>(r)]; }

  void check_count(int64_t count) const {
    if (count < 0) throw InvalidArgument("collective count " + std::to_string(count) + " is negative");
    if (count > (int64_t{1} << 40)) throw OutOfRange("collective count " + std::to_string(count) + " exceeds 2^40 elements");
  }

  void enter(const CollectiveDesc& d) {
    if (auto gone = s_->reg.enter(global(me_), g_->info, static_cast<std::size_t>(me_), seq_, d)) {
      owner_->abort(*gone);
      s_->reg.throw_aborted();
    }
  }
  void finish() {
    s_->reg.leave(global(me_));
    ++seq_;
    s_->reg.count_collective();
  }

  template <class Compute>
  void collective(const CollectiveDesc& d, const void* in, void* out, Compute compute) {
    enter(d);
    const int n = size();
    const uint64_t seq = seq_;
    Slot& slot = g_->slots[seq];  // std::map nodes stay put while other slots come and go
    if (slot.at.empty()) slot.at.resize(static_cast<std::size_t>(n));
    slot.at[static_cast<std::size_t>(me_)] = {true, d, in, out};
    ++slot.arrived;
    auto leave_slot = [&] {
      if (++slot.left == n) g_->slots.erase(seq);
    };
    if (slot.arrived < n) {
      slot.waiting.push_back(global(me_));
      while (!slot.done && !s_->reg.aborted()) s_->suspend();
      if (!slot.done) {
        s_->reg.leave(global(me_));
        leave_slot();
        s_->reg.throw_aborted();
      }
    } else {
      std::vector<CollectiveDesc> descs;
      for (const Arrival& a : slot.at) descs.push_back(a.desc);
      if (auto dg = detail::mismatch_diagnosis(descs, g_->info->ranks, seq)) {
        owner_->abort(*dg);
        s_->reg.leave(global(me_));
        leave_slot();
        s_->reg.throw_aborted();
      }
      compute(slot, n);
      slot.done = true;
      for (int64_t r : slot.waiting) s_->wake(r);
    }
    leave_slot();
    finish();
  }

  // p2p: a message is a wait for one peer, not a collective of the group (not numbered).
  void p2p(const CollectiveDesc& d, const void* in, void* out, int src, int dst, uint64_t nth) {
    if (auto gone = s_->reg.enter_p2p(global(me_), g_->info, global(src == me_ ? dst : src), d, nth)) {
      owner_->abort(*gone);
      s_->reg.throw_aborted();
    }
    const auto key = std::make_tuple(src, dst, nth);
    P2P& m = g_->p2p[key];
    const bool sending = d.op == CollectiveOp::kSend;
    (sending ? m.send : m.recv) = Arrival{true, d, in, out};
    if (!(m.send.arrived && m.recv.arrived)) {
      m.waiting = global(me_);
      while (!m.done && !s_->reg.aborted()) s_->suspend();
      if (!m.done) {
        s_->reg.leave(global(me_));
        s_->reg.throw_aborted();
      }
      g_->p2p.erase(key);
    } else {
      if (m.send.desc.dtype != m.recv.desc.dtype || m.send.desc.count != m.recv.desc.count) {
        owner_->abort(p2p_mismatch_diagnosis(g_->info->ranks, global(src), m.send.desc.to_string(), global(dst),
                                             m.recv.desc.to_string()));
        s_->reg.leave(global(me_));
        s_->reg.throw_aborted();
      }
      const std::size_t bytes = static_cast<std::size_t>(d.count) * dtype_size(d.dtype);
      if (bytes) std::memcpy(m.recv.out, m.send.in, bytes);
      m.done = true;
      if (m.waiting >= 0) s_->wake(m.waiting);
    }
    s_->reg.leave(global(me_));
    s_->reg.count_collective();
  }

  std::shared_ptr<detail::FiberState> s_;
  FiberBackend* owner_;
  std::shared_ptr<Group> g_;
  int me_;
  uint64_t seq_ = 0;
  // Messages sent to / received from each peer so far (only the peers used: a group of 16,384
  // ranks is not 2 x 16,384 counters per rank).
  std::map<int, uint64_t> sent_, received_;
};

}  // namespace

FiberBackend::FiberBackend(Options options) {
  if (options.world_size < 1 || options.world_size > kMaxRanks) {
    throw InvalidArgument("fiber backend: world size " + std::to_string(options.world_size) +
                          " is out of range [1, " + std::to_string(kMaxRanks) + "] for rank fibers");
  }
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const auto n = static_cast<std::size_t>(options.world_size);
  // The address-space limit (ulimit -v), where there is one: the stacks may take 5/8 of it.
  std::optional<std::size_t> budget;
  if (rlimit lim{}; getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    budget = static_cast<std::size_t>(lim.rlim_cur / 8 * 5);
  }
  if (options.stack_bytes == 0) {
    // The default: 512 KiB, less (down to 128 KiB) where the limit cannot hold n of them.
    options.stack_bytes = kDefaultStackBytes;
    if (budget && *budget / n < kDefaultStackBytes + page) {
      options.stack_bytes = std::max<std::size_t>(kMinAutoStackBytes, (*budget / n - page) / page * page);
    }
  }
  if (options.stack_bytes < 64 * 1024) {
    throw InvalidArgument("fiber backend: a stack of " + std::to_string(options.stack_bytes) +
                          " bytes is under the 64 KiB minimum");
  }
#ifdef MESHSIM_ASAN_FIBERS
  options.stack_bytes *= 4;  // instrumented frames are larger
#endif
  s_ = std::make_shared<detail::FiberState>(options);
  attach(std::shared_ptr<detail::RankRegistry>(s_, &s_->reg));
  // Every stack in one mapping, reserved, not committed (a stack costs the pages it touches),
  // here rather than in run(): a world the address space cannot hold is refused where the
  // backend is made, with the count it could hold.
  detail::FiberState& st = *s_;
  const std::size_t size = (st.opt.stack_bytes + page - 1) / page * page + page;  // + a guard page
  if (n > SIZE_MAX / size) throw ResourceExhausted("fiber backend: " + std::to_string(n) + " stacks overflow the address space");
  st.stacks_bytes = size * n;
  st.stacks = mmap(nullptr, st.stacks_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (st.stacks == MAP_FAILED) {
    st.stacks = nullptr;
    std::string could;
    if (budget) {
      could = "; the address-space limit (ulimit -v) of " + std::to_string(*budget / 5 * 8 >> 20) + " MiB holds about " +
              std::to_string(*budget / size) + " such stacks";
    }
    throw ResourceExhausted("fiber backend: cannot reserve " + std::to_string(n) + " rank stacks of " + std::to_string(size) +
                            " bytes (" + std::to_string(st.stacks_bytes >> 20) + " MiB of address space" + could +
                            "): run fewer ranks, or smaller stacks with --rank-stack-kib (64 and up)");
  }
}

FiberBackend::~FiberBackend() {
  if (s_->stacks) munmap(s_->stacks, s_->stacks_bytes);
}

void FiberBackend::run(const std::function<void(int64_t)>& rank_main) {
  detail::FiberState& s = *s_;
  if (s.ran) throw FailedPrecondition("fiber backend: run() was called before; a backend runs once");
  s.ran = true;
  s.runner = std::this_thread::get_id();
  s.rank_main = &rank_main;
  const auto n = static_cast<std::size_t>(s.opt.world_size);
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t size = s.stacks_bytes / n;  // reserved by the constructor, guard page included
  s.fibers.resize(n);
  // A guard page under each stack makes an overflow fault instead of corrupting a neighbour;
  // each splits the mapping in two, so the guards are kept only while two mappings per fiber
  // stay 8,192 under the kernel's limit (vm.max_map_count, 65,530 by default: up to about
  // 28,000 fibers); beyond, the fibers run without guards.
  int64_t max_maps = 65530;
  if (std::ifstream f("/proc/sys/vm/max_map_count"); f) f >> max_maps;
  const bool guards = static_cast<int64_t>(2 * n) + 8192 < max_maps;
  const auto self = reinterpret_cast<uintptr_t>(&s);
  for (std::size_t r = 0; r < n; ++r) {
    Fiber& f = s.fibers[r];
    void* mem = static_cast<std::byte*>(s.stacks) + r * size;
    if (guards) mprotect(mem, page, PROT_NONE);
    f.stack = mem;
    f.stack_size = size;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = mem;
    f.ctx.uc_stack.ss_size = size;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, reinterpret_cast<void (*)()>(&detail::FiberState::trampoline), 2,
                static_cast<unsigned>(self & 0xFFFFFFFFu), static_cast<unsigned>(self >> 32));
    f.blocked = true;
    s.wake(static_cast<int64_t>(r));
  }
  std::size_t done = 0;
  while (done < n) {
    int64_t resumed = 0;
    while (!s.runnable.empty()) {
      const int64_t r = s.runnable.front();
      s.runnable.pop_front();
      s.resume(r);
      ++resumed;
    }
    // The queue ran dry: every rank finished or waits. Counting them is O(ranks), once per
    // time the queue drains (the end, or a deadlock), never per arrival.
    done = 0;
    for (const Fiber& f : s.fibers) done += f.done ? 1 : 0;
    s.reg.count_steps(resumed + static_cast<int64_t>(n));
    if (done == n) break;
    // Every unfinished rank is suspended and none can run: diagnose (unless already diagnosed),
    // then wake them all so their collectives end with Aborted.
    if (!s.reg.aborted()) abort(s.stall());
    s.wake_all();
  }
}

std::shared_ptr<Communicator> FiberBackend::new_group(int64_t rank, std::span<const int64_t> ranks,
                                                      const BackendConfig& config) {
  const detail::RankRegistry::GroupKey key = s_->reg.key(rank, ranks, config, "fiber");
  int64_t instance = 0;
  std::shared_ptr<GroupInfo> info = s_->reg.group(rank, key, ranks, &instance);
  auto& g = s_->groups[{key.digest, instance}];
  if (!g) {
    g = std::make_shared<Group>();
    g->info = info;
  }
  const int me = static_cast<int>(key.member);
  auto comm = std::make_shared<FiberCommunicator>(s_, this, g, me);
  comm->set_config(config);  // the group hands its config back
  return comm;
}

bool FiberBackend::abort(Diagnosis d) {
  if (!s_->reg.record(std::move(d))) return false;
  // Suspended ranks resume and their collectives throw Aborted. From another thread (a
  // watchdog) the scheduler does this itself once no rank can run.
  if (std::this_thread::get_id() == s_->runner) s_->wake_all();
  return true;
}

bool FiberBackend::sleep_for(std::chrono::milliseconds d) {
  throw InvalidArgument("the fiber backend cannot express a rank that waits " + std::to_string(d.count()) +
                        " ms while the others wait for it (every rank runs in one thread, in turn); run "
                        "this program over the threaded backend");
}

}  // namespace meshsim
