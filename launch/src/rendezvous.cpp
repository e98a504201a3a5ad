#include "meshsim/rendezvous.hpp"

#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "meshsim/job_store.hpp"
#include "meshsim/error.hpp"
#include "meshsim/launch_env.hpp"
#include "meshsim/store.hpp"

namespace meshsim::rendezvous {

int run(const Options& o, std::ostream& out) {
  const auto env = launch_env_from_environment();
  if (!env || env->store_host.empty()) {
    throw FailedPrecondition("not launched: no MESHSIM_RANK/RANK/OMPI_COMM_WORLD_RANK "
                             "with a store (MESHSIM_STORE or MASTER_ADDR/MASTER_PORT)");
  }
  const std::chrono::milliseconds deadline = launch::timeout_flag(o.timeout_seconds);
  LaunchStore joined = launch::join_store(*env, deadline);
  Store& store = *joined.store;
  const std::string prefix = "rendezvous" + env->scope;
  // One process per rank: a duplicate rank, or a store holding an earlier rendezvous, fails.
  claim_rank(store, prefix + "/" + std::to_string(env->rank), *env);
  std::vector<std::string> keys;
  for (int64_t r = 0; r < env->world_size; ++r) keys.push_back(prefix + "/" + std::to_string(r));
  store.wait(keys, deadline);
  const int64_t arrived = store.add(prefix + "/arrived", 1);
  if (arrived > env->world_size) {
    throw AlreadyExists("arrival " + std::to_string(arrived) + " at " + env->store_host + ":" +
                        std::to_string(env->store_port) + " is above the world size " + std::to_string(env->world_size) +
                        ": extra processes, or an earlier rendezvous");
  }
  if (joined.hosted) {
    // This process serves the store: it stays until every rank has arrived (bounded).
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (store.add(prefix + "/arrived", 0) < env->world_size && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  out << "rank " << env->rank << " of " << env->world_size << " (" << env->launcher << "): met every rank through "
      << env->store_host << ":" << env->store_port << " (arrival " << arrived << ")" << std::endl;
  return 0;
}

}  // namespace meshsim::rendezvous
