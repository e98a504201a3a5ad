// meshsim/communicator.hpp — one small communicator interface for every backend, and the
// backend that makes groups of it.
//
//   std::shared_ptr<Communicator> tp = backend.new_group(me, {4, 5, 6, 7}, BackendConfig{});
//   std::vector<int64_t> got(tp->size());
//   int64_t mine = me;
//   tp->all_gather(std::span<const int64_t>(&mine, 1), std::span<int64_t>(got));  // {4,5,6,7}
//   tp->all_reduce(std::span<float>(grads), ReduceOp::kAvg);
//
// Collectives are blocking, on typed contiguous buffers, and every wait has a deadline (the
// group's BackendConfig timeout, else the backend's default): a wait that runs past it throws
// DeadlineExceeded naming the ranks that never arrived. When another rank of the run fails, a
// blocked collective throws Aborted naming it. Ranks that meet at one (group, sequence number)
// with different op, dtype, count or root fail with both descriptions (MismatchError).
// Reductions run in group-rank order, so floating-point results are identical from run to run.
// bfloat16 and float16 buffers (uint16_t storage) reduce in float32.
//
// Thread safety: a Communicator belongs to one rank; one thread calls it at a time. Backends are
// shared by every rank of a process and are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "meshsim/backend_config.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

// MismatchError: ranks met at one collective with different op, dtype, count or root.
class MismatchError : public InvalidArgument {
 public:
  explicit MismatchError(const std::string& m) : InvalidArgument(m) {}
  const char* type_name() const noexcept override { return "MismatchError"; }
};

// DType is the element type of a buffer.
enum class DType : uint8_t { kInt32, kInt64, kFloat32, kFloat64, kBFloat16, kFloat16 };
// ReduceOp combines elements; kAvg is the sum divided by the group size (integer division for
// integer types).
enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };
// CollectiveOp names what a rank called.
enum class CollectiveOp : uint8_t {
  kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kBarrier, kSend, kRecv
};

// combine is the one element kernel of every host reduction (the threaded, fiber and Gloo
// backends, local mode): a op b. Integers wrap in two's complement (as NCCL's do) without
// signed-overflow UB; kAvg combines as kSum (the caller divides); min and max keep `a` on ties
// and on NaN in `b`.
template <class T>
constexpr T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) + static_cast<std::make_unsigned_t<T>>(b));
      } else {
        return a + b;
      }
    case ReduceOp::kProd:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) * static_cast<std::make_unsigned_t<T>>(b));
      } else {
        return a * b;
      }
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return a < b ? b : a;
  }
  return a;
}

std::size_t dtype_size(DType t);
const char* to_string(DType t);
const char* to_string(ReduceOp op);
const char* to_string(CollectiveOp op);

// BFloat16 and Float16 are 16-bit storage types (bit patterns); arithmetic is in float32.
struct BFloat16 { uint16_t bits = 0; };
struct Float16 { uint16_t bits = 0; };
float to_float(BFloat16 v);
float to_float(Float16 v);
BFloat16 to_bfloat16(float v);  // round to nearest even
Float16 to_float16(float v);    // round to nearest even; overflow to infinity

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<int32_t>() { return DType::kInt32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kInt64; }
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::kBFloat16; }
template <> constexpr DType dtype_of<Float16>() { return DType::kFloat16; }

// CollectiveDesc is what one rank asked for at one sequence number of a group; ranks must agree.
// count is per rank (all_gather: elements each rank contributes; reduce_scatter and all_to_all:
// elements per rank block).
struct CollectiveDesc {
  CollectiveOp op = CollectiveOp::kBarrier;
  DType dtype = DType::kInt64;
  int64_t count = 0;
  int root = -1;  // broadcast root, send/recv peer (group ranks); -1 otherwise
  ReduceOp reduce = ReduceOp::kSum;
  friend bool operator==(const CollectiveDesc&, const CollectiveDesc&) = default;
  // to_string: "all_reduce(sum, float32, count=4)".
  std::string to_string() const;
};

