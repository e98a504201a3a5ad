// store_ops.hpp (backends-private) — the value rules every store shares.
#pragma once

#include <charconv>
#include <cstdint>
#include <map>
#include <string>

#include "meshsim/decimal.hpp"
#include "meshsim/error.hpp"

namespace meshsim::detail {

// add_to adds delta to the decimal int64 held under key (absent = 0), stores and returns it.
inline int64_t add_to(std::map<std::string, std::string>& kv, const std::string& key, int64_t delta) {
  int64_t cur = 0;
  auto it = kv.find(key);
  if (it != kv.end()) {
    const std::string& v = it->second;
    const std::optional<int64_t> read = read_decimal(v);
    if (read) cur = *read;
    if (!read) {
      throw InvalidArgument("store add: the value of '" + key + "' is not a decimal int64 (" +
                            std::to_string(v.size()) + " bytes)");
    }
  }
  int64_t next = 0;
  if (__builtin_add_overflow(cur, delta, &next)) {
    throw OverflowError("store add: " + std::to_string(cur) + " + " + std::to_string(delta) +
                        " under '" + key + "' overflows int64");
  }
  kv[key] = std::to_string(next);
  return next;
}

// compare_set_in writes desired when the current value equals expected (absent matches an empty
// expected); returns the value after the call ("" when absent).
inline std::string compare_set_in(std::map<std::string, std::string>& kv, const std::string& key,
                                  const std::string& expected, const std::string& desired) {
  auto it = kv.find(key);
  if (it == kv.end()) {
    if (!expected.empty()) return "";
    kv[key] = desired;
    return desired;
  }
  if (it->second == expected) it->second = desired;
  return it->second;
}

}  // namespace meshsim::detail
