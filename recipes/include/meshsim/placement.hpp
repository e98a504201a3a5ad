// meshsim/placement.hpp — where a mesh's groups land on hosts. With --gpus-per-host G, global
// rank r runs on host r / G, and in NVLink domain r / D (--nvlink-domain D, in GPUs, default G);
// rank maps are honoured (a mesh over ranks 2048..4095 lives on hosts 256..511 with G = 8).
// `show` and `run` report, per dim of every mesh, how many hosts (and domains) its widest group
// spans and how many of its groups cross a host; --require tp=host (or tp=domain) makes them
// exit 1 naming the dim, the first group that breaks it and the hosts it spans.
//
//   meshsim show --mesh dp=4,tp=8 --gpus-per-host 8 --require tp=host
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/device_mesh.hpp"

namespace meshsim::placement {

// Flags are the command-line flags as given.
struct Flags {
  std::optional<int64_t> gpus_per_host;
  std::optional<int64_t> nvlink_domain;
  std::vector<std::string> require;  // "DIM=host" or "DIM=domain"
};

enum class Scope { kHost, kDomain };

struct Requirement {
  std::string dim;
  Scope scope = Scope::kHost;
};

// Hosts is a validated placement: G GPUs per host, NVLink domains of D GPUs.
struct Hosts {
  int64_t gpus_per_host = 1;
  int64_t nvlink_domain = 1;
  std::vector<Requirement> require;
};

// kMaxGpus bounds G and D (2^40: past any cluster, far from overflow).
inline constexpr int64_t kMaxGpus = int64_t{1} << 40;

// from_flags validates the flags: nullopt without --gpus-per-host; InvalidArgument naming the
// flag and value for G or D outside [1, kMaxGpus], --nvlink-domain or --require without
// --gpus-per-host, or a --require that is not DIM=host or DIM=domain.
std::optional<Hosts> from_flags(const Flags& f);

// DimPlacement: how one dim's groups land.
struct DimPlacement {
  int64_t groups = 0;
  int64_t max_hosts = 0;              // hosts the widest group spans
  int64_t groups_crossing_hosts = 0;  // groups on more than one host
  int64_t max_domains = 0;            // NVLink domains the widest group spans
};

DimPlacement place(const DeviceMesh& m, int dim, const Hosts& h);

// violation: for a requirement on `dim`, the first group (in group order) that spans more than
// one host (domain), said as "dim tp of DeviceMesh(...): group [6, 7, 8, 9] spans hosts [0, 1]
// (8 GPUs per host)"; nullopt when every group keeps to one.
std::optional<std::string> violation(const DeviceMesh& m, int dim, const Hosts& h, Scope scope);

// check_required: InvalidArgument when a --require names a dim no mesh of `meshes` has.
void check_required(const Hosts& h, const std::vector<DeviceMesh>& meshes);

// violations lists every requirement broken by any of `meshes` (one line each).
std::vector<std::string> violations(const Hosts& h, const std::vector<DeviceMesh>& meshes);

}  // namespace meshsim::placement
