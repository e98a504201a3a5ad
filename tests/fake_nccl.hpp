// fake_nccl.hpp — an NcclApi with no GPU: "device memory" is host memory, each stream is a worker
// thread running its queue in order, and each communicator is a group of the threaded backend
// (so collectives have real semantics, block until every member arrives, and end with an error
// when the communicator is aborted). Splits rendezvous every member of the parent, as
// ncclCommSplit does. Hooks plant the failures the NCCL backend must handle: an async error on
// one member, a member whose collectives never complete.
#pragma once

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "meshsim/error.hpp"
#include "meshsim/nccl_api.hpp"
#include "meshsim/threaded_backend.hpp"

namespace meshsim::testing {

class FakeNccl final : public NcclApi {
 public:
  explicit FakeNccl(int devices) : devices_(devices) {}
  ~FakeNccl() override {
    for (auto& s : streams_) stop(*s);
  }

  // async_error(rank_in_comm, comm_size) -> a message: that member's communicator fails with it
  // (ncclCommGetAsyncError) when it next enqueues a collective, and the collective never runs.
  std::function<std::optional<std::string>(int, int)> async_error;
  // swallow(rank_in_comm, comm_size) -> true: that member's collectives never complete (a hung
  // kernel), until the communicator is aborted.
  std::function<bool(int, int)> swallow;
  // blocking_init: init_rank waits, as ncclCommInitRank does, until every member of the
  // communicator called it, or its timeout passes (DeadlineExceeded).
  bool blocking_init = false;

  int64_t aborts() const { return aborts_.load(); }
  int64_t splits_made() const { return splits_.load(); }
  int64_t inits_made() const { return inits_.load(); }

  std::string name() const override { return "fake NCCL"; }
  int device_count() override { return devices_; }
  void set_device(int device) override {
    if (device < 0 || device >= devices_) throw Unavailable("cudaSetDevice: invalid device " + std::to_string(device));
  }
  NcclId unique_id() override {
    NcclId id;
    const uint64_t n = ++ids_;
    std::memcpy(id.bytes.data(), &n, sizeof n);
    id.bytes[100] = 0xAB;  // not all zeros: the hex round trip is exercised
    return id;
  }
  Comm init_rank(int nranks, const NcclId& id, int rank, std::chrono::milliseconds timeout) override {
    std::shared_ptr<Group> g;
    {
      std::lock_guard lk(mu_);
      auto& slot = groups_[id.to_hex()];
      if (!slot) slot = make_group(nranks);
      g = slot;
      ++inits_;
    }
    if (blocking_init) {
      std::unique_lock lk(g->mu);
      ++g->joined;
      g->cv.notify_all();
      if (!g->cv.wait_for(lk, timeout, [&] { return g->joined == g->n; })) {
        throw DeadlineExceeded("ncclCommInitRankConfig (fake): " + std::to_string(g->n - g->joined) +
                               " ranks did not join");
      }
    }
    std::lock_guard lk(mu_);
    return make_member(g, rank);
  }
  Comm split(Comm parent, int color, int key, std::chrono::milliseconds timeout) override {
    Member& m = *static_cast<Member*>(parent);
    Group& g = *m.g;
    std::unique_lock lk(g.mu);
    const uint64_t round = m.split_round++;
    SplitRound& r = g.rounds[round];
    if (r.color_key.empty()) r.color_key.assign(static_cast<std::size_t>(g.n), {-2, 0});
    r.color_key[static_cast<std::size_t>(m.rank)] = {color, key};
    ++r.arrived;
    g.cv.notify_all();
    if (!g.cv.wait_for(lk, timeout, [&] { return r.arrived == g.n; })) {
      throw DeadlineExceeded("ncclCommSplit (fake): " + std::to_string(g.n - r.arrived) + " ranks did not join");
    }
    if (!r.built) {
      std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, old rank)
      for (int q = 0; q < g.n; ++q) {
        const auto [c, k] = r.color_key[static_cast<std::size_t>(q)];
        if (c >= 0) by_color[c].push_back({k, q});
      }
      for (auto& [c, v] : by_color) {
        std::sort(v.begin(), v.end());
        r.groups[c] = make_group(static_cast<int>(v.size()));
        for (std::size_t i = 0; i < v.size(); ++i) r.new_rank[v[i].second] = static_cast<int>(i);
      }
      r.built = true;
      ++splits_;
    }
    if (color < 0) return nullptr;
    auto group = r.groups.at(color);
    const int new_rank = r.new_rank.at(m.rank);
    lk.unlock();
    std::lock_guard glk(mu_);
    return make_member(group, new_rank);
  }
  void abort(Comm c) override {
    Member& m = *static_cast<Member*>(c);
    ++aborts_;
    m.aborted = true;
    m.g->tb->abort(Diagnosis{DiagnosisKind::kError, {}, "ncclCommAbort", {}, {}});
  }
  void destroy(Comm) override {}
  NcclStatus comm_status(Comm c, std::string* message) override {
    Member& m = *static_cast<Member*>(c);
    std::lock_guard lk(m.mu);
    if (m.error.empty()) return NcclStatus::kDone;
    if (message) *message = m.error;
    return NcclStatus::kError;
  }

