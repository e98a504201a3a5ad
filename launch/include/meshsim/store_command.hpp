// meshsim/store_command.hpp — `meshsim store`: serve a TCP rendezvous store until SIGINT or
// SIGTERM (for multi-process and multi-host jobs).
//
//   meshsim store [--host 0.0.0.0] [--port 29500] [--token-file F]
#pragma once

#include <iosfwd>
#include <string>

#include "meshsim/store.hpp"

namespace meshsim::store_command {

struct Options {
  TcpStoreOptions server;
  std::string token_file;  // its first line is the token clients must present
};

// run serves until a stop signal (printing the address it listens on, then the signal); returns
// the exit code. A bad token file or address throws meshsim::Error.
int run(Options o, std::ostream& out);

}  // namespace meshsim::store_command
