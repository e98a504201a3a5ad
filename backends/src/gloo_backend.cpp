#include "meshsim/gloo_backend.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <utility>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <net/if.h>
#include <sys/resource.h>
#include <signal.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "meshsim/error.hpp"
#include "member_communicator.hpp"
#include "rank_registry.hpp"
#include "store_diagnosis.hpp"
#include "reduce.hpp"

namespace meshsim {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using detail::GroupInfo;
using detail::rank_list;


// StoreAdapter is a meshsim Store seen through Gloo's rendezvous interface, under a prefix.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<meshsim::Store> base, std::string prefix, milliseconds timeout)
      : base_(std::move(base)), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    base_->set(k(key), std::string(data.begin(), data.end()));
    if (key == publish_key_ && on_publish_) std::exchange(on_publish_, nullptr)();
  }
  // on_publish runs `f` once, right after Gloo sets `key` (e.g. the rank's pair addresses).
  void on_publish(std::string key, std::function<void()> f) {
    publish_key_ = std::move(key);
    on_publish_ = std::move(f);
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = base_->get(k(key), timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& key : keys) full.push_back(k(key));
    base_->wait(full, timeout);
  }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::shared_ptr<meshsim::Store> base_;
  std::string prefix_;
  milliseconds timeout_;
  std::string publish_key_;
  std::function<void()> on_publish_;
};

// pairwise is Gloo's reduce function: the one host kernel (combine), so sums wrap and ties
// resolve as on every other backend.
template <class T>
gloo::AllreduceOptions::Func pairwise(ReduceOp op) {
  return [op](void* c, const void* a, const void* b, size_t n) {
    auto* x = static_cast<T*>(c);
    const auto* y = static_cast<const T*>(a);
    const auto* z = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) x[i] = combine(y[i], z[i], op);
  };
}

template <class T>
void divide(void* buf, int64_t count, int64_t n) {
  auto* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(n));
}

constexpr uint64_t kP2PSlot = uint64_t{0x6d} << 56;  // meshsim's send/recv slots

}  // namespace

struct detail::GlooState {
  explicit GlooState(const GlooBackend::Options& o) : opt(o), reg(o.world_size, o.placement.first_rank, o.placement.local_ranks) {}
  GlooBackend::Options opt;
  std::shared_ptr<gloo::transport::Device> device;
  detail::RankRegistry reg;

  // Each rank's Gloo contexts, kept until the backend goes (a rank that finished must not close
  // sockets its peers may still read), closed once on failure.
  struct Contexts {
    std::vector<std::shared_ptr<gloo::rendezvous::Context>> list;
    bool closed = false;
    bool close_pending = false;
  };
  mutable std::mutex mu;
  std::vector<Contexts> contexts;  // one per rank of this process
  double connect_seconds = 0;
  int connecting = 0;  // ranks of this process inside connectFullMesh
  // Sockets: every context holds one per peer, and up to two while it connects; the process's
  // descriptor limit bounds how many pairs its rank threads can hold.
  int64_t pair_sides = 0;
  int64_t fd_limit = 0;

  bool all_local() const { return reg.all_local(); }
  std::string key(const std::string& k) const { return opt.placement.prefix + "/" + k; }
  Contexts& of(int64_t rank) { return contexts[static_cast<std::size_t>(rank - opt.placement.first_rank)]; }

  // close_rank closes rank's connections once (its peers' blocked calls then fail). While any
  // rank of this process is connecting a context, closes wait: closing a pair whose peer (on
  // the same device) is still in Gloo's connect handshake leaves that peer waiting in connect
  // forever (measured: ranks stuck > 60 s). The last connect to finish runs the waiting closes.
  void close_rank(int64_t rank) {
    std::vector<std::shared_ptr<gloo::rendezvous::Context>> cs;
    {
      std::lock_guard lk(mu);
      Contexts& c = of(rank);
      if (c.closed) return;
      if (connecting > 0) {
        c.close_pending = true;
        return;
      }
      c.closed = true;
      cs = c.list;
    }
    close_all(cs);
  }
  static void close_all(const std::vector<std::shared_ptr<gloo::rendezvous::Context>>& cs) {
    for (const auto& c : cs) {
      try {
        c->closeConnections();
      } catch (...) {
        // A context that failed to connect has nothing to close.
      }
    }
  }
  void end_connect() {
    std::vector<std::shared_ptr<gloo::rendezvous::Context>> cs;
    {
      std::lock_guard lk(mu);
      if (--connecting > 0) return;
      for (Contexts& c : contexts) {
        if (c.close_pending && !c.closed) {
          c.closed = true;
          cs.insert(cs.end(), c.list.begin(), c.list.end());
        }
        c.close_pending = false;
      }
    }
    close_all(cs);
  }

