#include "meshsim/nccl_backend.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "meshsim/error.hpp"
#include "member_communicator.hpp"
#include "rank_registry.hpp"
#include "store_diagnosis.hpp"

namespace meshsim {

std::string NcclId::to_hex() const {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(256);
  for (uint8_t b : bytes) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

NcclId NcclId::from_hex(const std::string& hex) {
  if (hex.size() != 256) {
    throw InvalidArgument("nccl unique id: " + std::to_string(hex.size()) + " characters, not 256 hex digits");
  }
  auto digit = [&](char c) -> uint8_t {
    if (c >= '0' && c <= '9') return static_cast<uint8_t>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<uint8_t>(c - 'a' + 10);
    throw InvalidArgument("nccl unique id: '" + std::string(1, c) + "' is not a lowercase hex digit");
  };
  NcclId id;
  for (std::size_t i = 0; i < 128; ++i) {
    id.bytes[i] = static_cast<uint8_t>(digit(hex[2 * i]) << 4 | digit(hex[2 * i + 1]));
  }
  return id;
}

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using detail::GroupInfo;
using detail::rank_list;

// gpus_needed says which GPUs `ranks` ranks starting at `first` use, one each: "2 ranks need
// GPUs 0..1, one each", "1 rank needs GPU 1".
std::string gpus_needed(int64_t ranks, int64_t first) {
  if (ranks == 1) return "1 rank needs GPU " + std::to_string(first);
  return std::to_string(ranks) + " ranks need GPUs " + std::to_string(first) + ".." + std::to_string(first + ranks - 1) +
         ", one each";
}

// DeviceBuffer is scratch device memory that grows as needed.
struct DeviceBuffer {
  std::shared_ptr<NcclApi> api;
  void* p = nullptr;
  std::size_t cap = 0;
  void* get(std::size_t bytes) {
    if (bytes > cap) {
      if (p) api->device_free(p);
      p = nullptr;
      cap = 0;
      p = api->device_alloc(std::max<std::size_t>(bytes, 256));
      cap = std::max<std::size_t>(bytes, 256);
    }
    return p;
  }
  ~DeviceBuffer() {
    if (p) {
      try {
        api->device_free(p);
      } catch (...) {
      }
    }
  }
};

// Handle owns one NCCL communicator, the stream its rank drives it on, and every buffer work on
// that stream touches: device scratch and host staging. A collective that failed may still have
// copies queued on the stream; they land in these buffers, never in the caller's, and the
// buffers go only after the stream does.
struct Handle {
  std::shared_ptr<NcclApi> api;
  NcclApi::Comm comm = nullptr;
  NcclApi::Stream stream = nullptr;
  int device = 0;
  bool aborted = false;
  DeviceBuffer dev_in{api}, dev_out{api};
  std::vector<std::byte> host_in, host_out;
  Handle(std::shared_ptr<NcclApi> a, NcclApi::Comm c, int dev) : api(std::move(a)), comm(c), device(dev) {
    dev_in.api = api;
    dev_out.api = api;
    api->set_device(device);
    stream = api->stream_create();
  }
  // stage_in copies the caller's bytes into host staging (the stream reads them later).
  const void* stage_in(const void* p, std::size_t bytes) {
    if (host_in.size() < bytes) host_in.resize(bytes);
    if (bytes) std::memcpy(host_in.data(), p, bytes);
    return host_in.data();
  }
  void* stage_out(std::size_t bytes) {
    if (host_out.size() < bytes) host_out.resize(bytes);
    return host_out.data();
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    try {
      api->set_device(device);
      if (comm && !aborted) {
        if (api->stream_status(stream) == NcclStatus::kInProgress) api->abort(comm);  // never block here
        else api->destroy(comm);
      }
      api->stream_destroy(stream);
    } catch (...) {
      // Teardown of a failed device: nothing left to release.
    }
  }
  void abort() {
    if (comm && !aborted) {
      aborted = true;
      try {
        api->abort(comm);
      } catch (...) {
      }
    }
  }
};


}  // namespace

struct detail::NcclState {
  explicit NcclState(const NcclBackend::Options& o) : opt(o), reg(o.world_size, o.placement.first_rank, o.placement.local_ranks) {}
  NcclBackend::Options opt;
  detail::RankRegistry reg;
  std::atomic<int64_t> splits{0}, inits{0};
  std::mutex mu;
  std::vector<std::shared_ptr<Handle>> world;  // each rank's first world communicator (split parent)
  std::vector<int64_t> split_rounds;            // each local rank's splits so far

