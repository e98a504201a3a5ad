// meshsim/cli_common.hpp — the one exit-code rule the `meshsim` subcommands share.
#pragma once

#include "meshsim/error.hpp"

namespace meshsim::cli {

// job_failed: an error that is the job failing (a store or peer that cannot be reached, a wait
// past its deadline, a rank started twice), exit 1; any other Error is bad usage or input,
// exit 2.
bool job_failed(const Error& e);

}  // namespace meshsim::cli