  Stream stream_create() override {
    auto s = std::make_shared<StreamImpl>();
    StreamImpl* raw = s.get();
    s->worker = std::thread([raw] { work(*raw); });
    std::lock_guard lk(mu_);
    streams_.push_back(s);
    return raw;
  }
  void stream_destroy(Stream s) override {
    std::lock_guard lk(mu_);
    for (auto& p : streams_) {
      if (p.get() == s) stop(*p);
    }
  }
  NcclStatus stream_status(Stream s) override {
    StreamImpl& st = *static_cast<StreamImpl*>(s);
    std::lock_guard lk(st.mu);
    if (!st.error.empty()) return NcclStatus::kError;
    return st.q.empty() && !st.busy ? NcclStatus::kDone : NcclStatus::kInProgress;
  }
  void* device_alloc(std::size_t bytes) override { return new std::byte[bytes]; }
  void device_free(void* p) override { delete[] static_cast<std::byte*>(p); }
  void copy_to_device(void* dst, const void* src, std::size_t bytes, Stream s) override {
    enqueue(s, [=] { std::memcpy(dst, src, bytes); });
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream s) override {
    enqueue(s, [=] { std::memcpy(dst, src, bytes); });
  }

  void all_reduce(const void* in, void* out, std::size_t count, DType t, ReduceOp op, Comm c, Stream s) override {
    collective(c, s, [=](Communicator& k) {
      if (in != out) std::memcpy(out, in, count * dtype_size(t));
      k.all_reduce(out, static_cast<int64_t>(count), t, op);
    });
  }
  void broadcast(const void* in, void* out, std::size_t count, DType t, int root, Comm c, Stream s) override {
    collective(c, s, [=](Communicator& k) {
      if (k.rank() == root && in != out) std::memcpy(out, in, count * dtype_size(t));
      k.broadcast(out, static_cast<int64_t>(count), t, root);
    });
  }
  void all_gather(const void* in, void* out, std::size_t count, DType t, Comm c, Stream s) override {
    collective(c, s, [=](Communicator& k) { k.all_gather(in, out, static_cast<int64_t>(count), t); });
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DType t, ReduceOp op, Comm c, Stream s) override {
    collective(c, s, [=](Communicator& k) { k.reduce_scatter(in, out, static_cast<int64_t>(count), t, op); });
  }
  void all_to_all(const void* in, void* out, std::size_t count, DType t, Comm c, Stream s) override {
    collective(c, s, [=](Communicator& k) { k.all_to_all(in, out, static_cast<int64_t>(count), t); });
  }
  void send(const void* in, std::size_t count, DType t, int peer, Comm c, Stream s) override {
    collective(c, s, [=](Communicator& k) { k.send(in, static_cast<int64_t>(count), t, peer); });
  }
  void recv(void* out, std::size_t count, DType t, int peer, Comm c, Stream s) override {
    collective(c, s, [=](Communicator& k) { k.recv(out, static_cast<int64_t>(count), t, peer); });
  }