  std::string key(const std::string& k) const { return opt.placement.prefix + "/" + k; }
  int device_of(int64_t rank) const { return static_cast<int>(opt.placement.local_rank + (rank - opt.placement.first_rank)); }
};

namespace {

// join_diagnosis: rank `me` failed (`what`, after `waited`) `where` (creating a communicator or
// splitting the world's, whose members count in by rank: the world's index is the rank); the
// join census (diagnosis.cpp) says who never joined.
std::optional<Diagnosis> join_diagnosis(detail::NcclState& st, const std::string& key, std::span<const int64_t> ranks, int64_t me,
                                        const std::string& what, milliseconds waited, const std::string& where) {
  const detail::JoinFacts f{st.opt.placement.store.get(), st.opt.placement.prefix, key, std::vector<int64_t>(ranks.begin(), ranks.end()),
                            me, std::min<milliseconds>(milliseconds(1000), st.opt.timeout)};
  return detail::join_census_diagnosis(f, what, waited, where);
}

class NcclCommunicator final : public detail::MemberCommunicator {
 public:
  // census_key names this group instance in the run's store (the same on every member): a
  // collective's census keys are "<census_key>/<seq>".
  NcclCommunicator(std::shared_ptr<detail::NcclState> s, NcclBackend* owner, std::shared_ptr<Handle> h,
                   std::shared_ptr<GroupInfo> info, int rank, milliseconds timeout, std::string census_key)
      : MemberCommunicator(std::shared_ptr<const std::vector<int64_t>>(info, &info->ranks), rank, "nccl"),
        s_(std::move(s)), owner_(owner), h_(std::move(h)), info_(std::move(info)), rank_(rank), timeout_(timeout),
        census_key_(std::move(census_key)) {}

  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) override {
    check_count(count);
    const std::size_t bytes = nbytes(count, t);
    run({CollectiveOp::kAllReduce, t, count, -1, op}, [&](NcclApi& api) {
      void* d = h_->dev_in.get(bytes);
      api.copy_to_device(d, h_->stage_in(buf, bytes), bytes, h_->stream);
      api.all_reduce(d, d, static_cast<std::size_t>(count), t, op, h_->comm, h_->stream);
      api.copy_to_host(h_->stage_out(bytes), d, bytes, h_->stream);
    }, count == 0);
    if (bytes) std::memcpy(buf, h_->host_out.data(), bytes);
  }

  void broadcast(void* buf, int64_t count, DType t, int root) override {
    check_count(count);
    check_peer(root, "broadcast root", false);
    const std::size_t bytes = nbytes(count, t);
    run({CollectiveOp::kBroadcast, t, count, root, ReduceOp::kSum}, [&](NcclApi& api) {
      void* d = h_->dev_in.get(bytes);
      if (rank_ == root) api.copy_to_device(d, h_->stage_in(buf, bytes), bytes, h_->stream);
      api.broadcast(d, d, static_cast<std::size_t>(count), t, root, h_->comm, h_->stream);
      api.copy_to_host(h_->stage_out(bytes), d, bytes, h_->stream);
    }, count == 0);
    if (bytes) std::memcpy(buf, h_->host_out.data(), bytes);
  }

  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    check_count(count);
    const std::size_t bytes = nbytes(count, t), all = bytes * static_cast<std::size_t>(size());
    run({CollectiveOp::kAllGather, t, count, -1, ReduceOp::kSum}, [&](NcclApi& api) {
      void* di = h_->dev_in.get(bytes);
      void* dout = h_->dev_out.get(all);
      api.copy_to_device(di, h_->stage_in(in, bytes), bytes, h_->stream);
      api.all_gather(di, dout, static_cast<std::size_t>(count), t, h_->comm, h_->stream);
      api.copy_to_host(h_->stage_out(all), dout, all, h_->stream);
    }, count == 0);
    if (all) std::memcpy(out, h_->host_out.data(), all);
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t, ReduceOp op) override {
    check_count(count);
    const std::size_t bytes = nbytes(count, t), all = bytes * static_cast<std::size_t>(size());
    run({CollectiveOp::kReduceScatter, t, count, -1, op}, [&](NcclApi& api) {
      void* di = h_->dev_in.get(all);
      void* dout = h_->dev_out.get(bytes);
      api.copy_to_device(di, h_->stage_in(in, all), all, h_->stream);
      api.reduce_scatter(di, dout, static_cast<std::size_t>(count), t, op, h_->comm, h_->stream);
      api.copy_to_host(h_->stage_out(bytes), dout, bytes, h_->stream);
    }, count == 0);
    if (bytes) std::memcpy(out, h_->host_out.data(), bytes);
  }

