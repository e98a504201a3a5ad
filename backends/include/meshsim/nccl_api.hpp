// meshsim/nccl_api.hpp — the thin interface every NCCL and CUDA call of the NCCL backend goes
// through, so the logic around them (unique ids through the store, splits keyed by the group
// cache, deadlines, aborts, async errors) is tested with a fake that needs no GPU.
//
//   std::shared_ptr<NcclApi> api = make_cuda_nccl_api();   // MESHSIM_WITH_NCCL builds only
//   NcclApi::Comm c = api->init_rank(4, id, 1, std::chrono::seconds(30));
//   api->all_reduce(dev_in, dev_out, n, DType::kFloat32, ReduceOp::kSum, c, stream);
//   while (api->stream_status(stream) == NcclStatus::kInProgress) { ... deadline, abort ... }
//
// Handles are opaque (no CUDA or NCCL type appears here, so the interface builds without them).
// Calls that enqueue work (copies, collectives) return at once; completion and failure are
// observed with stream_status and comm_status. A failed call throws meshsim::Unavailable naming
// the call and NCCL's or CUDA's message. Memory given to collectives is device memory from
// device_alloc.
//
// Thread safety: as NCCL's: one thread drives a communicator and its stream; abort may be called
// from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "meshsim/communicator.hpp"

namespace meshsim {

// NcclId is ncclUniqueId's 128 bytes.
struct NcclId {
  std::array<uint8_t, 128> bytes{};
  std::string to_hex() const;
  static NcclId from_hex(const std::string& hex);  // InvalidArgument unless 256 hex digits
};

enum class NcclStatus : uint8_t { kDone, kInProgress, kError };

class NcclApi {
 public:
  using Comm = void*;
  using Stream = void*;
  virtual ~NcclApi() = default;

  virtual std::string name() const = 0;  // "NCCL 2.28.9 (CUDA)" or "fake NCCL"
  virtual int device_count() = 0;        // 0 without a GPU or driver
  virtual void set_device(int device) = 0;  // for the calling thread
  virtual NcclId unique_id() = 0;
  // init_rank joins communicator `id` as `rank` of `nranks`; throws DeadlineExceeded when the
  // other ranks do not join within `timeout`.
  virtual Comm init_rank(int nranks, const NcclId& id, int rank, std::chrono::milliseconds timeout) = 0;
  // split is ncclCommSplit: every rank of `parent` calls it; ranks of one color form a
  // communicator ordered by key; color < 0 takes no part (returns nullptr).
  virtual Comm split(Comm parent, int color, int key, std::chrono::milliseconds timeout) = 0;
  virtual void abort(Comm c) = 0;    // ncclCommAbort: pending work ends with an error
  virtual void destroy(Comm c) = 0;  // after the stream is idle
  // comm_status is ncclCommGetAsyncError; `message` gets the error text.
  virtual NcclStatus comm_status(Comm c, std::string* message) = 0;

  virtual Stream stream_create() = 0;
  virtual void stream_destroy(Stream s) = 0;
  virtual NcclStatus stream_status(Stream s) = 0;  // cudaStreamQuery
  virtual void* device_alloc(std::size_t bytes) = 0;
  virtual void device_free(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes, Stream s) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream s) = 0;

  // Collectives, enqueued on `s`; counts are elements per rank as in NCCL.
  virtual void all_reduce(const void* in, void* out, std::size_t count, DType t, ReduceOp op, Comm c, Stream s) = 0;
  virtual void broadcast(const void* in, void* out, std::size_t count, DType t, int root, Comm c, Stream s) = 0;
  virtual void all_gather(const void* in, void* out, std::size_t count, DType t, Comm c, Stream s) = 0;
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DType t, ReduceOp op, Comm c,
                              Stream s) = 0;
  // all_to_all: block i of `in` to rank i (ncclGroupStart, a send and a recv per peer, ncclGroupEnd).
  virtual void all_to_all(const void* in, void* out, std::size_t count, DType t, Comm c, Stream s) = 0;
  virtual void send(const void* in, std::size_t count, DType t, int peer, Comm c, Stream s) = 0;
  virtual void recv(void* out, std::size_t count, DType t, int peer, Comm c, Stream s) = 0;
};

// make_cuda_nccl_api is the real NCCL and CUDA runtime; nullptr in builds without
// MESHSIM_WITH_NCCL.
std::shared_ptr<NcclApi> make_cuda_nccl_api();

// gpu_shortfall is the one GPU probe: why `ranks` ranks, from GPU `first_device` on, cannot each
// have a GPU of their own here ("this build has no NCCL (...)", or "4 ranks from GPU 0 need one
// GPU each; CUDA sees 1"); nullopt when they can.
std::optional<std::string> gpu_shortfall(int64_t ranks, int64_t first_device = 0);

}  // namespace meshsim
