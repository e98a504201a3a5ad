#include "meshsim/checked_math.hpp"

#include <string>

#include "meshsim/error.hpp"

namespace meshsim {

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw OverflowError(std::string(what) + ": " + std::to_string(a) + " * " + std::to_string(b) +
                        " overflows 64-bit signed integers");
  }
  return r;
}

int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    throw OverflowError(std::string(what) + ": " + std::to_string(a) + " + " + std::to_string(b) +
                        " overflows 64-bit signed integers");
  }
  return r;
}

}  // namespace meshsim