  void all_to_all(const void* in, void* out, int64_t count, DType t) override {
    check_count(count);
    const std::size_t all = nbytes(count, t) * static_cast<std::size_t>(size());
    run({CollectiveOp::kAllToAll, t, count, -1, ReduceOp::kSum}, [&](NcclApi& api) {
      void* di = h_->dev_in.get(all);
      void* dout = h_->dev_out.get(all);
      api.copy_to_device(di, h_->stage_in(in, all), all, h_->stream);
      api.all_to_all(di, dout, static_cast<std::size_t>(count), t, h_->comm, h_->stream);
      api.copy_to_host(h_->stage_out(all), dout, all, h_->stream);
    }, count == 0);
    if (all) std::memcpy(out, h_->host_out.data(), all);
  }

  void barrier() override {
    run({CollectiveOp::kBarrier, DType::kInt64, 0, -1, ReduceOp::kSum}, [&](NcclApi& api) {
      void* d = h_->dev_in.get(sizeof(int32_t));
      const int32_t one = 1;
      api.copy_to_device(d, h_->stage_in(&one, sizeof one), sizeof one, h_->stream);
      api.all_reduce(d, d, 1, DType::kInt32, ReduceOp::kSum, h_->comm, h_->stream);
    }, false);
  }

  void send(const void* buf, int64_t count, DType t, int peer) override {
    check_message_peer(peer, "send peer");
    check_count(count);
    const std::size_t bytes = nbytes(count, t);
    run({CollectiveOp::kSend, t, count, peer, ReduceOp::kSum}, [&](NcclApi& api) {
      void* d = h_->dev_in.get(bytes);
      api.copy_to_device(d, h_->stage_in(buf, bytes), bytes, h_->stream);
      api.send(d, static_cast<std::size_t>(count), t, peer, h_->comm, h_->stream);
    }, count == 0, /*verify_first=*/false);
  }

  void recv(void* buf, int64_t count, DType t, int peer) override {
    check_message_peer(peer, "recv peer");
    check_count(count);
    const std::size_t bytes = nbytes(count, t);
    run({CollectiveOp::kRecv, t, count, peer, ReduceOp::kSum}, [&](NcclApi& api) {
      void* d = h_->dev_in.get(bytes);
      api.recv(d, static_cast<std::size_t>(count), t, peer, h_->comm, h_->stream);
      api.copy_to_host(h_->stage_out(bytes), d, bytes, h_->stream);
    }, count == 0, /*verify_first=*/false);
    if (bytes) std::memcpy(buf, h_->host_out.data(), bytes);
  }

 private:
  int64_t global() const { return info_->ranks[static_cast<std::size_t>(rank_)]; }

  static std::size_t nbytes(int64_t count, DType t) { return static_cast<std::size_t>(count) * dtype_size(t); }

  void check_count(int64_t count) const {
    if (count < 0) throw InvalidArgument("nccl collective: count " + std::to_string(count) + " is negative");
    const int64_t limit = (int64_t{1} << 40) / std::max(1, size());
    if (count > limit) {
      throw OutOfRange("nccl collective: count " + std::to_string(count) + " exceeds " + std::to_string(limit) +
                       " elements per rank");
    }
  }
  void check_message_peer(int peer, const char* what) const { check_peer(peer, what, true); }

