// meshsim/checked_math.hpp — 64-bit integer arithmetic that throws instead of wrapping.
//
//   int64_t n = meshsim::checked_mul(a, b, "size of (4,8)");  // OverflowError names the context
#pragma once

#include <cstdint>
#include <string_view>

namespace meshsim {

// checked_mul returns a * b, or throws OverflowError naming `what` when it does not fit.
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);
// checked_add returns a + b, or throws OverflowError naming `what` when it does not fit.
int64_t checked_add(int64_t a, int64_t b, std::string_view what);
// ceil_div returns ceil(a / b) for a >= 0, b > 0 without overflow.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a == 0 ? 0 : (a - 1) / b + 1; }

}  // namespace meshsim
