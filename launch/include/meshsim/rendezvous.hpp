// meshsim/rendezvous.hpp — `meshsim rendezvous`: meet every rank of a launched job through its
// store and say so (the smallest program to check a launcher, a store and the environment).
//
//   meshsim launch -n 4 -- meshsim rendezvous     torchrun --nproc-per-node 4 meshsim rendezvous
#pragma once

#include <iosfwd>

namespace meshsim::rendezvous {

struct Options {
  double timeout_seconds = 60;  // to wait for the other ranks
};

// run meets every rank (one process per rank; a duplicate rank or a store holding an earlier
// rendezvous fails) and prints one line; returns the exit code. Errors throw meshsim::Error
// (cli::job_failed says which are the job failing).
int run(const Options& o, std::ostream& out);

}  // namespace meshsim::rendezvous
