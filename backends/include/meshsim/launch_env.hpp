// meshsim/launch_env.hpp — who am I in a multi-process job: the rank, world size, local rank and
// store address a launcher put in the environment.
//
//   if (auto env = launch_env_from_environment()) {
//     TcpStoreClient store({.host = env->store_host, .port = env->store_port});
//     ... rank env->rank of env->world_size ...
//   }
//
// Read, in this order (the first launcher found wins): meshsim launch's MESHSIM_RANK,
// MESHSIM_WORLD_SIZE, MESHSIM_LOCAL_RANK, MESHSIM_STORE (host:port); torchrun's RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; Open MPI's OMPI_COMM_WORLD_RANK,
// OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK (with MESHSIM_STORE or MASTER_ADDR/PORT for
// the store). A variable that is present but malformed (not a decimal integer, out of range,
// rank >= world size, a store that is not host:port) is InvalidArgument naming the variable
// and its value; none present is nullopt (not launched).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace meshsim {

struct LaunchEnv {
  std::string launcher;  // "meshsim", "torchrun" or "openmpi"
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string store_host;  // empty when the environment names no store
  uint16_t store_port = 0;
};

// launch_env_from reads the variables through `get` (nullptr when unset): testable without
// touching the process environment.
std::optional<LaunchEnv> launch_env_from(const std::function<const char*(const char*)>& get);
// launch_env_from_environment is launch_env_from(std::getenv).
std::optional<LaunchEnv> launch_env_from_environment();

// parse_host_port reads "host:port" (InvalidArgument naming `what` otherwise).
std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what);

}  // namespace meshsim
