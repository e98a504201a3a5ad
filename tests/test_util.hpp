// Shared helpers for meshsim's unit tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "meshsim/algebra.hpp"
#include "meshsim/layout.hpp"

namespace meshsim::testing {

inline Layout L(const std::string& text) { return parse_layout(text); }
inline IntTuple T(const std::string& text) { return parse_int_tuple(text); }
constexpr Convention kTorch = Convention::kTorch;
constexpr Convention kCute = Convention::kCute;

// Case is one row of a table-driven test: input text(s), convention, expected text.
struct Case {
  std::string in;
  Convention conv;
  std::string want;
};

// expect_throws_with checks that `f` throws ErrorT and that the message names `needle`.
template <typename ErrorT, typename F>
void expect_throws_with(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an exception mentioning '" << needle << "'";
  } catch (const ErrorT& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace meshsim::testing
