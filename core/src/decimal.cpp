#include "meshsim/decimal.hpp"

#include <charconv>
#include <system_error>

namespace meshsim {

std::optional<int64_t> read_decimal(std::string_view text, bool* overflow) {
  if (overflow) *overflow = false;
  int64_t v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range && end == last) {
    if (overflow) *overflow = true;
    return std::nullopt;
  }
  if (text.empty() || ec != std::errc() || end != last) return std::nullopt;
  return v;
}

}  // namespace meshsim