  std::optional<std::string> lookup(const std::string& k) const { return detail::lookup_key(*opt.placement.store, key(k)); }
};

namespace {

class GlooCommunicator final : public detail::MemberCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<detail::GlooState> s, GlooBackend* owner,
                   std::shared_ptr<gloo::rendezvous::Context> ctx, std::shared_ptr<GroupInfo> info,
                   int rank, std::string prefix, milliseconds timeout)
      : MemberCommunicator(std::shared_ptr<const std::vector<int64_t>>(info, &info->ranks), rank, "gloo"),
        s_(std::move(s)), owner_(owner), ctx_(std::move(ctx)), info_(std::move(info)), rank_(rank),
        prefix_(std::move(prefix)), timeout_(timeout) {}

  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) override {
    check_count(count);
    run({CollectiveOp::kAllReduce, t, count, -1, op}, [&] {
      if (size() == 1 || count == 0) return;
      const int64_t n = size();
      if (t == DType::kBFloat16 || t == DType::kFloat16) {
        // 16-bit floats: gather, then reduce in float32 in group-rank order (threaded semantics).
        const std::size_t bytes = static_cast<std::size_t>(count) * 2;
        std::vector<std::byte> all(bytes * static_cast<std::size_t>(n));
        gather_bytes(buf, all.data(), bytes);
        std::vector<const std::byte*> ins;
        for (int64_t k = 0; k < n; ++k) ins.push_back(all.data() + static_cast<std::size_t>(k) * bytes);
        detail::reduce_into(static_cast<std::byte*>(buf), ins, count, t, op);
        return;
      }
      gloo::AllreduceOptions o(ctx_);
      o.setTimeout(timeout_);
      const auto c = static_cast<size_t>(count);
      switch (t) {
        case DType::kInt32: o.setOutput(static_cast<int32_t*>(buf), c); o.setReduceFunction(pairwise<int32_t>(op)); break;
        case DType::kInt64: o.setOutput(static_cast<int64_t*>(buf), c); o.setReduceFunction(pairwise<int64_t>(op)); break;
        case DType::kFloat32: o.setOutput(static_cast<float*>(buf), c); o.setReduceFunction(pairwise<float>(op)); break;
        default: o.setOutput(static_cast<double*>(buf), c); o.setReduceFunction(pairwise<double>(op)); break;
      }
      gloo::allreduce(o);
      if (op == ReduceOp::kAvg) {
        switch (t) {
          case DType::kInt32: divide<int32_t>(buf, count, n); break;
          case DType::kInt64: divide<int64_t>(buf, count, n); break;
          case DType::kFloat32: divide<float>(buf, count, n); break;
          default: divide<double>(buf, count, n); break;
        }
      }
    });
  }

  void broadcast(void* buf, int64_t count, DType t, int root) override {
    check_count(count);
    check_peer(root, "broadcast root", false);
    run({CollectiveOp::kBroadcast, t, count, root, ReduceOp::kSum}, [&] {
      if (size() == 1 || count == 0) return;
      const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(t);
      gloo::BroadcastOptions o(ctx_);
      o.setTimeout(timeout_);
      o.setRoot(root);
      if (rank_ == root) o.setInput(static_cast<uint8_t*>(buf), bytes);
      o.setOutput(static_cast<uint8_t*>(buf), bytes);
      gloo::broadcast(o);
    });
  }

  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    check_count(count);
    run({CollectiveOp::kAllGather, t, count, -1, ReduceOp::kSum}, [&] {
      const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(t);
      if (count == 0) return;
      if (size() == 1) {
        std::memmove(out, in, bytes);
        return;
      }
      gather_bytes(in, out, bytes);
    });
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t, ReduceOp op) override {
    check_count(count);
    run({CollectiveOp::kReduceScatter, t, count, -1, op}, [&] {
      if (count == 0) return;
      const std::size_t block = static_cast<std::size_t>(count) * dtype_size(t);
      const auto n = static_cast<std::size_t>(size());
      std::vector<std::byte> got(block * n);
      if (n == 1) {
        std::memcpy(got.data(), in, block);
      } else {
        // Block k of every rank goes to rank k; each rank then reduces what it received in
        // group-rank order (Gloo's own reduce-scatter would poison the context).
        gloo::AlltoallOptions o(ctx_);
        o.setTimeout(timeout_);
        o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), block * n);
        o.setOutput(reinterpret_cast<uint8_t*>(got.data()), block * n);
        gloo::alltoall(o);
      }
      std::vector<const std::byte*> ins;
      for (std::size_t k = 0; k < n; ++k) ins.push_back(got.data() + k * block);
      detail::reduce_into(static_cast<std::byte*>(out), ins, count, t, op);
    });
  }

  void all_to_all(const void* in, void* out, int64_t count, DType t) override {
    check_count(count);
    run({CollectiveOp::kAllToAll, t, count, -1, ReduceOp::kSum}, [&] {
      if (count == 0) return;
      const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(t) * static_cast<std::size_t>(size());
      if (size() == 1) {
        std::memmove(out, in, bytes);
        return;
      }
      gloo::AlltoallOptions o(ctx_);
      o.setTimeout(timeout_);
      o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
      o.setOutput(static_cast<uint8_t*>(out), bytes);
      gloo::alltoall(o);
    });
  }

  void barrier() override {
    run({CollectiveOp::kBarrier, DType::kInt64, 0, -1, ReduceOp::kSum}, [&] {
      if (size() == 1) return;
      gloo::BarrierOptions o(ctx_);
      o.setTimeout(timeout_);
      gloo::barrier(o);
    });
  }

  void send(const void* buf, int64_t count, DType t, int peer) override {
    check_message_peer(peer, "send peer");
    check_count(count);
    const CollectiveDesc d{CollectiveOp::kSend, t, count, peer, ReduceOp::kSum};
    run_p2p(d, [&] {
      const uint64_t k = sent_[peer]++;
      int64_t head[3] = {static_cast<int64_t>(t), count, 0};
      auto h = ctx_->createUnboundBuffer(head, sizeof head);
      h->send(peer, kP2PSlot + 2 * k);
      if (count > 0) {
        auto b = ctx_->createUnboundBuffer(const_cast<void*>(buf), static_cast<std::size_t>(count) * dtype_size(t));
        b->send(peer, kP2PSlot + 2 * k + 1);
        h->waitSend(timeout_);
        b->waitSend(timeout_);
      } else {
        h->waitSend(timeout_);
      }
    });
  }

  void recv(void* buf, int64_t count, DType t, int peer) override {
    check_message_peer(peer, "recv peer");
    check_count(count);
    const CollectiveDesc d{CollectiveOp::kRecv, t, count, peer, ReduceOp::kSum};
    run_p2p(d, [&] {
      const uint64_t k = received_[peer]++;
      int64_t head[3] = {0, 0, 0};
      auto h = ctx_->createUnboundBuffer(head, sizeof head);
      h->recv(peer, kP2PSlot + 2 * k);
      h->waitRecv(timeout_);
      if (head[0] != static_cast<int64_t>(t) || head[1] != count) {
        // The sender's call, from its header (a type this build does not know is said so).
        const bool known = head[0] >= 0 && head[0] <= 5;
        const std::string send =
            known ? CollectiveDesc{CollectiveOp::kSend, static_cast<DType>(head[0]), head[1], rank(), ReduceOp::kSum}.to_string()
                  : "send(an unknown type " + std::to_string(head[0]) + ", count=" + std::to_string(head[1]) +
                        ", peer=" + std::to_string(rank()) + ")";
        Diagnosis dg = p2p_mismatch_diagnosis(info_->ranks, info_->ranks[static_cast<std::size_t>(peer)], send, global(),
                                              d.to_string());
        const std::string msg = dg.message;
        owner_->abort(std::move(dg));
        throw MismatchError(msg);
      }
      if (count > 0) {
        auto b = ctx_->createUnboundBuffer(buf, static_cast<std::size_t>(count) * dtype_size(t));
        b->recv(peer, kP2PSlot + 2 * k + 1);
        b->waitRecv(timeout_);
      }
    });
  }

 private:
  int64_t global() const { return info_->ranks[static_cast<std::size_t>(rank_)]; }

  void check_count(int64_t count) const {
    if (count < 0) throw InvalidArgument("gloo collective: count " + std::to_string(count) + " is negative");
    const int64_t limit = (int64_t{1} << 40) / std::max(1, size());
    if (count > limit) {
      throw OutOfRange("gloo collective: count " + std::to_string(count) + " exceeds " +
                       std::to_string(limit) + " elements per rank");
    }
  }
  void check_message_peer(int peer, const char* what) const {
    check_peer(peer, what, true);
    if (!ctx_) throw Internal("send/recv on a group without a context");
  }

  void gather_bytes(const void* in, void* out, std::size_t bytes) {
    gloo::AllgatherOptions o(ctx_);
    o.setTimeout(timeout_);
    o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
    o.setOutput(static_cast<uint8_t*>(out), bytes * static_cast<std::size_t>(size()));
    gloo::allgather(o);
  }

  // verify all-gathers every member's description of this collective and fails on a mismatch
  // naming the ranks that differ from the majority.
  void verify(const CollectiveDesc& d) {
    int64_t mine[detail::kDescWords];
    detail::encode_desc(d, mine);
    const auto n = static_cast<std::size_t>(size());
    std::vector<int64_t> all(detail::kDescWords * n);
    gather_bytes(mine, all.data(), sizeof mine);
    std::vector<CollectiveDesc> descs;
    for (std::size_t r = 0; r < n; ++r) descs.push_back(detail::decode_desc(all.data() + detail::kDescWords * r));
    if (auto dg = detail::mismatch_diagnosis(descs, info_->ranks, seq_)) {
      owner_->abort(*dg);
      throw MismatchError(dg->message);
    }
  }

  void enter(const CollectiveDesc& d) {
    if (auto gone = s_->reg.enter(global(), info_, static_cast<std::size_t>(rank_), seq_, d)) {
      owner_->abort(*gone);
      s_->reg.throw_aborted();
    }
    entered_at_ = s_->reg.entered_at(global());
  }
  void leave() { s_->reg.leave(global()); }

  template <class F>
  void run(const CollectiveDesc& d, F&& body) {
    enter(d);
    guarded(d, [&] {
      if (s_->opt.verify && size() > 1) verify(d);
      body();
    });
  }
  // run_p2p: a message is a wait for one peer, not a collective of the group (not numbered).
  template <class F>
  void run_p2p(const CollectiveDesc& d, F&& body) {
    const int peer = d.root;
    const uint64_t nth = (d.op == CollectiveOp::kSend ? sent_ : received_)[peer];
    if (auto gone = s_->reg.enter_p2p(global(), info_, info_->ranks[static_cast<std::size_t>(peer)], d, nth)) {
      owner_->abort(*gone);
      s_->reg.throw_aborted();
    }
    entered_at_ = s_->reg.entered_at(global());
    guarded(d, body);
  }

  template <class F>
  void guarded(const CollectiveDesc& d, F&& body) {
    try {
      body();
    } catch (const gloo::IoException& e) {
      fail_and_throw(d, e.what());
    } catch (const gloo::EnforceNotMet& e) {
      fail_and_throw(d, e.what());
    } catch (...) {
      leave();
      close_own();
      throw;
    }
    leave();
    if (d.op != CollectiveOp::kSend && d.op != CollectiveOp::kRecv) ++seq_;
    s_->reg.count_collective();
  }

  void close_own() { s_->close_rank(global()); }

  // fail_and_throw: the transport failed under this rank. Close its connections (so its peers
  // fail too), then say why: the run's diagnosis (here or in the store), a member that exited,
  // or for a timeout across processes the members that never arrived; else the raw error.
  [[noreturn]] void fail_and_throw(const CollectiveDesc& d, const std::string& what) {
    leave();
    const bool timed_out = what.find("Timed out") != std::string::npos || what.find("timeout") != std::string::npos;
    const detail::CensusFacts facts{s_->opt.placement.store.get(), s_->opt.placement.prefix, prefix_ + "/" + std::to_string(seq_),
                                    info_->ranks, global(), d, seq_, timeout_, !s_->all_local()};
    std::optional<Diagnosis> dg = detail::census_diagnosis(
        facts, what, timed_out, Clock::now() - entered_at_ >= timeout_, [&] { return s_->reg.diagnosis(); },
        [&] { close_own(); });
    if (dg) owner_->abort(*dg);
    close_own();
    if (dg) throw Aborted(owner_->diagnosis()->message);
    const std::string where = collective_label(d, seq_) + " of group " + rank_list(info_->ranks);
    if (timed_out) {
      throw DeadlineExceeded("rank " + std::to_string(global()) + " waited past " + std::to_string(timeout_.count()) +
                             " ms in " + where + ": " + what);
    }
    throw Unavailable("rank " + std::to_string(global()) + " lost a connection in " + where + ": " + what);
  }

  std::shared_ptr<detail::GlooState> s_;
  GlooBackend* owner_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::shared_ptr<GroupInfo> info_;
  int rank_;
  std::string prefix_;
  milliseconds timeout_;
  uint64_t seq_ = 0;
  Clock::time_point entered_at_;
  // Messages sent to / received from each peer so far (only the peers used: a group of 16,384
  // ranks is not 2 x 16,384 counters per rank).
  std::map<int, uint64_t> sent_, received_;
};

}  // namespace

