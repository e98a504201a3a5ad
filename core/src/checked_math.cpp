#include "checked_math.hpp"

#include <string>

#include "meshsim/error.hpp"

namespace meshsim {

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  if (auto r = try_mul(a, b)) return *r;
  throw OverflowError(std::string(what) + ": " + std::to_string(a) + " * " + std::to_string(b) +
                      " overflows 64-bit signed integers");
}

int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  if (auto r = try_add(a, b)) return *r;
  throw OverflowError(std::string(what) + ": " + std::to_string(a) + " + " + std::to_string(b) +
                      " overflows 64-bit signed integers");
}

}  // namespace meshsim