// Communicator is one rank's handle on one group.
class Communicator {
 public:
  virtual ~Communicator() = default;
  // rank is this rank's index in the group; size the group's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // global_ranks are the group's global ranks in group order.
  virtual const std::vector<int64_t>& global_ranks() const = 0;
  // backend names the backend ("threaded", "gloo", "nccl").
  virtual std::string backend() const = 0;
  // config is the BackendConfig the group was made with (timeout, options, extras), as given to
  // new_group; a world communicator's is the default.
  virtual const BackendConfig& config() const;

  // The untyped collectives (count in elements; see CollectiveDesc for what count means).
  // all_reduce is in place; all_gather writes size*count elements; reduce_scatter reads
  // size*count and writes count; all_to_all reads and writes size*count (block i goes to rank i).
  virtual void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) = 0;
  virtual void broadcast(void* buf, int64_t count, DType t, int root) = 0;
  virtual void all_gather(const void* in, void* out, int64_t count, DType t) = 0;
  virtual void reduce_scatter(const void* in, void* out, int64_t count, DType t, ReduceOp op) = 0;
  virtual void all_to_all(const void* in, void* out, int64_t count, DType t) = 0;
  virtual void barrier() = 0;
  virtual void send(const void* buf, int64_t count, DType t, int peer) = 0;
  virtual void recv(void* buf, int64_t count, DType t, int peer) = 0;

  // Typed forms: the span sizes are checked (InvalidArgument naming both sizes).
  template <class T> void all_reduce(std::span<T> buf, ReduceOp op) {
    all_reduce(buf.data(), static_cast<int64_t>(buf.size()), dtype_of<T>(), op);
  }
  template <class T> void broadcast(std::span<T> buf, int root) {
    broadcast(buf.data(), static_cast<int64_t>(buf.size()), dtype_of<T>(), root);
  }
  template <class T> void all_gather(std::span<const T> in, std::span<T> out) {
    check_blocks("all_gather", in.size(), out.size());
    all_gather(in.data(), out.data(), static_cast<int64_t>(in.size()), dtype_of<T>());
  }
  template <class T> void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op) {
    check_blocks("reduce_scatter", out.size(), in.size());
    reduce_scatter(in.data(), out.data(), static_cast<int64_t>(out.size()), dtype_of<T>(), op);
  }
  template <class T> void all_to_all(std::span<const T> in, std::span<T> out) {
    if (in.size() != out.size()) check_blocks("all_to_all", 0, 1);
    check_blocks("all_to_all", in.size() / static_cast<std::size_t>(size()), in.size());
    all_to_all(in.data(), out.data(), static_cast<int64_t>(in.size()) / size(), dtype_of<T>());
  }
  template <class T> void send(std::span<const T> buf, int peer) {
    send(buf.data(), static_cast<int64_t>(buf.size()), dtype_of<T>(), peer);
  }
  template <class T> void recv(std::span<T> buf, int peer) {
    recv(buf.data(), static_cast<int64_t>(buf.size()), dtype_of<T>(), peer);
  }

 private:
  // check_blocks: `whole` must be size() blocks of `block` elements.
  void check_blocks(const char* what, std::size_t block, std::size_t whole) const;
};

// Backend makes communicators. Every member of a group calls new_group with the same ranks and
// config, and all ranks create their groups in the same order (SPMD); a rank that is not in
// `ranks` must not call it.
class Backend {
 public:
  Backend() = default;
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual std::string name() const = 0;
  virtual int64_t world_size() const = 0;
  // world is `rank`'s communicator over every rank 0..world_size-1.
  virtual std::shared_ptr<Communicator> world(int64_t rank) = 0;
  virtual std::shared_ptr<Communicator> new_group(int64_t rank, std::span<const int64_t> ranks,
                                                  const BackendConfig& config) = 0;
  // splits_world: the groups of a mesh dim that covers the whole world are better made by
  // split_group (NCCL's ncclCommSplit of the world communicator) than one by one.
  virtual bool splits_world() const { return false; }
  // split_group: every rank of the world calls it at once, each with its own group (the groups
  // partition the world, e.g. one dim of a mesh over every rank); the default is new_group.
  virtual std::shared_ptr<Communicator> split_group(int64_t rank, std::span<const int64_t> ranks,
                                                    const BackendConfig& config) {
    return new_group(rank, ranks, config);
  }
};

}  // namespace meshsim
