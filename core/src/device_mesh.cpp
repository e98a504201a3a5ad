#include "meshsim/device_mesh.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "checked_math.hpp"
#include "device_mesh_parts.hpp"
#include "flat_modes.hpp"
#include "rank_map.hpp"
#include "universe.hpp"

namespace meshsim {

using namespace mesh_detail;

DeviceMesh::DeviceMesh(std::shared_ptr<const Universe> u, Layout layout, MeshNames names,
                       bool is_root, std::vector<BackendConfig> configs)
    : DeviceMesh(std::move(u), layout, canonical_of(layout), std::move(names), is_root,
                 std::move(configs)) {}

DeviceMesh::DeviceMesh(std::shared_ptr<const Universe> u, Layout layout, Layout canonical,
                       MeshNames names, bool is_root, std::vector<BackendConfig> configs)
    : u_(std::move(u)),
      layout_(std::move(layout)),
      canonical_(std::move(canonical)),
      names_(std::move(names)),
      configs_(std::move(configs)),
      is_root_(is_root) {
  if (names_) {
    if (static_cast<int>(names_->size()) != layout_.rank()) {
      throw InvalidArgument("mesh has " + std::to_string(layout_.rank()) + " dims but " +
                            std::to_string(names_->size()) + " names " + py_list(*names_));
    }
    check_unique_names(*names_, "");
  }
  if (!tiles_rank_map(layout_, u_->rank_map.size())) {
    throw InvalidArgument("mesh layout " + meshsim::to_string(layout_) +
                          " does not tile the rank map of " +
                          std::to_string(u_->rank_map.size()) +
                          " ranks (its modes overlap or do not divide the positions evenly)");
  }
  std::size_t h = mix(std::hash<uint64_t>{}(u_->id), canonical_.hash());
  h = mix(h, names_ ? names_->size() + 1 : 0);
  if (names_) {
    for (const auto& n : *names_) h = mix(h, std::hash<std::string>{}(n));
  }
  hash_ = h;
}

// --- queries -------------------------------------------------------------------------------

const std::string& DeviceMesh::device_type() const { return u_->device_type; }

std::string DeviceMesh::dim_name(int dim) const {
  if (dim < 0 || dim >= ndim()) {
    throw OutOfRange("dim " + std::to_string(dim) + " is out of range [0, " +
                     std::to_string(ndim()) + ") for " + to_string());
  }
  return names_ ? (*names_)[static_cast<std::size_t>(dim)] : std::to_string(dim);
}

int DeviceMesh::dim_index(std::string_view name) const {
  if (!names_) {
    throw NotFound("No `mesh_dim_names` found: cannot look up dim " + quote_input(name) +
                   " in " + to_string());
  }
  for (std::size_t i = 0; i < names_->size(); ++i) {
    if ((*names_)[i] == name) return static_cast<int>(i);
  }
  throw NotFound("Mesh dimension " + quote_input(name) + " does not exist. Valid names are " +
                 py_list(*names_));
}

std::vector<int64_t> DeviceMesh::shape() const { return mesh_top_level_sizes(layout_); }
int64_t DeviceMesh::size() const { return meshsim::size(layout_); }
int64_t DeviceMesh::size(int dim) const {
  if (dim < 0 || dim >= ndim()) dim_name(dim);  // throws OutOfRange, worded once there
  return detail::size(detail::LayoutView(layout_).mode(dim));
}

DeviceMesh DeviceMesh::root() const {
  if (is_root_) return *this;
  return DeviceMesh(u_, u_->root_layout, u_->root_names, true, u_->root_configs);
}

std::optional<int64_t> DeviceMesh::world_size() const { return u_->world_size; }

std::vector<int64_t> DeviceMesh::rank_map() const {
  const int64_t n = u_->rank_map.size();
  if (n > kMaxEnumeration) {
    throw ResourceExhausted("rank_map: " + std::to_string(n) + " ranks exceed the limit of " +
                            std::to_string(kMaxEnumeration));
  }
  std::vector<int64_t> out(static_cast<std::size_t>(n));
  for (int64_t p = 0; p < n; ++p) out[static_cast<std::size_t>(p)] = u_->rank_map.at(p);
  return out;
}

int64_t DeviceMesh::rank_map_size() const { return u_->rank_map.size(); }
int64_t DeviceMesh::copies() const { return u_->rank_map.size() / size(); }
bool DeviceMesh::contains(int64_t rank) const { return u_->rank_map.position(rank).has_value(); }

DeviceMesh::Digits DeviceMesh::digits_of(int64_t position) const {
  Digits g{position, position, {}, leaves_by_stride(layout_)};
  for (const MeshLeaf& x : g.leaves) {
    const int64_t digit = (position / x.d) % x.s;
    g.digit.push_back(digit);
    g.base -= digit * x.d;
  }
  return g;
}

std::optional<std::vector<int64_t>> DeviceMesh::coordinate(int64_t rank) const {
  auto p = u_->rank_map.position(rank);
  if (!p) return std::nullopt;
  Digits g = digits_of(*p);
  std::vector<int64_t> c(static_cast<std::size_t>(ndim()), 0);
  for (std::size_t k = 0; k < g.leaves.size(); ++k) {
    c[static_cast<std::size_t>(g.leaves[k].dim)] += g.digit[k] * g.leaves[k].weight;
  }
  return c;
}

std::optional<int64_t> DeviceMesh::local_rank(int64_t rank, int dim) const {
  dim_name(dim);
  auto c = coordinate(rank);
  if (!c) return std::nullopt;
  return (*c)[static_cast<std::size_t>(dim)];
}

std::optional<MeshArray> DeviceMesh::mesh_for(int64_t rank) const {
  int64_t base = 0;
  if (auto p = u_->rank_map.position(rank)) {
    base = digits_of(*p).base;
  } else if (copies() != 1) {
    return std::nullopt;
  }
  MeshArray a;
  a.shape = shape();
  a.values = mesh_all_ranks_from_zero(layout_);
  for (int64_t& v : a.values) v = u_->rank_map.at(base + v);
  return a;
}

std::optional<std::vector<int64_t>> DeviceMesh::mesh_values(int64_t rank, int64_t first, int64_t count) const {
  if (first < 0 || count < 0) {
    throw OutOfRange("mesh_values: first " + std::to_string(first) + " and count " + std::to_string(count) +
                     " must not be negative");
  }
  int64_t base = 0;
  if (auto p = u_->rank_map.position(rank)) {
    base = digits_of(*p).base;
  } else if (copies() != 1) {
    return std::nullopt;
  }
  std::vector<int64_t> out;
  const int64_t end = first < size() ? first + std::min(count, size() - first) : first;
  for (int64_t i = first; i < end; ++i) out.push_back(u_->rank_map.at(base + mesh_rank_at(layout_, i)));
  return out;
}

std::optional<std::vector<int64_t>> DeviceMesh::group_of(int64_t rank, int dim) const {
  dim_name(dim);
  auto p = u_->rank_map.position(rank);
  if (!p) return std::nullopt;
  Digits g = digits_of(*p);
  int64_t base = *p;
  for (std::size_t k = 0; k < g.leaves.size(); ++k) {
    if (g.leaves[k].dim == dim) base -= g.digit[k] * g.leaves[k].d;
  }
  std::vector<int64_t> row = mesh_all_ranks_from_zero(layout_[dim]);
  for (int64_t& v : row) v = u_->rank_map.at(base + v);
  return row;
}

CacheStats DeviceMesh::cache_stats() const { return u_->stats(); }

std::vector<std::string> DeviceMesh::flattened_names() const {
  std::vector<std::string> out;
  for (const auto& f : u_->flattened()) out.push_back(f.name);
  return out;
}

std::vector<std::pair<std::string, Layout>> DeviceMesh::flattened() const {
  std::vector<std::pair<std::string, Layout>> out;
  for (const auto& f : u_->flattened()) out.emplace_back(f.name, f.layout);
  return out;
}

std::optional<int64_t> DeviceMesh::rank_map_start() const { return u_->rank_map.start(); }

uint64_t DeviceMesh::universe_id() const { return u_->id; }
const std::shared_ptr<const Universe>& DeviceMesh::universe() const { return u_; }

bool operator==(const DeviceMesh& a, const DeviceMesh& b) {
  return a.hash_ == b.hash_ && a.u_ == b.u_ && a.canonical_ == b.canonical_ &&
         a.names_ == b.names_;
}

bool equivalent(const DeviceMesh& a, const DeviceMesh& b) {
  if (a == b) return true;
  return a.u_->device_type == b.u_->device_type && a.names_ == b.names_ &&
         a.canonical_ == b.canonical_ && a.u_->rank_map == b.u_->rank_map;
}

std::string DeviceMesh::to_string() const {
  std::string dims = "(";
  auto sizes = shape();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i) dims += ", ";
    if (names_) dims += (*names_)[i] + "=";
    dims += std::to_string(sizes[i]);
  }
  dims += sizes.size() == 1 && !names_ ? ",)" : ")";
  // PyTorch's stride: a Python tuple of each dim's coalesced layout's strides, one int for one
  // mode, a tuple for several, () for a dim of size 1 (2.13's _FlatLayout drops size-1 modes).
  std::string strides = "(";
  for (int i = 0; i < ndim(); ++i) {
    if (i) strides += ", ";
    const Layout c = canonical_[i];
    if (meshsim::size(c) == 1) {
      strides += "()";
      continue;
    }
    const IntTuple sh = meshsim::flatten(c.shape()), st = meshsim::flatten(c.stride());
    std::vector<int64_t> kept;
    for (int k = 0; k < st.rank(); ++k) {
      if (sh[k].value() != 1) kept.push_back(st[k].value());
    }
    if (kept.size() == 1) {
      strides += std::to_string(kept.front());
    } else {
      strides += "(";
      for (std::size_t k = 0; k < kept.size(); ++k) strides += (k ? ", " : "") + std::to_string(kept[k]);
      strides += ")";
    }
  }
  strides += ndim() == 1 ? ",)" : ")";
  return "DeviceMesh(" + dims + ", '" + u_->device_type + "', stride=" + strides + ")";
}

}  // namespace meshsim
