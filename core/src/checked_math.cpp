#include "checked_math.hpp"

#include <string>

#include "meshsim/error.hpp"

namespace meshsim::detail {

void throw_overflow(std::string_view what, int64_t a, char op, int64_t b) {
  throw OverflowError(std::string(what) + ": " + std::to_string(a) + " " + op + " " +
                      std::to_string(b) + " overflows 64-bit signed integers");
}

}  // namespace meshsim::detail
