// meshsim/job_store.hpp — what every process of a launched job does first: bound its waits on
// peers by the one --timeout rule, and join the job's store (meshsim's, or the PyTorch TCPStore
// of torchrun's agent) with the token and protocol its environment names.
#pragma once

#include <chrono>
#include <string>

#include "meshsim/launch_env.hpp"

namespace meshsim::launch {

// kMaxTimeoutSeconds bounds --timeout of run and rendezvous (a day).
inline constexpr double kMaxTimeoutSeconds = 86400;

// timeout_flag converts --timeout SECONDS to milliseconds (rounded up); InvalidArgument unless
// the value is a finite number in (0, kMaxTimeoutSeconds].
std::chrono::milliseconds timeout_flag(double seconds);

// read_token_file is the first line of the store's token file; InvalidArgument "<flag> 'PATH'
// cannot be read or its first line is empty" otherwise.
std::string read_token_file(const std::string& path, const std::string& flag);

// join_store joins a launched job's store (join_launch_store) with the token and store protocol
// the environment names (MESHSIM_STORE_TOKEN, MESHSIM_TORCH_STORE_PROTOCOL).
LaunchStore join_store(const LaunchEnv& env, std::chrono::milliseconds timeout);

}  // namespace meshsim::launch
