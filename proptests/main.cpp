// Property-test driver. rapidcheck reads RC_PARAMS; when it is unset this sets a quick default
// (300 cases per property), and MESHSIM_FUZZ=<n> asks for n cases per property (long runs).
// Failures print rapidcheck's seed and reproduce string.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (std::getenv("RC_PARAMS") == nullptr) {
    const char* fuzz = std::getenv("MESHSIM_FUZZ");
    std::string params = "max_success=" + std::string(fuzz ? fuzz : "300");
    setenv("RC_PARAMS", params.c_str(), 0);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