GlooBackend::GlooBackend(Options options) {
  detail::check_placement("gloo", options.world_size, &options.placement, options.timeout);
  if (options.placement.local_ranks > kMaxThreadRanks) {
    throw InvalidArgument("gloo backend: " + std::to_string(options.placement.local_ranks) +
                          " rank threads in one process is over the " + std::to_string(kMaxThreadRanks) +
                          " supported (each pair of ranks holds two sockets, and connecting grows as n^2 "
                          "binds); run several processes with `meshsim launch`");
  }
  // A peer that closed its end makes Gloo's writes raise SIGPIPE, whose default action kills
  // the process: ignore it (the write then fails with EPIPE, which Gloo reports as an error),
  // unless the program installed a handler of its own.
  {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  }
  gloo::transport::tcp::attr a;
  if (!options.hostname.empty()) {
    a.hostname = options.hostname;
  } else {
    // Checked here: Gloo's own lookup of a missing interface throws and leaks its list.
    if (options.iface.empty() || ::if_nametoindex(options.iface.c_str()) == 0) {
      throw InvalidArgument("gloo backend: no network interface named '" + options.iface +
                            "' (give Options::hostname or an existing interface)");
    }
    a.iface = options.iface;
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(a);
  } catch (const std::exception& e) {
    throw InvalidArgument("gloo backend: cannot open a TCP device on " +
                          (options.hostname.empty() ? "interface '" + options.iface + "'" : "'" + options.hostname + "'") +
                          ": " + e.what());
  }
  s_ = std::make_shared<detail::GlooState>(options);
  attach(std::shared_ptr<detail::RankRegistry>(s_, &s_->reg));
  attach_store(s_->opt.placement.store, s_->opt.placement.prefix);
  s_->device = std::move(device);
  {
    // Raise the soft descriptor limit to the hard one: rank threads hold a socket per pair.
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
      if (lim.rlim_cur < lim.rlim_max) {
        rlimit up = lim;
        up.rlim_cur = lim.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &up) == 0) lim = up;
      }
      if (lim.rlim_cur != RLIM_INFINITY) s_->fd_limit = static_cast<int64_t>(lim.rlim_cur);
    }
  }
  s_->contexts.resize(static_cast<std::size_t>(options.placement.local_ranks));
}

