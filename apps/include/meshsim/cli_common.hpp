// meshsim/cli_common.hpp — what the `meshsim` subcommands share: the one --timeout rule and the
// one exit-code rule, joining a launched job's store.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/launch_env.hpp"

namespace meshsim::cli {

// kMaxTimeoutSeconds bounds --timeout of run and rendezvous (a day).
inline constexpr double kMaxTimeoutSeconds = 86400;

// timeout_flag converts --timeout SECONDS to milliseconds (rounded up); InvalidArgument unless
// the value is a finite number in (0, kMaxTimeoutSeconds].
std::chrono::milliseconds timeout_flag(double seconds);

// job_failed: an error that is the job failing (a store or peer that cannot be reached, a wait
// past its deadline, a rank started twice), exit 1; any other Error is bad usage or input,
// exit 2.
bool job_failed(const Error& e);

// read_token_file is the first line of the store's token file; InvalidArgument "<flag> 'PATH'
// cannot be read or its first line is empty" otherwise.
std::string read_token_file(const std::string& path, const std::string& flag);

// join_store joins a launched job's store (join_launch_store) with the token and store protocol
// the environment names (MESHSIM_STORE_TOKEN, MESHSIM_TORCH_STORE_PROTOCOL).
LaunchStore join_store(const LaunchEnv& env, std::chrono::milliseconds timeout);

// split cuts `s` at every `sep` (a trailing separator gives a last empty part).
std::vector<std::string> split(const std::string& s, char sep);

// parse_int reads a whole decimal int64: InvalidArgument "<what>: 'S' is not an integer", or
// OverflowError when it does not fit.
int64_t parse_int(const std::string& s, const std::string& what);

}  // namespace meshsim::cli
