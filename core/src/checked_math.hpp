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

}  // namespace meshsim