GlooBackend::~GlooBackend() {
  // Each rank's contexts are destroyed on a thread of their own: destroying them one after
  // another waits a loop tick per pair (seconds at 64 ranks).
  std::vector<std::vector<std::shared_ptr<gloo::rendezvous::Context>>> per_rank;
  {
    std::lock_guard lk(s_->mu);
    for (auto& c : s_->contexts) per_rank.push_back(std::move(c.list));
  }
  const std::size_t workers = std::min<std::size_t>(per_rank.size(), 16);
  if (workers <= 1) return;
  std::vector<std::thread> pool;
  for (std::size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&per_rank, w, workers] {
      for (std::size_t r = w; r < per_rank.size(); r += workers) per_rank[r].clear();
    });
  }
  for (auto& t : pool) t.join();
}

std::shared_ptr<Communicator> GlooBackend::new_group(int64_t rank, std::span<const int64_t> ranks,
                                                     const BackendConfig& config) {
  const Options& o = s_->opt;
  const detail::RankRegistry::GroupKey key = s_->reg.key(rank, ranks, config, "gloo");
  if (const auto* g = std::get_if<GlooOptions>(&config.options); g && !g->devices.empty()) {
    throw InvalidArgument("gloo backend: per-group devices are not supported; every group uses the "
                          "backend's device (Options::hostname / iface)");
  }
  const uint64_t digest = key.digest;
  const milliseconds timeout = config.timeout.count() > 0 ? config.timeout : o.timeout;
  const int sub = static_cast<int>(key.member);
  const int n = static_cast<int>(ranks.size());
  int64_t instance = 0;
  std::shared_ptr<GroupInfo> info = s_->reg.group(rank, key, ranks, &instance);
  const std::string prefix = "g" + detail::hex64(digest) + "." + std::to_string(instance);
  if (n == 1) {
    auto comm = std::make_shared<GlooCommunicator>(s_, this, nullptr, info, 0, prefix, timeout);
    comm->set_config(config);
    return comm;
  }

  auto ctx = std::make_shared<gloo::rendezvous::Context>(sub, n);
  ctx->setTimeout(timeout);
  {
    std::lock_guard lk(s_->mu);
    const int64_t need = 2 * static_cast<int64_t>(n - 1);
    if (s_->fd_limit > 0 && s_->pair_sides + need > s_->fd_limit - 256) {
      throw ResourceExhausted("gloo backend: rank " + std::to_string(rank) + " cannot connect a group of " +
                              std::to_string(n) + " ranks: its " + std::to_string(n - 1) +
                              " sockets would take this process past its limit of " + std::to_string(s_->fd_limit) +
                              " file descriptors (" + std::to_string(s_->pair_sides) +
                              " pair sockets are open); run fewer rank threads per process (meshsim launch)");
    }
    s_->pair_sides += n - 1;
    s_->of(rank).list.push_back(ctx);
    ++s_->connecting;  // with the push: no close may slip in between (see close_rank)
  }
  s_->reg.enter_connect(rank, info);
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const std::string where = "connecting group " + rank_list(info->ranks);
  std::string failure;
  try {
    // Gloo waits for each pair's peer five times the pair's timeout, one pair after another, so
    // a member that died (or gave up) after publishing its address held each survivor 5x the
    // run's timeout. So the pairs get a fifth of the timeout, and the members meet first: when
    // this rank publishes its address (its listening sockets exist), it waits, up to the
    // group's deadline, for every member's address, reading the store every 500 ms for a member
    // that died. Past that barrier the handshakes take milliseconds, and a pair that never
    // completes ends within the timeout: the whole connect within about twice the timeout at
    // worst, within one when a member dies after the barrier.
    const std::string base = o.placement.prefix + "/" + prefix;
    StoreAdapter store(o.placement.store, base, timeout);
    store.on_publish(std::to_string(sub), [&] {
      std::vector<std::string> others;
      others.reserve(static_cast<std::size_t>(n - 1));
      for (int j = 0; j < n; ++j) {
        if (j != sub) others.push_back(base + "/" + std::to_string(j));
      }
      for (;;) {
        const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        try {
          o.placement.store->wait(others, std::clamp(left, milliseconds(1), milliseconds(500)));
          return;
        } catch (const DeadlineExceeded& e) {
          if (s_->reg.aborted()) throw;
          if (auto dg = detail::store_diagnosis(*o.placement.store, o.placement.prefix, info->ranks, rank, where)) {
            abort(*dg);
            throw;
          }
          if (Clock::now() >= deadline) {
            throw DeadlineExceeded("members of the group never published their addresses: " + std::string(e.what()));
          }
        }
      }
    });
    ctx->setTimeout(std::max(milliseconds(1), timeout / 5));
    ctx->connectFullMesh(store, s_->device);
    ctx->setTimeout(timeout);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  s_->end_connect();
  s_->reg.leave(rank);
  {
    std::lock_guard lk(s_->mu);
    s_->connect_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  if (s_->reg.aborted()) {
    s_->close_rank(rank);
    s_->reg.throw_aborted();
  }
  if (!failure.empty()) {
    const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    // A member that died makes the others' connects fail at once (a refused or reset connection):
    // its will or its claim in the store names it, given a moment to arrive.
    const auto settle = Clock::now() + std::min<milliseconds>(milliseconds(1000), timeout);
    for (;;) {
      if (auto dg = detail::store_diagnosis(*o.placement.store, o.placement.prefix, info->ranks, rank, where)) {
        abort(*dg);
        s_->close_rank(rank);
        s_->reg.throw_aborted();
      }
      if (Clock::now() >= settle) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    // The store died under the connect: the pairs' failure is its consequence, not a stall.
    if (auto dg = detail::lost_store_diagnosis(*o.placement.store, o.placement.prefix, rank, "connecting group " + rank_list(info->ranks),
                                               failure)) {
      abort(*dg);
      s_->close_rank(rank);
      s_->reg.throw_aborted();
    }
    if (failure.find("Timed out") != std::string::npos || failure.find("timeout") != std::string::npos ||
        waited >= timeout) {
      // A member whose process never reached the store is why: name it.
      if (auto dg = detail::unstarted_diagnosis(*o.placement.store, o.placement.prefix, info->ranks, rank,
                                                "the connect of group " + rank_list(info->ranks), waited)) {
        abort(*dg);
        s_->close_rank(rank);
        s_->reg.throw_aborted();
      }
      throw DeadlineExceeded("gloo backend: rank " + std::to_string(rank) + " could not connect group " +
                             rank_list(info->ranks) + " within " + std::to_string(timeout.count()) + " ms: " + failure);
    }
    // Not a timeout: its own kind, with how long it took, not a stall.
    abort(Diagnosis{DiagnosisKind::kConnect, {rank},
                    "rank " + std::to_string(rank) + " could not connect group " + rank_list(info->ranks) + " (failed after " +
                        std::to_string(waited.count()) + " ms): " + failure,
                    {}, {}});
    s_->close_rank(rank);
    s_->reg.throw_aborted();
  }
  auto comm = std::make_shared<GlooCommunicator>(s_, this, ctx, info, sub, prefix, timeout);
  comm->set_config(config);  // the group hands its config back
  return comm;
}

void GlooBackend::on_abort() {
  // Ranks outside any collective will not call again (entering one now throws Aborted): close
  // theirs, so their peers fail fast. Ranks inside one close their own as they unwind.
  for (int64_t r = s_->opt.placement.first_rank; r < s_->opt.placement.first_rank + s_->opt.placement.local_ranks; ++r) {
    if (!s_->reg.in_op(r)) s_->close_rank(r);
  }
}

void GlooBackend::on_departed(int64_t rank) {
  if (s_->reg.aborted()) s_->close_rank(rank);
}

void GlooBackend::on_exit(int64_t rank) { s_->close_rank(rank); }

double GlooBackend::connect_seconds() const {
  std::lock_guard lk(s_->mu);
  return s_->connect_seconds;
}

}  // namespace meshsim