  std::string where(const CollectiveDesc& d) const {
    return d.to_string() + " #" + std::to_string(seq_) + " of group " + rank_list(info_->ranks);
  }

  // run: bookkeeping, the agreement check, the enqueued work, then a wait with a deadline.
  template <class F>
  void run(const CollectiveDesc& d, F&& body, bool empty, bool verify_first = true) {
    if (h_->aborted) {
      throw Unavailable("rank " + std::to_string(global()) + ": the communicator of group " + rank_list(info_->ranks) +
                        " was aborted by an earlier failure");
    }
    // A message is a wait for one peer, not a collective of the group (not numbered).
    const bool message = d.op == CollectiveOp::kSend || d.op == CollectiveOp::kRecv;
    std::optional<Diagnosis> gone =
        message ? s_->reg.enter_p2p(global(), info_, info_->ranks[static_cast<std::size_t>(d.root)], d,
                                    messages_[{static_cast<int>(d.op), d.root}]++)
                : s_->reg.enter(global(), info_, static_cast<std::size_t>(rank_), seq_, d);
    if (gone) {
      owner_->abort(*gone);
      s_->reg.throw_aborted();
    }
    const auto deadline = Clock::now() + timeout_;
    try {
      NcclApi& api = *h_->api;
      api.set_device(h_->device);
      if (verify_first && s_->opt.verify && size() > 1) verify(d, deadline);
      if (message && s_->opt.verify) verify_message(d, deadline);
      if (!empty) {
        body(api);
        wait(d, deadline);
      }
    } catch (...) {
      s_->reg.leave(global());
      throw;
    }
    s_->reg.leave(global());
    if (!message) ++seq_;
    s_->reg.count_collective();
  }

