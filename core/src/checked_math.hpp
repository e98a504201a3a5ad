// checked_math.hpp (core-private) — 64-bit integer arithmetic that throws or reports instead of
// wrapping. Every overflow check of core goes through here.
//
//   int64_t n = checked_mul(a, b, "size of (4,8)");   // OverflowError names the context
//   if (auto p = try_mul(a, b)) use(*p);              // nullopt when it does not fit
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace meshsim {

namespace detail {
// throw_overflow throws OverflowError "<what>: <a> <op> <b> overflows 64-bit signed integers".
[[noreturn]] void throw_overflow(std::string_view what, int64_t a, char op, int64_t b);
}  // namespace detail

// checked_mul returns a * b, or throws OverflowError naming `what` when it does not fit.
// Inline: the check is one flag test on the hot path; the message is built out of line.
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]] detail::throw_overflow(what, a, '*', b);
  return r;
}
// checked_add returns a + b, or throws OverflowError naming `what` when it does not fit.
inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]] detail::throw_overflow(what, a, '+', b);
  return r;
}
// try_mul / try_add return the result, or nullopt when it does not fit in int64.
inline std::optional<int64_t> try_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> try_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
// ceil_div returns ceil(a / b) for a >= 0, b > 0 without overflow.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a == 0 ? 0 : (a - 1) / b + 1; }

// divmod is v / m and v % m for v >= 0, m >= 1, cheap for the common cases (a power of two,
// 32-bit operands) before the general 64-bit division.
inline void divmod(int64_t v, int64_t m, int64_t& q, int64_t& r) {
  if ((m & (m - 1)) == 0) {
    q = v >> __builtin_ctzll(static_cast<uint64_t>(m));
    r = v & (m - 1);
  } else if ((static_cast<uint64_t>(v) | static_cast<uint64_t>(m)) <= UINT32_MAX) {
    const auto a = static_cast<uint32_t>(v);
    const auto b = static_cast<uint32_t>(m);
    q = a / b;
    r = a % b;
  } else {
    q = v / m;
    r = v % m;
  }
}

// fast_div / fast_mod are a / b and a % b for a >= 0, b >= 1 (see divmod).
inline int64_t fast_div(int64_t a, int64_t b) {
  int64_t q = 0;
  int64_t r = 0;
  divmod(a, b, q, r);
  return q;
}
inline int64_t fast_mod(int64_t a, int64_t b) {
  int64_t q = 0;
  int64_t r = 0;
  divmod(a, b, q, r);
  return r;
}

}  // namespace meshsim
