#include "meshsim/store_command.hpp"

#include <csignal>
#include <ostream>

#include "meshsim/job_store.hpp"

namespace meshsim::store_command {

int run(Options o, std::ostream& out) {
  if (!o.token_file.empty()) o.server.token = launch::read_token_file(o.token_file, "--token-file");
  // Block the stop signals before the server thread starts, then wait for one here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  TcpStoreServer server(o.server);
  out << "meshsim store listening on " << server.address() << std::endl;
  int sig = 0;
  sigwait(&stop, &sig);
  server.stop();
  out << "meshsim store stopped (signal " << sig << ")" << std::endl;
  return 0;
}

}  // namespace meshsim::store_command
