#include "meshsim/launch_env.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>

#include "meshsim/decimal.hpp"
#include "meshsim/error.hpp"
#include "meshsim/host.hpp"

namespace meshsim {

namespace {

int64_t parse_int(const char* name, const char* value, int64_t lo, int64_t hi) {
  const std::string v(value);
  const std::optional<int64_t> read = read_decimal(v);
  if (!read) throw InvalidArgument(std::string(name) + "='" + v + "' is not a decimal integer");
  const int64_t out = *read;
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
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
  };
  for (const Scheme& s : schemes) {
    const char* rank = get(s.rank);
    const char* world = get(s.world);
    if (!rank && !world) continue;
    if (!rank || !world) {
      throw InvalidArgument(std::string(rank ? s.world : s.rank) + " is unset while " +
                            (rank ? s.rank : s.world) + " is set (" + s.launcher +
                            "'s environment)");
    }
    LaunchEnv e;
    e.launcher = s.launcher;
    e.world_size = parse_int(s.world, world, 1, kMaxWorld);
    e.rank = parse_int(s.rank, rank, 0, e.world_size - 1);
    if (const char* local = get(s.local))
      e.local_rank = parse_int(s.local, local, 0, e.world_size - 1);
    const char* node = e.launcher == "torchrun" ? get("GROUP_RANK")
                       : e.launcher == "slurm"  ? get("SLURM_NODEID")
                                                : nullptr;
    if (node)
      e.node_rank = parse_int(e.launcher == "torchrun" ? "GROUP_RANK" : "SLURM_NODEID", node, 0,
                              e.world_size - 1);
    if (e.launcher == "torchrun") {
      if (const char* agent = get("TORCHELASTIC_USE_AGENT_STORE")) {
        const std::string a(agent);
        if (a != "True" && a != "False") {
          throw InvalidArgument("TORCHELASTIC_USE_AGENT_STORE=" + quote_input(a) +
                                " is neither True nor False");
        }
        e.agent_store = a == "True";
      }
      if (const char* n = get("TORCHELASTIC_RESTART_COUNT")) {
        e.restart_count = parse_int("TORCHELASTIC_RESTART_COUNT", n, 0, int64_t{1} << 31);
      }
      if (const char* id = get("TORCHELASTIC_RUN_ID")) e.run_id = id;
      if (const char* f = get("TORCHELASTIC_ERROR_FILE")) e.error_file = f;
    }
    if (const char* store = get("MESHSIM_STORE")) {
      std::tie(e.store_host, e.store_port) = parse_host_port(store, "MESHSIM_STORE");
      e.store_variable = "MESHSIM_STORE";
    } else if (const char* addr = get("MASTER_ADDR")) {
      const char* port = get("MASTER_PORT");
      if (!port) throw InvalidArgument("MASTER_PORT is unset while MASTER_ADDR is set");
      e.store_host = addr;
      e.store_variable = "MASTER_ADDR";
      e.store_port = static_cast<uint16_t>(parse_int("MASTER_PORT", port, 1, 65535));
    } else if (get("MASTER_PORT")) {
      throw InvalidArgument("MASTER_ADDR is unset while MASTER_PORT is set");
    }
    if (const char* id = get("MESHSIM_RUN_ID"); id && *id) e.scope += "/" + std::string(id);
    if (e.launcher == "torchrun") {
      e.scope += "/torchelastic/" + (e.run_id.empty() ? std::string("none") : e.run_id) + "/attempt_" +
                 std::to_string(e.restart_count);
    }
    if (e.launcher == "slurm" && e.store_host.empty()) {
      throw InvalidArgument(
          "launched by srun (SLURM_PROCID=" + std::to_string(e.rank) +
          ", SLURM_NTASKS=" + std::to_string(e.world_size) +
          ") but no store is named: set MASTER_ADDR (e.g. the first host of SLURM_NODELIST) "
          "and MASTER_PORT, as PyTorch requires under srun, or MESHSIM_STORE=host:port");
    }
    return e;
  }
  // A launcher's variables meshsim cannot place itself by: refuse rather than have every
  // process simulate the whole world alone and report success.
  for (const char* lone : {"LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "LOCAL_WORLD_SIZE"}) {
    if (get(lone)) {
      throw InvalidArgument(std::string(lone) + " is set but RANK and WORLD_SIZE are not: a launcher started this "
                            "process without telling it its rank (set RANK and WORLD_SIZE, or unset " + lone + ")");
    }
  }
  return std::nullopt;
}

LaunchStore join_launch_store(const LaunchEnv& env, std::chrono::milliseconds timeout,
                              const std::string& token,
                              std::optional<StoreProtocol> forced_protocol) {
  if (env.store_host.empty()) {
    throw InvalidArgument(
        "launched by " + env.launcher +
        " but no store is named (set MESHSIM_STORE=host:port, or MASTER_ADDR and MASTER_PORT)");
  }
  LaunchStore out;
  std::string host;
  try {
    host = host::numeric_address(env.store_host);
  } catch (const Unavailable& e) {
    throw Unavailable(env.store_variable + "=" + quote_input(env.store_host) + ": " + e.what());
  }
  auto meshsim_client = [&]() {
    auto c = std::make_shared<TcpStoreClient>(TcpStoreOptions{
        .host = host, .port = env.store_port, .token = token, .connect_timeout = timeout, .reply_timeout = timeout});
    out.meshsim = c.get();
    out.store = std::move(c);
    out.protocol = StoreProtocol::kMeshsim;
  };
  if (env.launcher == "meshsim" && !forced_protocol) {
    meshsim_client();
    return out;
  }
  std::optional<StoreProtocol> protocol = forced_protocol;
  if (!protocol && !env.agent_store && env.rank == 0) {
    // As PyTorch's rank 0 does: serve the store, unless something already listens there.
    try {
      TcpStoreOptions serve;
      serve.host = host;
      serve.port = env.store_port;
      serve.token = token;
      out.hosted = std::make_unique<TcpStoreServer>(serve);
      protocol = StoreProtocol::kMeshsim;
    } catch (const Unavailable&) {
    }
  }
  if (!protocol) protocol = probe_store(env.store_host, env.store_port, timeout);
  if (*protocol == StoreProtocol::kMeshsim) {
    meshsim_client();
    return out;
  }
  out.protocol = *protocol;
  out.store = std::make_shared<TorchStoreClient>(TorchStoreOptions{.host = env.store_host,
                                                                   .port = env.store_port,
                                                                   .protocol = protocol,
                                                                   .connect_timeout = timeout,
                                                                   .reply_timeout = timeout});
  return out;
}

void claim_rank(Store& store, const std::string& key, const LaunchEnv& env) {
  const std::string me = process_identity();
  const std::string held = store.compare_set(key, "", me);
  if (held == me) return;
  const auto space = held.rfind(' '), mine = me.rfind(' ');
  const bool here = space != std::string::npos && held.substr(0, space) == me.substr(0, mine);
  const bool gone = here && !host::process_alive(held.substr(space + 1));
  throw AlreadyExists("rank " + std::to_string(env.rank) + " is already held in the store " + env.store_host + ":" +
                      std::to_string(env.store_port) + " by process " + quote_input(held) + " (host pid)" +
                      (gone ? ", which is gone: an earlier run used this store (give each run its own "
                              "MESHSIM_RUN_ID, or a fresh store)"
                            : ": two processes were started as rank " + std::to_string(env.rank)));
}

std::string process_identity() { return host::this_host() + " " + std::to_string(::getpid()); }

std::optional<LaunchEnv> launch_env_from_environment() {
  return launch_env_from([](const char* name) { return std::getenv(name); });
}

}  // namespace meshsim
