#include "meshsim/communicator.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "reduce.hpp"

namespace meshsim {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
  }
  throw InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(t)));
}

const char* to_string(DType t) {
  switch (t) {
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "?";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "?";
}

const char* to_string(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kSend: return "send";
    case CollectiveOp::kRecv: return "recv";
  }
  return "?";
}

std::string CollectiveDesc::to_string() const {
  std::string s = meshsim::to_string(op);
  if (op == CollectiveOp::kBarrier) return s + "()";
  s += "(";
  if (op == CollectiveOp::kAllReduce || op == CollectiveOp::kReduceScatter) {
    s += std::string(meshsim::to_string(reduce)) + ", ";
  }
  s += std::string(meshsim::to_string(dtype)) + ", count=" + std::to_string(count);
  if (op == CollectiveOp::kBroadcast) s += ", root=" + std::to_string(root);
  if (op == CollectiveOp::kSend || op == CollectiveOp::kRecv) s += ", peer=" + std::to_string(root);
  return s + ")";
}

float to_float(BFloat16 v) { return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16); }

BFloat16 to_bfloat16(float f) {
  const auto u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40)};
  const uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return BFloat16{static_cast<uint16_t>((u + rounding) >> 16)};
}

float to_float(Float16 v) {
  const uint32_t sign = (v.bits & 0x8000u) << 16;
  const uint32_t exp = (v.bits >> 10) & 0x1F;
  const uint32_t man = v.bits & 0x3FF;
  if (exp == 0) {
    const float mag = std::ldexp(static_cast<float>(man), -24);
    return sign ? -mag : mag;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

Float16 to_float16(float f) {
  const auto u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  if (std::isnan(f)) return Float16{static_cast<uint16_t>(sign | 0x7E00)};
  const float a = std::fabs(f);
  if (a >= 65520.0f) return Float16{static_cast<uint16_t>(sign | 0x7C00)};  // rounds to inf
  if (a < std::ldexp(1.0f, -14)) {
    // Subnormal: a multiple of 2^-24, rounded to nearest even.
    const float q = a * std::ldexp(1.0f, 24);
    const float r = std::nearbyint(q);
    return Float16{static_cast<uint16_t>(sign | static_cast<uint16_t>(r))};
  }
  const uint32_t au = std::bit_cast<uint32_t>(a);
  const uint32_t rounded = au + 0xFFF + ((au >> 13) & 1);
  const uint32_t exp = ((rounded >> 23) & 0xFF) - 112;
  const uint32_t man = (rounded >> 13) & 0x3FF;
  return Float16{static_cast<uint16_t>(sign | (exp << 10) | man)};
}

const BackendConfig& Communicator::config() const {
  static const BackendConfig kDefault;
  return kDefault;
}

void Communicator::check_blocks(const char* what, std::size_t block, std::size_t whole) const {
  if (block * static_cast<std::size_t>(size()) != whole) {
    throw InvalidArgument(std::string(what) + ": a buffer of " + std::to_string(whole) +
                          " elements is not " + std::to_string(size()) + " blocks of " +
                          std::to_string(block));
  }
}

namespace detail {

namespace {

template <class T>
void reduce_native(std::byte* dst, const std::vector<const std::byte*>& ins, int64_t count,
                   ReduceOp op) {
  const auto n = static_cast<int64_t>(ins.size());
  T* out = reinterpret_cast<T*>(dst);
  std::memcpy(out, ins[0], static_cast<std::size_t>(count) * sizeof(T));
  for (std::size_t r = 1; r < ins.size(); ++r) {
    const T* in = reinterpret_cast<const T*>(ins[r]);
    for (int64_t i = 0; i < count; ++i) {
      out[i] = combine(out[i], in[i], op);
    }
  }
  if (op == ReduceOp::kAvg) {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(out[i] / static_cast<T>(n));
  }
}

template <class H, class From, class To>
void reduce_half(std::byte* dst, const std::vector<const std::byte*>& ins, int64_t count,
                 ReduceOp op, From from, To to) {
  std::vector<float> acc(static_cast<std::size_t>(count));
  for (std::size_t r = 0; r < ins.size(); ++r) {
    const H* in = reinterpret_cast<const H*>(ins[r]);
    for (int64_t i = 0; i < count; ++i) {
      const float v = from(in[i]);
      acc[static_cast<std::size_t>(i)] = r == 0 ? v : combine(acc[static_cast<std::size_t>(i)], v, op);
    }
  }
  H* out = reinterpret_cast<H*>(dst);
  const float n = static_cast<float>(ins.size());
  for (int64_t i = 0; i < count; ++i) {
    float v = acc[static_cast<std::size_t>(i)];
    if (op == ReduceOp::kAvg) v /= n;
    out[i] = to(v);
  }
}

}  // namespace

void reduce_into(std::byte* dst, const std::vector<const std::byte*>& ins, int64_t count, DType t,
                 ReduceOp op) {
  if (count <= 0 || ins.empty()) return;
  switch (t) {
    case DType::kInt32: return reduce_native<int32_t>(dst, ins, count, op);
    case DType::kInt64: return reduce_native<int64_t>(dst, ins, count, op);
    case DType::kFloat32: return reduce_native<float>(dst, ins, count, op);
    case DType::kFloat64: return reduce_native<double>(dst, ins, count, op);
    case DType::kBFloat16:
      return reduce_half<BFloat16>(dst, ins, count, op, [](BFloat16 v) { return to_float(v); },
                                   [](float v) { return to_bfloat16(v); });
    case DType::kFloat16:
      return reduce_half<Float16>(dst, ins, count, op, [](Float16 v) { return to_float(v); },
                                  [](float v) { return to_float16(v); });
  }
}

}  // namespace detail

}  // namespace meshsim
