// device_mesh_parts.hpp (core-private) — what the files of DeviceMesh share: the checks of its
// arguments and names, the text helpers of its messages, its canonical form, and the digits of
// a rank-map position. DeviceMesh is one type written in several files, one per concept:
//
//   device_mesh.cpp            the value: construction, equality, hashing, queries, to_string
//   device_mesh_roots.cpp      roots: init, from_ranks, from_group(s), from_layout
//   device_mesh_views.cpp      views: slice, flatten, unflatten, transpose, reshape, concatenate
//   device_mesh_groups.cpp     groups: group tables and records, get_group, handles
//   device_mesh_canonical.cpp  the canonical layout (each dim coalesced) and rank-map tiling
//   device_mesh_checks.cpp     argument and name checks, message text helpers
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "meshsim/device_mesh.hpp"
#include "meshsim/inline_vector.hpp"

namespace meshsim {
namespace mesh_detail {

// Text of messages: mix combines hashes; join, py_tuple ("('a', 'b')"), py_list ("['a', 'b']")
// and int_list ("[1, 2]") write values as PyTorch's messages do.
std::size_t mix(std::size_t seed, std::size_t v);
std::string join(const std::vector<std::string>& v, std::string_view sep, bool quote);
std::string py_tuple(const std::vector<std::string>& v);
std::string py_list(const std::vector<std::string>& v);
std::string int_list(std::span<const int64_t> v);

// Checks of arguments, each throwing InvalidArgument (or OutOfRange) naming the value and the rule.
void check_dims(std::size_t ndim, std::string_view what);
void check_utf8(std::string_view name, std::string_view what);
void check_unique_names(const std::vector<std::string>& names, std::string_view where);
void check_device_type(const std::string& device_type);
const BackendConfig& default_config();
std::vector<BackendConfig> checked_configs(std::vector<BackendConfig> configs, int ndim);
Layout row_major(std::span<const int64_t> shape, const char* what);
void check_root_names(const MeshNames& names, std::size_t ndim);
void check_world(std::optional<int64_t> world, int64_t n);

// MeshLeaf is one non-trivial leaf of a mesh layout: its size and stride over rank-map
// positions, its top-level dim, and its weight in the dim's row-major index.
struct MeshLeaf {
  int64_t s;
  int64_t d;
  int dim;
  int64_t weight;
};
using Leaves = detail::InlineVector<MeshLeaf, 16>;

// The canonical form and rank-map tiling (device_mesh_canonical.cpp).
Leaves leaves_by_stride(const Layout& l);
bool tiles_rank_map(const Layout& l, int64_t n);
Layout canonical_of(const Layout& l);
Layout canonical_after_unflatten(const Layout& canonical, const Layout& layout, int dim, int count);

}  // namespace mesh_detail

struct DeviceMesh::Digits {
  int64_t position;
  int64_t base;  // position of the copy's first element
  boost::container::small_vector<int64_t, 16> digit;  // per leaf of leaves_by_stride
  mesh_detail::Leaves leaves;
};

}  // namespace meshsim