  // wait polls the stream until the enqueued work is done, failing on an async error, on the
  // run's diagnosis or at the deadline (each aborts the communicator).
  void wait(const CollectiveDesc& d, Clock::time_point deadline) {
    NcclApi& api = *h_->api;
    for (int spin = 0;; ++spin) {
      const NcclStatus st = api.stream_status(h_->stream);
      if (st == NcclStatus::kDone) return;
      std::string message;
      if (st == NcclStatus::kError || api.comm_status(h_->comm, &message) == NcclStatus::kError) {
        fail(d, message.empty() ? "the stream failed" : message);
      }
      if (s_->reg.aborted()) {
        h_->abort();
        s_->reg.throw_aborted();
      }
      if (Clock::now() >= deadline) {
        // Where every rank runs here the watchdog diagnoses first; across processes the census
        // (as Gloo's) names the members that never arrived, or departed.
        h_->abort();
        const bool message = d.op == CollectiveOp::kSend || d.op == CollectiveOp::kRecv;
        if (!s_->reg.all_local() && !message) {
          const detail::CensusFacts facts{s_->opt.placement.store.get(), s_->opt.placement.prefix, census_key_ + "/" + std::to_string(seq_),
                                          info_->ranks, global(), d, seq_, timeout_, true};
          if (auto dg = detail::census_diagnosis(facts, "the deadline passed", true, true,
                                                 [&] { return s_->reg.diagnosis(); }, [] {})) {
            owner_->abort(*dg);
            s_->reg.throw_aborted();
          }
        }
        throw DeadlineExceeded("rank " + std::to_string(global()) + " waited past " + std::to_string(timeout_.count()) +
                               " ms in " + where(d) + " (the communicator was aborted)");
      }
      if (spin < 64) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // fail: NCCL reported an error under this rank. The run's diagnosis (here or in the store)
  // explains it when there is one; else this rank is the first to see the failure and records
  // it, naming itself, before it aborts the communicator (which fails its peers, who then find
  // the diagnosis instead of blaming each other).
  [[noreturn]] void fail(const CollectiveDesc& d, const std::string& what) {
    // Across processes a peer's diagnosis (or a dead process's will) may reach the store a moment
    // after its failure reached this rank: give it that moment.
    const auto settle = Clock::now() + (s_->reg.all_local() ? milliseconds(0) : std::min<milliseconds>(milliseconds(2000), timeout_));
    std::optional<Diagnosis> found;
    while (!s_->reg.aborted()) {
      found = detail::store_diagnosis(*s_->opt.placement.store, s_->opt.placement.prefix, info_->ranks, global(), where(d));
      if (found || Clock::now() >= settle) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    if (!s_->reg.aborted()) {
      if (found) {
        owner_->abort(*found);
      } else {
        owner_->abort(Diagnosis{DiagnosisKind::kError, {global()}, "rank " + std::to_string(global()) + ": NCCL failed in " +
                                where(d) + ": " + what, {}, {}});
      }
    }
    h_->abort();
    s_->reg.throw_aborted();
  }

  // verify all-gathers every member's description of this collective; a mismatch names the
  // ranks that differ from the majority.
  void verify(const CollectiveDesc& d, Clock::time_point deadline) {
    NcclApi& api = *h_->api;
    int64_t mine[detail::kDescWords];
    detail::encode_desc(d, mine);
    const auto n = static_cast<std::size_t>(size());
    void* di = h_->dev_in.get(sizeof mine);
    void* dout = h_->dev_out.get(sizeof mine * n);
    api.copy_to_device(di, h_->stage_in(mine, sizeof mine), sizeof mine, h_->stream);
    api.all_gather(di, dout, detail::kDescWords, DType::kInt64, h_->comm, h_->stream);
    api.copy_to_host(h_->stage_out(sizeof mine * n), dout, sizeof mine * n, h_->stream);
    wait(d, deadline);
    std::vector<CollectiveDesc> descs;
    for (std::size_t r = 0; r < n; ++r) {
      int64_t words[detail::kDescWords];
      std::memcpy(words, h_->host_out.data() + sizeof mine * r, sizeof mine);
      descs.push_back(detail::decode_desc(words));
    }
    if (auto dg = detail::mismatch_diagnosis(descs, info_->ranks, seq_)) {
      owner_->abort(*dg);
      throw MismatchError(dg->message);
    }
  }

  // verify_message: the sender sends its message's type and count first; the receiver compares
  // them with its own call, so a send and a recv that disagree are a "mismatch" diagnosis (NCCL
  // itself would hang or read past the message).
  void verify_message(const CollectiveDesc& d, Clock::time_point deadline) {
    NcclApi& api = *h_->api;
    int64_t head[2] = {static_cast<int64_t>(d.dtype), d.count};
    void* dh = h_->dev_in.get(sizeof head);
    if (d.op == CollectiveOp::kSend) {
      api.copy_to_device(dh, h_->stage_in(head, sizeof head), sizeof head, h_->stream);
      api.send(dh, 2, DType::kInt64, d.root, h_->comm, h_->stream);
      wait(d, deadline);
      return;
    }
    api.recv(dh, 2, DType::kInt64, d.root, h_->comm, h_->stream);
    api.copy_to_host(h_->stage_out(sizeof head), dh, sizeof head, h_->stream);
    wait(d, deadline);
    int64_t got[2];
    std::memcpy(got, h_->host_out.data(), sizeof got);
    if (got[0] == head[0] && got[1] == head[1]) return;
    const bool known = got[0] >= 0 && got[0] <= 5;
    const std::string send =
        known ? CollectiveDesc{CollectiveOp::kSend, static_cast<DType>(got[0]), got[1], rank_, ReduceOp::kSum}.to_string()
              : "send(an unknown type " + std::to_string(got[0]) + ", count=" + std::to_string(got[1]) +
                    ", peer=" + std::to_string(rank_) + ")";
    Diagnosis dg = p2p_mismatch_diagnosis(info_->ranks, info_->ranks[static_cast<std::size_t>(d.root)], send, global(),
                                          d.to_string());
    const std::string msg = dg.message;
    owner_->abort(std::move(dg));
    throw MismatchError(msg);
  }

  std::shared_ptr<detail::NcclState> s_;
  NcclBackend* owner_;
  std::shared_ptr<Handle> h_;
  std::shared_ptr<GroupInfo> info_;
  int rank_;
  milliseconds timeout_;
  std::string census_key_;
  uint64_t seq_ = 0;
  std::map<std::pair<int, int>, uint64_t> messages_;  // (send or recv, peer) -> messages so far
};

}  // namespace

NcclBackend::NcclBackend(Options options) {
  if (!options.api) {
    throw FailedPrecondition("nccl backend: no NCCL in this build (configure with -DMESHSIM_WITH_NCCL=ON), "
                             "and no NcclApi was given");
  }
  detail::check_placement("nccl", options.world_size, &options.placement, options.timeout);
  const int devices = options.api->device_count();
  if (options.placement.local_rank < 0 || options.placement.local_ranks > devices - options.placement.local_rank) {
    throw FailedPrecondition("nccl backend: " + gpus_needed(options.placement.local_ranks, options.placement.local_rank) + "; " +
                             options.api->name() + " sees " + std::to_string(devices));
  }
  s_ = std::make_shared<detail::NcclState>(options);
  attach(std::shared_ptr<detail::RankRegistry>(s_, &s_->reg));
  attach_store(s_->opt.placement.store, s_->opt.placement.prefix);
  s_->world.resize(static_cast<std::size_t>(options.placement.local_ranks));
  s_->split_rounds.resize(static_cast<std::size_t>(options.placement.local_ranks));
}

NcclBackend::~NcclBackend() = default;

std::shared_ptr<Communicator> NcclBackend::new_group(int64_t rank, std::span<const int64_t> ranks,
                                                     const BackendConfig& config) {
  const Options& o = s_->opt;
  const detail::RankRegistry::GroupKey gk = s_->reg.key(rank, ranks, config, "nccl");
  const uint64_t digest = gk.digest;
  const milliseconds timeout = config.timeout.count() > 0 ? config.timeout : o.timeout;
  const int sub = static_cast<int>(gk.member);
  int64_t instance = 0;
  std::shared_ptr<GroupInfo> info = s_->reg.group(rank, gk, ranks, &instance);
  // The group's first member makes the unique id; the others read it from the store.
  const std::string key = s_->key("nccl/" + detail::hex64(digest) + "." + std::to_string(instance));
  const int device = s_->device_of(rank);
  std::shared_ptr<NcclApi> api = o.api;
  s_->reg.enter_connect(rank, info);
  std::shared_ptr<Handle> h;
  const auto start = Clock::now();
  try {
    api->set_device(device);
    // The join census: each member counts itself in before it waits for the others, so a
    // member that times out can name those that never came (across processes its registry
    // sees only its own ranks).
    o.placement.store->add(key + ".joined/" + std::to_string(sub), 1);
    NcclId id;
    if (sub == 0) {
      id = api->unique_id();
      o.placement.store->set(key, id.to_hex());
    } else {
      id = NcclId::from_hex(o.placement.store->get(key, timeout));
    }
    h = std::make_shared<Handle>(api, api->init_rank(static_cast<int>(ranks.size()), id, sub, timeout), device);
  } catch (const std::exception& e) {
    s_->reg.leave(rank);
    if (s_->reg.aborted()) s_->reg.throw_aborted();
    if (!s_->reg.all_local()) {
      if (auto dg = join_diagnosis(*s_, key, ranks, rank, e.what(), std::chrono::duration_cast<milliseconds>(Clock::now() - start),
                                   "creating the NCCL communicator of group " + rank_list(std::vector<int64_t>(ranks.begin(), ranks.end())))) {
        abort(*dg);
        s_->reg.throw_aborted();
      }
    }
    throw;
  }
  s_->reg.leave(rank);
  s_->inits.fetch_add(1);
  if (ranks.size() == static_cast<std::size_t>(o.world_size)) {
    std::lock_guard lk(s_->mu);
    auto& w = s_->world[static_cast<std::size_t>(rank - o.placement.first_rank)];
    if (!w) w = h;
  }
  auto comm = std::make_shared<NcclCommunicator>(s_, this, h, info, sub, timeout,
                                                 "nccl-census/" + detail::hex64(digest) + "." + std::to_string(instance));
  comm->set_config(config);  // the group hands its config back
  return comm;
}

std::shared_ptr<Communicator> NcclBackend::split_group(int64_t rank, std::span<const int64_t> ranks,
                                                       const BackendConfig& config) {
  const Options& o = s_->opt;
  const detail::RankRegistry::GroupKey gk = s_->reg.key(rank, ranks, config, "nccl");
  std::shared_ptr<Handle> parent;
  {
    std::lock_guard lk(s_->mu);
    parent = s_->world[static_cast<std::size_t>(rank - o.placement.first_rank)];
  }
  if (!parent) return new_group(rank, ranks, config);  // no world communicator to split yet
  const milliseconds timeout = config.timeout.count() > 0 ? config.timeout : o.timeout;
  const int sub = static_cast<int>(gk.member);
  int64_t instance = 0;
  std::shared_ptr<GroupInfo> info = s_->reg.group(rank, gk, ranks, &instance);
  // color: the group's smallest rank (groups partition the world, so it names one group).
  const int color = static_cast<int>(*std::min_element(ranks.begin(), ranks.end()));
  std::shared_ptr<NcclApi> api = o.api;
  s_->reg.enter_connect(rank, info);
  std::shared_ptr<Handle> h;
  // Every world rank splits the world communicator in the same order (SPMD): the n-th split of
  // each rank is one collective, whose members count themselves in as new_group's do.
  int64_t round = 0;
  {
    std::lock_guard lk(s_->mu);
    round = s_->split_rounds[static_cast<std::size_t>(rank - o.placement.first_rank)]++;
  }
  const std::string key = s_->key("nccl-split/" + std::to_string(round));
  const auto start = Clock::now();
  try {
    api->set_device(parent->device);
    o.placement.store->add(key + ".joined/" + std::to_string(rank), 1);
    h = std::make_shared<Handle>(api, api->split(parent->comm, color, sub, timeout), parent->device);
  } catch (const std::exception& e) {
    s_->reg.leave(rank);
    if (s_->reg.aborted()) s_->reg.throw_aborted();
    if (!s_->reg.all_local()) {
      std::vector<int64_t> world(static_cast<std::size_t>(o.world_size));
      std::iota(world.begin(), world.end(), int64_t{0});
      if (auto dg = join_diagnosis(*s_, key, world, rank, e.what(), std::chrono::duration_cast<milliseconds>(Clock::now() - start),
                                   "splitting the world's NCCL communicator (split " + std::to_string(round) + ", for group " +
                                       rank_list(std::vector<int64_t>(ranks.begin(), ranks.end())) + ")")) {
        abort(*dg);
        s_->reg.throw_aborted();
      }
    }
    throw;
  }
  s_->reg.leave(rank);
  s_->splits.fetch_add(1);
  auto comm = std::make_shared<NcclCommunicator>(s_, this, h, info, sub, timeout,
                                                 "nccl-census/" + detail::hex64(gk.digest) + "." + std::to_string(instance));
  comm->set_config(config);  // the group hands its config back
  return comm;
}

int64_t NcclBackend::splits() const { return s_->splits.load(); }
int64_t NcclBackend::inits() const { return s_->inits.load(); }

#ifndef MESHSIM_WITH_NCCL
std::shared_ptr<NcclApi> make_cuda_nccl_api() { return nullptr; }
#endif

std::optional<std::string> gpu_shortfall(int64_t ranks, int64_t first_device) {
  std::shared_ptr<NcclApi> api = make_cuda_nccl_api();
  if (!api) return "this build has no NCCL (configure with -DMESHSIM_WITH_NCCL=ON, e.g. cmake --preset nccl)";
  const int gpus = api->device_count();
  if (first_device >= 0 && ranks <= gpus - first_device) return std::nullopt;
  return gpus_needed(ranks, first_device) + "; " + api->name() + " sees " + std::to_string(gpus);
}

}  // namespace meshsim
