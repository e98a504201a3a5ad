#include "meshsim/placement.hpp"

#include <algorithm>

#include "meshsim/error.hpp"

namespace meshsim::placement {

namespace {

int64_t unit(Scope s, const Hosts& h) { return s == Scope::kHost ? h.gpus_per_host : h.nvlink_domain; }
const char* noun(Scope s) { return s == Scope::kHost ? "host" : "domain"; }

// spanned lists the distinct units (hosts or domains of `size` GPUs) a group's ranks live on.
std::vector<int64_t> spanned(std::span<const int64_t> group, int64_t size) {
  std::vector<int64_t> units;
  units.reserve(group.size());
  for (int64_t r : group) units.push_back(r / size);
  std::sort(units.begin(), units.end());
  units.erase(std::unique(units.begin(), units.end()), units.end());
  return units;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > 16) s += ", ... (" + std::to_string(v.size()) + ")";
  return s + "]";
}

int64_t gpus_flag(int64_t v, const char* flag) {
  if (v < 1 || v > kMaxGpus) {
    throw InvalidArgument(std::string(flag) + " " + std::to_string(v) + " is out of range [1, 2^40]");
  }
  return v;
}

}  // namespace

std::optional<Hosts> from_flags(const Flags& f) {
  if (!f.gpus_per_host) {
    if (f.nvlink_domain) throw InvalidArgument("--nvlink-domain needs --gpus-per-host");
    if (!f.require.empty()) throw InvalidArgument("--require " + quote_input(f.require[0]) + " needs --gpus-per-host");
    return std::nullopt;
  }
  Hosts h;
  h.gpus_per_host = gpus_flag(*f.gpus_per_host, "--gpus-per-host");
  h.nvlink_domain = f.nvlink_domain ? gpus_flag(*f.nvlink_domain, "--nvlink-domain") : h.gpus_per_host;
  for (const std::string& spec : f.require) {
    const auto eq = spec.find('=');
    const std::string dim = spec.substr(0, eq == std::string::npos ? spec.size() : eq);
    const std::string where = eq == std::string::npos ? "" : spec.substr(eq + 1);
    if (dim.empty() || (where != "host" && where != "domain")) {
      throw InvalidArgument("--require " + quote_input(spec) + " is not DIM=host or DIM=domain");
    }
    h.require.push_back({dim, where == "host" ? Scope::kHost : Scope::kDomain});
  }
  return h;
}

DimPlacement place(const DeviceMesh& m, int dim, const Hosts& h) {
  const GroupTable t = m.group_table(dim);
  DimPlacement p;
  p.groups = t.count;
  for (int64_t g = 0; g < t.count; ++g) {
    const auto hosts = static_cast<int64_t>(spanned(t.row(g), h.gpus_per_host).size());
    p.max_hosts = std::max(p.max_hosts, hosts);
    p.groups_crossing_hosts += hosts > 1 ? 1 : 0;
    p.max_domains = std::max(p.max_domains, static_cast<int64_t>(spanned(t.row(g), h.nvlink_domain).size()));
  }
  return p;
}

std::optional<std::string> violation(const DeviceMesh& m, int dim, const Hosts& h, Scope scope) {
  const GroupTable t = m.group_table(dim);
  for (int64_t g = 0; g < t.count; ++g) {
    const std::vector<int64_t> units = spanned(t.row(g), unit(scope, h));
    if (units.size() <= 1) continue;
    const std::vector<int64_t> members(t.row(g).begin(), t.row(g).end());
    return "dim " + m.dim_name(dim) + " of " + m.to_string() + ": group " + list(members) + " spans " + noun(scope) +
           "s " + list(units) + " (" + std::to_string(unit(scope, h)) + " GPUs per " + noun(scope) +
           "; --require " + m.dim_name(dim) + "=" + noun(scope) + ")";
  }
  return std::nullopt;
}

void check_required(const Hosts& h, const std::vector<DeviceMesh>& meshes) {
  for (const Requirement& r : h.require) {
    bool found = false;
    for (const DeviceMesh& m : meshes) {
      for (int d = 0; d < m.ndim(); ++d) found = found || m.dim_name(d) == r.dim;
    }
    if (!found) throw InvalidArgument("--require " + quote_input(r.dim + "=" + noun(r.scope)) + ": no mesh has a dim named " + quote_input(r.dim));
  }
}

std::vector<std::string> violations(const Hosts& h, const std::vector<DeviceMesh>& meshes) {
  std::vector<std::string> out;
  for (const Requirement& r : h.require) {
    for (const DeviceMesh& m : meshes) {
      for (int d = 0; d < m.ndim(); ++d) {
        if (m.dim_name(d) != r.dim) continue;
        if (auto v = violation(m, d, h, r.scope)) out.push_back(*v);
      }
    }
  }
  return out;
}

}  // namespace meshsim::placement
