#include "meshsim/launch_env.hpp"

#include <charconv>
#include <cstdlib>

#include "meshsim/error.hpp"

namespace meshsim {

namespace {

int64_t parse_int(const char* name, const char* value, int64_t lo, int64_t hi) {
  const std::string v(value);
  int64_t out = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    throw InvalidArgument(std::string(name) + "='" + v + "' is not a decimal integer");
  }
  if (out < lo || out > hi) {
    throw InvalidArgument(std::string(name) + "=" + v + " is out of range [" + std::to_string(lo) +
                          ", " + std::to_string(hi) + "]");
  }
  return out;
}

constexpr int64_t kMaxWorld = int64_t{1} << 24;

}  // namespace

std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw InvalidArgument(what + "='" + text + "' is not host:port");
  }
  const std::string port = text.substr(colon + 1);
  const int64_t p = parse_int(what.c_str(), port.c_str(), 1, 65535);
  return {text.substr(0, colon), static_cast<uint16_t>(p)};
}

std::optional<LaunchEnv> launch_env_from(const std::function<const char*(const char*)>& get) {
  struct Scheme {
    const char *launcher, *rank, *world, *local;
  };
  const Scheme schemes[] = {
      {"meshsim", "MESHSIM_RANK", "MESHSIM_WORLD_SIZE", "MESHSIM_LOCAL_RANK"},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
  };
  for (const Scheme& s : schemes) {
    const char* rank = get(s.rank);
    const char* world = get(s.world);
    if (!rank && !world) continue;
    if (!rank || !world) {
      throw InvalidArgument(std::string(rank ? s.world : s.rank) + " is unset while " +
                            (rank ? s.rank : s.world) + " is set (" + s.launcher + "'s environment)");
    }
    LaunchEnv e;
    e.launcher = s.launcher;
    e.world_size = parse_int(s.world, world, 1, kMaxWorld);
    e.rank = parse_int(s.rank, rank, 0, e.world_size - 1);
    if (const char* local = get(s.local)) e.local_rank = parse_int(s.local, local, 0, e.world_size - 1);
    if (const char* store = get("MESHSIM_STORE")) {
      std::tie(e.store_host, e.store_port) = parse_host_port(store, "MESHSIM_STORE");
    } else if (const char* addr = get("MASTER_ADDR")) {
      const char* port = get("MASTER_PORT");
      if (!port) throw InvalidArgument("MASTER_PORT is unset while MASTER_ADDR is set");
      e.store_host = addr;
      e.store_port = static_cast<uint16_t>(parse_int("MASTER_PORT", port, 1, 65535));
    }
    return e;
  }
  return std::nullopt;
}

std::optional<LaunchEnv> launch_env_from_environment() {
  return launch_env_from([](const char* name) { return std::getenv(name); });
}

}  // namespace meshsim