 private:
  struct Group;
  struct SplitRound {
    int arrived = 0;
    bool built = false;
    std::vector<std::pair<int, int>> color_key;
    std::map<int, std::shared_ptr<Group>> groups;
    std::map<int, int> new_rank;
  };
  struct Group {
    int n = 0;
    int joined = 0;  // init_rank calls (blocking_init)
    std::shared_ptr<ThreadedBackend> tb;
    std::mutex mu;
    std::condition_variable cv;
    std::map<uint64_t, SplitRound> rounds;
  };
  struct Member {
    std::shared_ptr<Group> g;
    int rank = 0;
    std::shared_ptr<Communicator> comm;
    std::atomic<bool> aborted{false};
    uint64_t split_round = 0;
    std::mutex mu;
    std::string error;
  };
  struct StreamImpl {
    std::thread worker;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    bool busy = false, stopping = false;
    std::string error;
  };

  static std::shared_ptr<Group> make_group(int n) {
    auto g = std::make_shared<Group>();
    g->n = n;
    g->tb = std::make_shared<ThreadedBackend>(ThreadedBackend::Options{.world_size = n, .timeout = std::chrono::minutes(2)});
    return g;
  }
  Member* make_member(const std::shared_ptr<Group>& g, int rank) {
    auto m = std::make_shared<Member>();
    m->g = g;
    m->rank = rank;
    m->comm = g->tb->world(rank);
    members_.push_back(m);
    return m.get();
  }

  static void work(StreamImpl& s) {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lk(s.mu);
        s.cv.wait(lk, [&] { return s.stopping || !s.q.empty(); });
        if (s.q.empty()) return;
        job = std::move(s.q.front());
        s.q.pop_front();
        s.busy = true;
      }
      try {
        job();
      } catch (const std::exception& e) {
        std::lock_guard lk(s.mu);
        if (s.error.empty()) s.error = e.what();
      }
      std::lock_guard lk(s.mu);
      s.busy = false;
    }
  }
  static void stop(StreamImpl& s) {
    {
      std::lock_guard lk(s.mu);
      if (s.stopping) return;
      s.stopping = true;
      s.q.clear();
    }
    s.cv.notify_all();
    if (s.worker.joinable()) s.worker.join();
  }
  static void enqueue(Stream s, std::function<void()> job) {
    StreamImpl& st = *static_cast<StreamImpl*>(s);
    {
      std::lock_guard lk(st.mu);
      st.q.push_back(std::move(job));
    }
    st.cv.notify_all();
  }
  void collective(Comm c, Stream s, std::function<void(Communicator&)> op) {
    Member* m = static_cast<Member*>(c);
    if (m->aborted) throw Unavailable("fake NCCL: the communicator was aborted");
    if (async_error) {
      if (auto msg = async_error(m->rank, m->g->n)) {
        {
          std::lock_guard lk(m->mu);
          m->error = *msg;
        }
        // As NCCL's: the failed communicator's kernel never completes; its stream runs until the
        // communicator is aborted. (With nothing enqueued the stream read as done at once, and a
        // waiter that polled it first, as a slow, sanitized run does, never saw the error.)
        enqueue(s, [m] {
          while (!m->aborted) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          throw Unavailable("fake NCCL: aborted after an asynchronous error");
        });
        return;
      }
    }
    if (swallow && swallow(m->rank, m->g->n)) {
      enqueue(s, [m] {
        // A hung kernel: nothing happens until the communicator is aborted.
        while (!m->aborted) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        throw Unavailable("fake NCCL: aborted while hung");
      });
      return;
    }
    enqueue(s, [m, op = std::move(op)] {
      try {
        op(*m->comm);
      } catch (const std::exception& e) {
        std::lock_guard lk(m->mu);
        if (m->error.empty()) m->error = std::string("fake NCCL: ") + e.what();
        throw;
      }
    });
  }

  const int devices_;
  std::mutex mu_;
  std::atomic<uint64_t> ids_{0};
  std::atomic<int64_t> aborts_{0}, splits_{0}, inits_{0};
  std::map<std::string, std::shared_ptr<Group>> groups_;
  std::vector<std::shared_ptr<Member>> members_;
  std::vector<std::shared_ptr<StreamImpl>> streams_;
};

}  // namespace meshsim::testing
