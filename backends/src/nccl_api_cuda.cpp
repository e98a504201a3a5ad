// The real NcclApi: NCCL and the CUDA runtime (built with MESHSIM_WITH_NCCL only). Communicators
// are created non-blocking, so every call that can wait on peers (init, split) is polled against
// a deadline and can be aborted.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "meshsim/error.hpp"
#include "meshsim/nccl_api.hpp"

namespace meshsim {

namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    throw Unavailable(std::string(call) + ": CUDA error " + std::to_string(static_cast<int>(e)) + " (" +
                      cudaGetErrorString(e) + ")");
  }
}

void check_nccl(ncclResult_t r, const char* call, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string detail = ncclGetErrorString(r);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) detail += std::string("; ") + last;
  }
  throw Unavailable(std::string(call) + ": NCCL error " + std::to_string(static_cast<int>(r)) + " (" + detail + ")");
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat16: return ncclFloat16;
  }
  throw InvalidArgument("nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw InvalidArgument("nccl: unknown reduce op");
}

ncclComm_t C(NcclApi::Comm c) { return static_cast<ncclComm_t>(c); }
cudaStream_t S(NcclApi::Stream s) { return static_cast<cudaStream_t>(s); }

// settle waits until a non-blocking communicator finished its pending call.
void settle(ncclComm_t comm, std::chrono::milliseconds timeout, const char* call) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError", comm);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      ncclCommAbort(comm);
      check_nccl(state, call);
    }
    if (Clock::now() >= deadline) {
      ncclCommAbort(comm);
      throw DeadlineExceeded(std::string(call) + ": the other ranks did not join within " +
                             std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class CudaNccl final : public NcclApi {
 public:
  std::string name() const override {
    int v = 0;
    ncclGetVersion(&v);
    return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
           " (CUDA)";
  }
  int device_count() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return n;
  }
  void set_device(int device) override { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }
  NcclId unique_id() override {
    ncclUniqueId u;
    check_nccl(ncclGetUniqueId(&u), "ncclGetUniqueId");
    NcclId id;
    static_assert(sizeof(u.internal) == 128);
    std::memcpy(id.bytes.data(), u.internal, 128);
    return id;
  }
  Comm init_rank(int nranks, const NcclId& id, int rank, std::chrono::milliseconds timeout) override {
    ncclUniqueId u;
    std::memcpy(u.internal, id.bytes.data(), 128);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommInitRankConfig(&comm, nranks, u, rank, &config), "ncclCommInitRankConfig");
    settle(comm, timeout, "ncclCommInitRankConfig");
    return comm;
  }
  Comm split(Comm parent, int color, int key, std::chrono::milliseconds timeout) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommSplit(C(parent), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, &config),
               "ncclCommSplit", C(parent));
    settle(C(parent), timeout, "ncclCommSplit");
    if (comm) settle(comm, timeout, "ncclCommSplit");
    return comm;
  }
  void abort(Comm c) override { ncclCommAbort(C(c)); }
  void destroy(Comm c) override { check_nccl(ncclCommDestroy(C(c)), "ncclCommDestroy"); }
  NcclStatus comm_status(Comm c, std::string* message) override {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(C(c), &state) != ncclSuccess) state = ncclInternalError;
    if (state == ncclSuccess) return NcclStatus::kDone;
    if (state == ncclInProgress) return NcclStatus::kInProgress;
    if (message) {
      *message = ncclGetErrorString(state);
      const char* last = ncclGetLastError(C(c));
      if (last && *last) *message += std::string("; ") + last;
    }
    return NcclStatus::kError;
  }
  Stream stream_create() override {
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void stream_destroy(Stream s) override { cudaStreamDestroy(S(s)); }
  NcclStatus stream_status(Stream s) override {
    const cudaError_t e = cudaStreamQuery(S(s));
    if (e == cudaSuccess) return NcclStatus::kDone;
    if (e == cudaErrorNotReady) return NcclStatus::kInProgress;
    return NcclStatus::kError;
  }
  void* device_alloc(std::size_t bytes) override {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void device_free(void* p) override { cudaFree(p); }
  void copy_to_device(void* dst, const void* src, std::size_t bytes, Stream s) override {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S(s)), "cudaMemcpyAsync");
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream s) override {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S(s)), "cudaMemcpyAsync");
  }
  void all_reduce(const void* in, void* out, std::size_t count, DType t, ReduceOp op, Comm c, Stream s) override {
    check_nccl(ncclAllReduce(in, out, count, nccl_type(t), nccl_op(op), C(c), S(s)), "ncclAllReduce", C(c));
  }
  void broadcast(const void* in, void* out, std::size_t count, DType t, int root, Comm c, Stream s) override {
    check_nccl(ncclBroadcast(in, out, count, nccl_type(t), root, C(c), S(s)), "ncclBroadcast", C(c));
  }
  void all_gather(const void* in, void* out, std::size_t count, DType t, Comm c, Stream s) override {
    check_nccl(ncclAllGather(in, out, count, nccl_type(t), C(c), S(s)), "ncclAllGather", C(c));
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DType t, ReduceOp op, Comm c,
                      Stream s) override {
    check_nccl(ncclReduceScatter(in, out, count, nccl_type(t), nccl_op(op), C(c), S(s)), "ncclReduceScatter", C(c));
  }
  void all_to_all(const void* in, void* out, std::size_t count, DType t, Comm c, Stream s) override {
    int n = 0;
    check_nccl(ncclCommCount(C(c), &n), "ncclCommCount", C(c));
    const std::size_t block = count * dtype_size(t);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < n; ++p) {
      check_nccl(ncclSend(static_cast<const char*>(in) + block * static_cast<std::size_t>(p), count, nccl_type(t), p,
                          C(c), S(s)),
                 "ncclSend", C(c));
      check_nccl(ncclRecv(static_cast<char*>(out) + block * static_cast<std::size_t>(p), count, nccl_type(t), p, C(c),
                          S(s)),
                 "ncclRecv", C(c));
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  void send(const void* in, std::size_t count, DType t, int peer, Comm c, Stream s) override {
    check_nccl(ncclSend(in, count, nccl_type(t), peer, C(c), S(s)), "ncclSend", C(c));
  }
  void recv(void* out, std::size_t count, DType t, int peer, Comm c, Stream s) override {
    check_nccl(ncclRecv(out, count, nccl_type(t), peer, C(c), S(s)), "ncclRecv", C(c));
  }
};

}  // namespace

std::shared_ptr<NcclApi> make_cuda_nccl_api() { return std::make_shared<CudaNccl>(); }

}  // namespace meshsim
