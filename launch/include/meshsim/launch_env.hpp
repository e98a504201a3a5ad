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
// WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT and its TORCHELASTIC_* variables
// (USE_AGENT_STORE, RESTART_COUNT, RUN_ID, ERROR_FILE); Open MPI's OMPI_COMM_WORLD_RANK,
// OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK; Slurm's SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NODEID (srun); MPICH's and Intel MPI's PMI_RANK, PMI_SIZE,
// MPI_LOCALRANKID (mpiexec/Hydra). Every launcher but meshsim's takes the store from
// MESHSIM_STORE or MASTER_ADDR/MASTER_PORT; Slurm requires one (PyTorch under srun does too).
// A variable that is present but malformed (not a decimal integer, out of range, rank >= world
// size, a store that is not host:port, a restart count that is negative) is InvalidArgument
// naming the variable and its value; none present is nullopt (not launched), except that
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT, GROUP_RANK or LOCAL_WORLD_SIZE without a rank is
// InvalidArgument naming it (a launcher that left this process without its place).
//
// Thread safety: launch_env_from_environment reads the environment (getenv): call it where no
// thread changes the environment; the rest is safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "meshsim/store.hpp"
#include "meshsim/torch_store.hpp"

namespace meshsim {

struct LaunchEnv {
  std::string launcher;  // "meshsim", "torchrun", "openmpi", "slurm" or "mpich"
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t node_rank = 0;   // torchrun's GROUP_RANK, Slurm's SLURM_NODEID (0 when unset)
  std::string store_host;  // empty when the environment names no store
  uint16_t store_port = 0;
  std::string store_variable;  // where the store came from: "MESHSIM_STORE" or "MASTER_ADDR"
  // torchrun only: the agent serves the store (TORCHELASTIC_USE_AGENT_STORE=True), the restart
  // attempt, the run id, and where a failing worker describes its failure for the agent.
  bool agent_store = false;
  int64_t restart_count = 0;
  std::string run_id;
  std::string error_file;
  // scope namespaces one run's keys in a shared store: "/<MESHSIM_RUN_ID>" when set, then under
  // torchrun "/torchelastic/<run id>/attempt_<restart count>" (the agent's store outlives an
  // attempt); "" otherwise.
  std::string scope;
};

// launch_env_from reads the variables through `get` (nullptr when unset): testable without
// touching the process environment.
std::optional<LaunchEnv> launch_env_from(const std::function<const char*(const char*)>& get);
// launch_env_from_environment is launch_env_from(std::getenv).
std::optional<LaunchEnv> launch_env_from_environment();

// LaunchStore is a launched process's connection to its job's store.
struct LaunchStore {
  std::shared_ptr<Store> store;
  TcpStoreClient* meshsim = nullptr;  // the same store when it is meshsim's (it has wills)
  std::unique_ptr<TcpStoreServer> hosted;  // the store this process serves, if it serves one
  StoreProtocol protocol = StoreProtocol::kMeshsim;
};

// join_launch_store connects to the job's store as its launcher arranged:
// - meshsim launch: meshsim's store at MESHSIM_STORE (with `token`);
// - torchrun with TORCHELASTIC_USE_AGENT_STORE=True: the agent's PyTorch TCPStore;
// - otherwise rank 0 serves meshsim's store at the address (as PyTorch's rank 0 serves a
//   TCPStore), unless something already listens there; every rank then probes what answers at
//   the address (probe_store): meshsim's store, or a PyTorch TCPStore (1.13 or 2.x) that a user
//   or an agent started.
// MESHSIM_TORCH_STORE_PROTOCOL=1.13|2 (`forced_protocol`) skips the probe and rank 0's server.
// Every connect and probe ends within `timeout` (Unavailable naming the address).
LaunchStore join_launch_store(const LaunchEnv& env, std::chrono::milliseconds timeout, const std::string& token,
                              std::optional<StoreProtocol> forced_protocol);

// claim_rank records this process as the holder of rank env.rank under `key` (compare-and-set
// of process_identity()); AlreadyExists naming the holder when another process holds it: a
// duplicate rank, or a store that still holds an earlier run's keys (its process gone).
void claim_rank(Store& store, const std::string& key, const LaunchEnv& env);

// process_identity is "<host> <pid>" of this process: what claim_rank publishes under
// "<prefix>/rank/<rank>", so that its peers on the same host can name it when its process ends
// abruptly, with or without wills (Gloo's and NCCL's store_diagnosis read it).
std::string process_identity();

// parse_host_port reads "host:port" (InvalidArgument naming `what` otherwise).
std::pair<std::string, uint16_t> parse_host_port(const std::string& text, const std::string& what);

}  // namespace meshsim
