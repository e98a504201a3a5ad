#include "meshsim/job_store.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "meshsim/error.hpp"
#include "meshsim/torch_store.hpp"

namespace meshsim::launch {

std::chrono::milliseconds timeout_flag(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds) || seconds > kMaxTimeoutSeconds) {
    throw InvalidArgument("--timeout " + std::to_string(seconds) + " is not in (0, 86400] seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

std::string read_token_file(const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token) || token.empty()) {
    throw InvalidArgument(flag + " '" + path + "' cannot be read or its first line is empty");
  }
  return token;
}

LaunchStore join_store(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  const char* token = std::getenv("MESHSIM_STORE_TOKEN");
  std::optional<StoreProtocol> forced;
  if (const char* p = std::getenv("MESHSIM_TORCH_STORE_PROTOCOL"); p && *p) forced = parse_store_protocol(p);
  return join_launch_store(env, timeout, token ? token : "", forced);
}

}  // namespace meshsim::launch
