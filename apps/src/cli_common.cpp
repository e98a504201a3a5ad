#include "meshsim/cli_common.hpp"

#include <cmath>
#include <cstdlib>
#include <cctype>
#include <fstream>
#include <sstream>
#include <optional>
#include <string>

#include "meshsim/torch_store.hpp"

namespace meshsim::cli {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  std::size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::out_of_range&) {
    throw OverflowError(what + ": " + quote_input(s) + " does not fit in a 64-bit signed integer");
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || std::isspace(static_cast<unsigned char>(s[0]))) {
    throw InvalidArgument(what + ": " + quote_input(s) + " is not an integer");
  }
  return v;
}

std::chrono::milliseconds timeout_flag(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds) || seconds > kMaxTimeoutSeconds) {
    throw InvalidArgument("--timeout " + std::to_string(seconds) + " is not in (0, 86400] seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

bool job_failed(const Error& e) {
  return dynamic_cast<const Unavailable*>(&e) != nullptr || dynamic_cast<const DeadlineExceeded*>(&e) != nullptr ||
         dynamic_cast<const AlreadyExists*>(&e) != nullptr;
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

}  // namespace meshsim::cli
