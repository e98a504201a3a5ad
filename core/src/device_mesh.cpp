#include "meshsim/device_mesh.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <boost/container/small_vector.hpp>

#include "meshsim/algebra.hpp"
#include "checked_math.hpp"
#include "flat_modes.hpp"
#include "rank_map.hpp"
#include "universe.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

namespace {

std::size_t mix(std::size_t seed, std::size_t v) {
  return seed ^ (v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

std::string join(const std::vector<std::string>& v, std::string_view sep, bool quote) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += quote ? "'" + v[i] + "'" : v[i];
  }
  return out;
}

std::string py_tuple(const std::vector<std::string>& v) {
  return "(" + join(v, ", ", true) + (v.size() == 1 ? ",)" : ")");
}

std::string py_list(const std::vector<std::string>& v) { return "[" + join(v, ", ", true) + "]"; }

std::string int_list(std::span<const int64_t> v) {
  std::string out = "(";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (v.size() == 1 ? ",)" : ")");  // Python's tuple repr
}

void check_dims(std::size_t ndim, std::string_view what) {
  if (ndim > static_cast<std::size_t>(kMaxMeshDims)) {
    throw InvalidArgument(std::string(what) + ": " + std::to_string(ndim) +
                          " mesh dims exceed the limit of " + std::to_string(kMaxMeshDims));
  }
}

// check_utf8 refuses a name that is not UTF-8 text: every report, repr and saved file carries
// names as text (a Python bytes name would otherwise pass and break them later).
void check_utf8(std::string_view name, std::string_view what) {
  std::size_t i = 0;
  while (i < name.size()) {
    const auto c = static_cast<unsigned char>(name[i]);
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len != 0 && i + len <= name.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(name[i + k]) >> 6) == 0x2;
    if (ok && len > 1) {
      // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8 either.
      uint32_t cp = c & (0x7F >> len);
      for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(name[i + k]) & 0x3F);
      ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (!ok) {
      // The message itself must be text: bytes past ASCII are written as \xNN.
      std::string shown;
      for (const char b : name.substr(0, 64)) {
        const auto u = static_cast<unsigned char>(b);
        if (u >= 0x20 && u < 0x7F) {
          shown += b;
        } else {
          const char* hex = "0123456789abcdef";
          shown += std::string("\\x") + hex[u >> 4] + hex[u & 0xF];
        }
      }
      throw InvalidArgument(std::string(what) + " '" + shown + (name.size() > 64 ? "...'" : "'") +
                            " is not UTF-8 text (at byte " + std::to_string(i) + ")");
    }
    i += len;
  }
}

void check_unique_names(const std::vector<std::string>& names, std::string_view where) {
  check_dims(names.size(), "mesh_dim_names");
  for (const std::string& n : names) check_utf8(n, "mesh_dim_name");
  const auto twice = [&](std::string_view dup) {
    throw InvalidArgument("Each mesh_dim_name must be unique. " + quote_input(dup) +
                          " appears twice in " + py_list(names) + std::string(where));
  };
  // A mesh's few names: every pair (string == tests the lengths first, so most pairs cost one
  // comparison); a sort beyond, where the pairs would be many. Either way the message names the
  // smallest repeated name.
  if (names.size() <= 16) {
    const std::string* dup = nullptr;
    for (std::size_t i = 1; i < names.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (names[i] == names[j] && (!dup || names[i] < *dup)) dup = &names[i];
      }
    }
    if (dup) twice(*dup);
    return;
  }
  boost::container::small_vector<std::string_view, 16> sorted(names.begin(), names.end());
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) twice(*dup);
}

void check_device_type(const std::string& device_type) {
  const bool letters =
      !device_type.empty() && std::all_of(device_type.begin(), device_type.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      });
  if (!letters) {
    throw InvalidArgument("Device type with index is not supported but got '" + device_type +
                          "': the device type must be letters only (e.g. 'cuda', not 'cuda:0')");
  }
}

// MeshLeaf is one non-trivial leaf of a mesh layout: its size and stride over rank-map
// positions, its top-level dim, and its weight in the dim's row-major index.
struct MeshLeaf {
  int64_t s;
  int64_t d;
  int dim;
  int64_t weight;
};
using Leaves = detail::InlineVector<MeshLeaf, 16>;

// leaves_by_stride lists the leaves of size > 1, ordered by stride (ties keep mode order).
Leaves leaves_by_stride(const Layout& l) {
  Leaves out;
  const detail::LayoutView v(l);
  for (int dim = 0; dim < l.rank(); ++dim) {
    const detail::LayoutView m = v.mode(dim);
    int64_t w = 1;  // row-major inside the mode: the last leaf is fastest
    for (int i = m.span(); i-- > 0;) {
      if (m.s[i].arity != IntTuple::kLeaf) continue;
      const int64_t s = m.s[i].value;
      if (s != 1) out.push_back(MeshLeaf{s, m.d[i].value, dim, w});
      w *= s;  // bounded by size(l), checked at construction
    }
  }
  // Insertion sort (stable, no buffer) for a mesh's few leaves; std::stable_sort beyond.
  if (out.size() > 16) {
    std::stable_sort(out.begin(), out.end(),
                     [](const MeshLeaf& a, const MeshLeaf& b) { return a.d < b.d; });
    return out;
  }
  for (std::size_t i = 1; i < out.size(); ++i) {
    const MeshLeaf x = out[i];
    std::size_t j = i;
    for (; j > 0 && x.d < out[j - 1].d; --j) out[j] = out[j - 1];
    out[j] = x;
  }
  return out;
}

// tiles_rank_map is whether copies of `l` tile positions [0, n) exactly: the sorted strides
// form a mixed radix (each stride a multiple of the span below it) that divides n. Every mesh
// derived from a root by slicing, flattening, unflattening or concatenating has this form;
// coordinates are then digits, found in O(ndim).
bool tiles_rank_map(const Layout& l, int64_t n) {
  int64_t span = 1;
  for (const MeshLeaf& x : leaves_by_stride(l)) {
    if (x.d < span || x.d % span != 0) return false;
    const std::optional<int64_t> next = try_mul(x.d, x.s);
    if (!next) return false;
    span = *next;
  }
  return n % span == 0;
}

// Layout::rank() == 1 with a scalar shape still counts as one mode; canonical gives every mode
// its coalesced form so identity never depends on int-vs-tuple spelling.
// Written in one pass from views; coalescing keeps each mode's size and cosize, so the result
// is valid by construction.
Layout canonical_of(const Layout& l) {
  const detail::LayoutView v(l);
  if (!v.is_leaf() && v.span() == v.rank() + 1) {
    // Every mode a leaf (a root's row-major layout, most slices): a leaf coalesces to itself,
    // or to 1:0 when its size is 1, so the canonical form is a copy with those strides zeroed.
    Layout out = l;
    auto& d = detail::NodeAccess::nodes(detail::NodeAccess::stride(out));
    for (int i = 1; i < v.span(); ++i) {
      if (v.s[i].value == 1) d[static_cast<std::size_t>(i)].value = 0;
    }
    return out;
  }
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  detail::Leaves m;
  b.open();
  for (int i = 0; i < l.rank(); ++i) {
    detail::coalesce_into(v.mode(i), Convention::kTorch, m);
    detail::emit_flat(b, m, Convention::kTorch);
  }
  b.close();
  return out;
}

// canonical_after_unflatten is canonical_of(layout) for a layout whose modes [dim, dim + count)
// replaced mode dim of a mesh whose canonical layout is `canonical`: the untouched modes keep
// their canonical form, only the new ones are coalesced.
Layout canonical_after_unflatten(const Layout& canonical, const Layout& layout, int dim, int count) {
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  detail::Leaves m;
  b.open();
  detail::LayoutView cm = detail::LayoutView(canonical).mode(0);
  detail::LayoutView lm = detail::LayoutView(layout).mode(0);
  const auto next = [](detail::LayoutView v) { return detail::LayoutView(v.s + v.span(), v.d + v.span()); };
  for (int i = 0; i < canonical.rank(); ++i, cm = next(cm)) {
    if (i != dim) {
      b.append(cm);
      if (i < dim) lm = next(lm);
      continue;
    }
    for (int k = 0; k < count; ++k, lm = next(lm)) {
      detail::coalesce_into(lm, Convention::kTorch, m);
      detail::emit_flat(b, m, Convention::kTorch);
    }
  }
  b.close();
  return out;
}

}  // namespace

namespace {

const BackendConfig& default_config() {
  static const BackendConfig c;
  return c;
}

std::vector<BackendConfig> checked_configs(std::vector<BackendConfig> configs, int ndim) {
  if (!configs.empty() && static_cast<int>(configs.size()) != ndim) {
    throw InvalidArgument("backend_override should have the same length as the number of mesh "
                          "dimensions, but got " + std::to_string(configs.size()) + " and " +
                          std::to_string(ndim) + ".");
  }
  return configs;
}

Layout row_major(std::span<const int64_t> shape, const char* what) {
  if (shape.empty()) throw InvalidArgument(std::string(what) + ": the mesh shape must not be empty");
  check_dims(shape.size(), what);
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 1) {
      throw InvalidArgument(std::string(what) + ": mesh size " + std::to_string(s) + " in " +
                            int_list(shape) + " is not >= 1");
    }
    n = checked_mul(n, s, "mesh size");
  }
  // (shape):(suffix products), written once: sizes >= 1 and a checked product make it valid
  // by construction (its cosize is its size), and every suffix product is at most n.
  detail::InlineVector<int64_t, 16> stride(shape.size(), 0);
  int64_t suffix = 1;
  for (std::size_t k = shape.size(); k-- > 0;) {
    stride[k] = suffix;
    suffix *= shape[k];
  }
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  b.open();
  for (std::size_t k = 0; k < shape.size(); ++k) b.leaf(shape[k], stride[k]);
  b.close();
  return out;
}

void check_root_names(const MeshNames& names, std::size_t ndim) {
  if (!names) return;
  check_unique_names(*names, "");
  if (names->size() != ndim) {
    throw InvalidArgument("mesh_shape and mesh_dim_names should have same length! Got " +
                          std::to_string(ndim) + " sizes and names " + py_list(*names));
  }
}

void check_world(std::optional<int64_t> world, int64_t n) {
  if (!world) return;
  if (*world < 1) throw InvalidArgument("world size " + std::to_string(*world) + " is not >= 1");
  if (n > *world) {
    throw InvalidArgument("Mesh should not be bigger than default world size " +
                          std::to_string(*world) + ", but found " + std::to_string(n) + " ranks!");
  }
}

}  // namespace

struct DeviceMesh::Digits {
  int64_t position;
  int64_t base;  // position of the copy's first element
  boost::container::small_vector<int64_t, 16> digit;  // per leaf of leaves_by_stride
  Leaves leaves;
};

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

// make_root is the one way a root is built (init_device_mesh and DeviceMesh(mesh)): names,
// device, a row-major layout of `shape`, the world, the configs, then the rank map — the
// identity run when `ranks` is null, else the given ranks, checked.
DeviceMesh DeviceMesh::make_root(const char* what, std::span<const int64_t> shape,
                                 const std::span<const int64_t>* ranks, MeshNames names,
                                 RootOptions options) {
  check_root_names(names, shape.size());
  check_device_type(options.device_type);
  Layout layout = row_major(shape, what);
  const int64_t n = meshsim::size(layout);
  if (ranks && n != static_cast<int64_t>(ranks->size())) {
    throw InvalidArgument(std::string(what) + ": shape " + int_list(shape) + " holds " +
                          std::to_string(n) + " ranks but " + std::to_string(ranks->size()) +
                          " were given");
  }
  check_world(options.world_size, n);
  auto configs = checked_configs(std::move(options.backend_override), layout.rank());
  RankMap map = ranks ? RankMap::explicit_ranks(*ranks, options.world_size) : RankMap::affine(0, n);
  auto u = std::make_shared<const Universe>(options.device_type, options.world_size, std::move(map),
                                            layout, names, configs, options.init_backend,
                                            std::move(options.default_backend));
  return DeviceMesh(std::move(u), layout, std::move(names), true, configs);
}

DeviceMesh DeviceMesh::init(std::span<const int64_t> shape, MeshNames names, RootOptions options) {
  return make_root("init_device_mesh", shape, nullptr, std::move(names), std::move(options));
}

DeviceMesh DeviceMesh::init(std::initializer_list<int64_t> shape, MeshNames names,
                            RootOptions options) {
  return init(std::span<const int64_t>(shape.begin(), shape.size()), std::move(names),
              std::move(options));
}

DeviceMesh DeviceMesh::from_ranks(std::span<const int64_t> shape, std::span<const int64_t> ranks,
                                  MeshNames names, RootOptions options) {
  return make_root("DeviceMesh", shape, &ranks, std::move(names), std::move(options));
}

DeviceMesh DeviceMesh::from_group(std::span<const int64_t> group_ranks, MeshNames names,
                                  RootOptions options) {
  if (group_ranks.empty()) {
    throw InvalidArgument("from_group: Expects at least one ProcessGroup to be passed (the group "
                          "has no ranks)");
  }
  const int64_t n = static_cast<int64_t>(group_ranks.size());
  return from_ranks(std::span<const int64_t>(&n, 1), group_ranks, std::move(names),
                    std::move(options));
}

namespace {
// nested_text is a mesh argument as Python prints a nested list: [[0, 1], [2, 3]].
std::string nested_text(const MeshArray& m) {
  std::size_t pos = 0;
  auto rec = [&](auto&& self, std::size_t dim) -> std::string {
    std::string out = "[";
    for (int64_t i = 0; i < m.shape[dim]; ++i) {
      if (i) out += ", ";
      out += dim + 1 == m.shape.size() ? std::to_string(m.values[pos++]) : self(self, dim + 1);
    }
    return out + "]";
  };
  return m.shape.empty() ? "[]" : rec(rec, 0);
}
std::string py_ints(std::span<const int64_t> v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}
}  // namespace

DeviceMesh DeviceMesh::from_group(std::span<const std::vector<int64_t>> groups, bool is_list,
                                  const std::optional<MeshArray>& mesh, MeshNames names,
                                  std::optional<int64_t> rank, RootOptions options) {
  if (!is_list) {
    if (groups.size() != 1) throw InvalidArgument("from_group: one group, or a list of groups");
    const std::vector<int64_t>& g = groups.front();
    if (mesh && (mesh->shape.size() != 1 || mesh->values != g)) {
      throw InvalidArgument("Invalid mesh " + nested_text(*mesh) + " for ProcessGroup with ranks " + py_ints(g));
    }
    return from_group(g, std::move(names), std::move(options));
  }
  if (groups.empty()) throw InvalidArgument("Expects at least one ProcessGroup to be passed");
  if (!mesh) throw InvalidArgument("Must pass mesh if passing multiple ProcessGroups");
  if (!names) throw InvalidArgument("Must pass mesh_dim_names if passing multiple ProcessGroups");
  if (mesh->shape.size() != groups.size()) {
    throw InvalidArgument("Expects mesh with ndim equal to number of ProcessGroups but got mesh " +
                          nested_text(*mesh) + " and " + std::to_string(groups.size()) + " ProcessGroups");
  }
  if (!rank) {
    // The rank whose groups these are: the one rank every group holds.
    std::vector<int64_t> common = groups.front();
    std::sort(common.begin(), common.end());
    for (const std::vector<int64_t>& g : groups) {
      std::vector<int64_t> sorted = g, keep;
      std::sort(sorted.begin(), sorted.end());
      std::set_intersection(common.begin(), common.end(), sorted.begin(), sorted.end(), std::back_inserter(keep));
      common = std::move(keep);
    }
    if (common.size() != 1) {
      throw InvalidArgument("from_group: the " + std::to_string(groups.size()) + " groups share " +
                            std::to_string(common.size()) + " ranks, not exactly one; give the rank whose groups they are");
    }
    rank = common.front();
  }
  return from_groups(groups, mesh->shape, mesh->values, *names, *rank, std::move(options));
}

DeviceMesh DeviceMesh::from_groups(std::span<const std::vector<int64_t>> groups,
                                   std::span<const int64_t> shape, std::span<const int64_t> ranks,
                                   std::vector<std::string> names, int64_t rank,
                                   RootOptions options) {
  if (groups.empty()) throw InvalidArgument("from_groups: Expects at least one ProcessGroup");
  if (shape.size() != groups.size()) {
    throw InvalidArgument("from_groups: Expects mesh with ndim equal to number of ProcessGroups "
                          "but got a mesh of shape " + int_list(shape) + " and " +
                          std::to_string(groups.size()) + " ProcessGroups");
  }
  DeviceMesh mesh = from_ranks(shape, ranks, std::move(names), std::move(options));
  if (!mesh.contains(rank)) {
    throw InvalidArgument("from_groups: rank " + std::to_string(rank) +
                          " is not in the mesh, so its groups cannot be checked");
  }
  for (int d = 0; d < mesh.ndim(); ++d) {
    std::vector<int64_t> want = *mesh.group_of(rank, d);
    std::vector<int64_t> got = groups[static_cast<std::size_t>(d)];
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    if (want != got) {
      throw InvalidArgument("from_groups: the group given for dim " + mesh.dim_name(d) + " is " +
                            int_list(groups[static_cast<std::size_t>(d)]) + " but rank " +
                            std::to_string(rank) + "'s group along that dim in the mesh is " +
                            int_list(*mesh.group_of(rank, d)));
    }
  }
  return mesh;
}

DeviceMesh DeviceMesh::from_layout(const DeviceMesh& root, const Layout& layout, MeshNames names) {
  if (!root.is_root()) throw InvalidArgument("from_layout: the first argument must be a root mesh");
  std::vector<BackendConfig> configs;
  if (layout == root.layout_ && names == root.names_) return root;
  return DeviceMesh(root.u_, layout, std::move(names), false, configs);
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

namespace {
// table_of lists every group of a dim layout over the rank map's positions, as global ranks, in
// one buffer.
GroupTable table_of(const Universe& u, const Layout& dim_layout) {
  GroupTable t = mesh_group_table(dim_layout, u.rank_map.size());
  for (int64_t& v : t.ranks) v = u.rank_map.at(v);
  return t;
}

std::vector<std::vector<int64_t>> rows_of(const GroupTable& t) {
  std::vector<std::vector<int64_t>> rows;
  rows.reserve(static_cast<std::size_t>(t.count));
  for (int64_t g = 0; g < t.count; ++g) rows.emplace_back(t.row(g).begin(), t.row(g).end());
  return rows;
}
}  // namespace

GroupRecord::GroupRecord(std::string n, Layout l, BackendConfig c,
                         std::function<GroupTable()> list_rows)
    : name(std::move(n)), layout(std::move(l)), config(std::move(c)), list_rows_(std::move(list_rows)) {}

const GroupTable& GroupRecord::table() const {
  std::call_once(table_once_, [&] { table_ = list_rows_(); });
  return table_;
}

const std::vector<std::vector<int64_t>>& GroupRecord::rows() const {
  std::call_once(rows_once_, [&] { rows_ = rows_of(table()); });
  return rows_;
}

std::vector<std::vector<int64_t>> DeviceMesh::groups(int dim) const {
  return rows_of(group_table(dim));
}

GroupTable DeviceMesh::group_table(int dim) const {
  dim_name(dim);
  return table_of(*u_, layout_[dim]);
}

GroupTable DeviceMesh::group_table_prefix(int dim, int64_t max_groups, int64_t max_members) const {
  dim_name(dim);
  GroupTable t = mesh_group_table_prefix(layout_[dim], u_->rank_map.size(), max_groups, max_members);
  for (int64_t& v : t.ranks) v = u_->rank_map.at(v);
  return t;
}

const BackendConfig& DeviceMesh::backend_config(int dim) const {
  dim_name(dim);
  return configs_.empty() ? default_config() : configs_[static_cast<std::size_t>(dim)];
}

std::shared_ptr<const GroupRecord> DeviceMesh::group_record(int dim) const {
  return group_record(dim, backend_config(dim));
}

std::shared_ptr<const GroupRecord> DeviceMesh::group_record(int dim,
                                                            const BackendConfig& config) const {
  dim_name(dim);
  return u_->find_or_create_group(canonical_[dim], config, [&] {
    // The record holds its universe weakly (the universe's cache holds the record).
    std::weak_ptr<const Universe> weak = u_;
    Layout dim_layout = canonical_[dim];
    return std::make_shared<GroupRecord>(
        "group[" + meshsim::to_string(canonical_[dim]) + "]@" + config.to_string(), canonical_[dim],
        config, [weak, dim_layout] {
          std::shared_ptr<const Universe> u = weak.lock();
          if (!u) {
            throw FailedPrecondition("GroupRecord::rows: every mesh of this record's root is gone");
          }
          return table_of(*u, dim_layout);
        });
  });
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
  return "DeviceMesh(" + dims + ", '" + u_->device_type + "', stride=" +
         meshsim::to_string(layout_.stride()) + ")";
}

// --- transformations -----------------------------------------------------------------------

DeviceMesh DeviceMesh::slice(std::string_view name) const {
  std::string n(name);
  return slice(std::span<const std::string>(&n, 1));
}

DeviceMesh DeviceMesh::slice(std::initializer_list<std::string> names) const {
  return slice(std::span<const std::string>(names.begin(), names.size()));
}

DeviceMesh DeviceMesh::slice(std::span<const std::string> requested) const {
  if (!names_) {
    throw FailedPrecondition("Cannot slice a DeviceMesh without mesh_dim_names! (" + to_string() +
                             ")");
  }
  std::vector<std::string> want(requested.begin(), requested.end());
  if (want.empty()) throw InvalidArgument("slice: no mesh_dim_names requested");
  check_dims(want.size(), "slice");
  if (want == *names_) return *this;
  // Each selected dim as views of its layout and canonical form (own dims: this mesh's modes;
  // flattened names: the registration's), joined once below.
  struct Part {
    detail::LayoutView layout;
    detail::LayoutView canonical;
  };
  boost::container::small_vector<Part, 8> parts;
  std::vector<Universe::Flattened> flats;  // keeps the registrations the views point into
  std::vector<BackendConfig> configs;
  const detail::LayoutView own_layout(layout_);
  const detail::LayoutView own_canonical(canonical_);
  for (const std::string& n : want) {
    auto own = std::find(names_->begin(), names_->end(), n);
    if (own != names_->end()) {
      const int i = static_cast<int>(own - names_->begin());
      parts.push_back(Part{own_layout.mode(i), own_canonical.mode(i)});
      configs.push_back(backend_config(i));
      continue;
    }
    if (is_root_) {
      if (std::optional<Universe::Flattened> flat = u_->find_flattened(n)) {
        if (flats.empty()) flats.reserve(want.size());  // no reallocation: views stay valid
        flats.push_back(std::move(*flat));
        parts.push_back(Part{detail::LayoutView(flats.back().layout),
                             detail::LayoutView(flats.back().canonical).mode(0)});
        configs.push_back(flats.back().config);
        continue;
      }
    }
    std::vector<std::string> valid = *names_;
    if (is_root_) {
      for (const auto& f : u_->flattened()) valid.push_back(f.name);
    }
    throw NotFound("Invalid mesh_dim_names " + py_tuple(want) +
                   " specified. Valid mesh_dim_names are " + py_list(valid) + ".");
  }
  int64_t prev = -1;
  for (std::size_t k = parts.size(); k-- > 0;) {
    const detail::LayoutView m = parts[k].layout;
    if (!m.is_leaf()) {
      throw InvalidArgument(
          "Currently, this only allows slicing out a contiguous flattened dim. ('" + want[k] +
          "' has the non-contiguous layout " + meshsim::to_string(m.copy()) + ")");
    }
    const int64_t stride = m.d->value;
    if (stride < prev) {
      throw InvalidArgument("Invalid mesh_dim_names " + py_tuple(want) +
                            " specified. Mesh dim indices should be in ascending order (stride " +
                            std::to_string(stride) + " of '" + want[k] + "' is below stride " +
                            std::to_string(prev) + " of the dim after it).");
    }
    prev = stride;
  }
  Layout joined = detail::NodeAccess::blank();
  Layout canonical = detail::NodeAccess::blank();
  {
    detail::LayoutBuilder j(joined);
    detail::LayoutBuilder c(canonical);
    j.open();
    c.open();
    for (const Part& p : parts) {
      j.append(p.layout);
      c.append(p.canonical);
    }
    j.close();
    c.close();
  }
  detail::check_layout(joined);
  if (!mesh_check_non_overlap(joined)) {
    throw InvalidArgument("Slicing overlapping dim_names " + py_tuple(want) +
                          " is not allowed (their layouts overlap in " +
                          meshsim::to_string(joined) + ").");
  }
  return DeviceMesh(u_, std::move(joined), std::move(canonical), std::move(want), false,
                    std::move(configs));
}

DeviceMesh DeviceMesh::flatten(std::optional<std::string> name,
                               std::optional<BackendConfig> config) const {
  if (!names_) {
    throw FailedPrecondition("Cannot flatten a DeviceMesh without mesh_dim_names! (" +
                             to_string() + ")");
  }
  const std::string flat_name = name ? *name : join(*names_, "_", false);
  if (flat_name.empty()) throw InvalidArgument("flatten: the mesh_dim_name must not be empty");
  check_utf8(flat_name, "flatten: mesh_dim_name");
  if (ndim() == 1 && flat_name == (*names_)[0]) return *this;
  if (u_->root_names) {
    const auto& rn = *u_->root_names;
    if (std::find(rn.begin(), rn.end(), flat_name) != rn.end()) {
      throw AlreadyExists(flat_name + " already exists for submesh of the " + root().to_string() +
                          ". The mesh_dim_names of submesh and flattened mesh are " +
                          py_tuple(*names_) + " and ('" + flat_name + "',).");
    }
  }
  const Layout flat = mesh_flatten(layout_);
  // The registry keeps the first layout written under a name; the same canonical layout
  // returns it, another one throws AlreadyExists.
  Universe::Flattened reg = u_->register_flatten(flat_name, flat, canonical_of(flat), config);
  BackendConfig cfg = std::move(reg.config);
  return DeviceMesh(u_, std::move(reg.layout), std::move(reg.canonical),
                    std::vector<std::string>{flat_name}, false, {cfg});
}

DeviceMesh DeviceMesh::unflatten(std::string_view dim, std::span<const int64_t> sizes,
                                 std::span<const std::string> names) const {
  if (!names_) {
    // The same condition and class as unflatten by index (and as slice and flatten).
    throw FailedPrecondition("Cannot unflatten a DeviceMesh without mesh_dim_names! (" +
                             to_string() + ")");
  }
  if (std::find(names_->begin(), names_->end(), dim) == names_->end()) {
    throw NotFound("dim " + std::string(dim) + " specified in `_unflatten` is not in " +
                   py_tuple(*names_) + ".");
  }
  return unflatten(dim_index(dim), sizes, names);
}

DeviceMesh DeviceMesh::unflatten(int64_t dim, std::span<const int64_t> sizes,
                                 std::span<const std::string> names) const {
  if (dim >= ndim() || dim < 0) {
    throw OutOfRange("dim " + std::to_string(dim) + " specified in `_unflatten` is out of range " +
                     std::to_string(ndim()) + (dim < 0 ? " (negative dims are not accepted)" : ""));
  }
  if (!names_) {
    throw FailedPrecondition("Cannot unflatten a DeviceMesh without mesh_dim_names! (" +
                             to_string() + ")");
  }
  if (names.size() != sizes.size()) {
    throw InvalidArgument("mesh_dim_names must have same length as mesh_sizes in _unflatten! Got " +
                          std::to_string(names.size()) + " names and sizes " + int_list(sizes));
  }
  if (sizes.empty()) throw InvalidArgument("_unflatten: mesh_sizes must not be empty");
  check_dims(sizes.size() + static_cast<std::size_t>(ndim()) - 1, "_unflatten");
  int64_t product = 1;
  for (int64_t s : sizes) {
    if (s < 1) {
      throw InvalidArgument("_unflatten: mesh size " + std::to_string(s) + " in " +
                            int_list(sizes) + " is not >= 1");
    }
    product = checked_mul(product, s, "_unflatten: product of mesh_sizes");
  }
  const int d = static_cast<int>(dim);
  if (product != size(d)) {
    throw InvalidArgument("The product of mesh_sizes=" + int_list(sizes) + " is " +
                          std::to_string(product) + ", but the original dimension at dim=" +
                          std::to_string(dim) + " has size " + std::to_string(size(d)) +
                          ". These must be equal for unflatten to work correctly.");
  }
  std::vector<std::string> new_names(names_->begin(), names_->begin() + d);
  new_names.insert(new_names.end(), names.begin(), names.end());
  new_names.insert(new_names.end(), names_->begin() + d + 1, names_->end());
  check_unique_names(new_names, " after _unflatten");
  std::vector<BackendConfig> configs;
  if (!configs_.empty()) {
    configs.assign(configs_.begin(), configs_.begin() + d);
    configs.insert(configs.end(), sizes.size(), BackendConfig{});
    configs.insert(configs.end(), configs_.begin() + d + 1, configs_.end());
  }
  Layout layout = mesh_unflatten(layout_, dim, sizes);
  Layout canonical = canonical_after_unflatten(canonical_, layout, d, static_cast<int>(sizes.size()));
  return DeviceMesh(u_, std::move(layout), std::move(canonical), std::move(new_names), false,
                    std::move(configs));
}

DeviceMesh DeviceMesh::with_backend_configs(std::vector<BackendConfig> configs) const {
  return DeviceMesh(u_, layout_, names_, is_root_, checked_configs(std::move(configs), ndim()));
}

DeviceMesh DeviceMesh::transpose(std::span<const int> order) const {
  std::vector<bool> seen(static_cast<std::size_t>(ndim()), false);
  bool identity = static_cast<int>(order.size()) == ndim();
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int d = order[i];
    if (d < 0 || d >= ndim() || seen[static_cast<std::size_t>(d)] || static_cast<int>(order.size()) != ndim()) {
      throw InvalidArgument("transpose: " + int_list(std::vector<int64_t>(order.begin(), order.end())) +
                            " is not a permutation of the " + std::to_string(ndim()) + " dims of " + to_string());
    }
    seen[static_cast<std::size_t>(d)] = true;
    identity = identity && d == static_cast<int>(i);
  }
  if (order.size() != static_cast<std::size_t>(ndim())) {
    throw InvalidArgument("transpose: " + int_list(std::vector<int64_t>(order.begin(), order.end())) +
                          " is not a permutation of the " + std::to_string(ndim()) + " dims of " + to_string());
  }
  if (identity) return *this;
  std::vector<Layout> modes;
  std::vector<std::string> names;
  std::vector<BackendConfig> configs;
  for (int d : order) {
    modes.push_back(layout_[d]);
    if (names_) names.push_back((*names_)[static_cast<std::size_t>(d)]);
    if (!configs_.empty()) configs.push_back(configs_[static_cast<std::size_t>(d)]);
  }
  MeshNames out_names;
  if (names_) out_names = std::move(names);
  return DeviceMesh(u_, make_layout(std::span<const Layout>(modes.data(), modes.size())), std::move(out_names), false,
                    std::move(configs));
}

DeviceMesh DeviceMesh::transpose(std::span<const std::string> order) const {
  if (!names_) {
    throw FailedPrecondition("Cannot transpose a DeviceMesh by names without mesh_dim_names! (" + to_string() + ")");
  }
  std::vector<int> idx;
  for (const std::string& n : order) {
    auto it = std::find(names_->begin(), names_->end(), n);
    if (it == names_->end()) {
      throw NotFound("transpose: " + quote_input(n) + " is not a dim of " + to_string() +
                     "; valid mesh_dim_names are " + py_tuple(*names_));
    }
    idx.push_back(static_cast<int>(it - names_->begin()));
  }
  return transpose(std::span<const int>(idx.data(), idx.size()));
}

DeviceMesh DeviceMesh::reshape(std::span<const int64_t> sizes, std::span<const std::string> names) const {
  // The flattened layout, without registering a name on the root (unlike flatten).
  const Layout flat = mesh_flatten(layout_);
  const DeviceMesh one(u_, flat, canonical_of(flat), std::vector<std::string>{"reshape"}, false, {});
  return one.unflatten(0, sizes, names);
}

bool DeviceMesh::init_backend() const { return u_->init_backend; }
const std::string& DeviceMesh::default_backend() const { return u_->default_backend; }

GroupHandle DeviceMesh::get_group(int64_t rank) const {
  if (!u_->init_backend) throw FailedPrecondition("DeviceMesh process groups not initialized!");
  if (ndim() > 1) {
      throw FailedPrecondition("Found the DeviceMesh have " + std::to_string(ndim()) +
                               " dimensions. Optional kwarg `mesh_dim` needs to be specified when "
                               "device_mesh.ndim > 1. If you want to get the list of all the ProcessGroups in "
                               "the DeviceMesh, please use `get_all_groups()` instead.");
  }
  return get_group(rank, 0);
}

GroupHandle DeviceMesh::get_group(int64_t rank, int d) const {
  if (!u_->init_backend) throw FailedPrecondition("DeviceMesh process groups not initialized!");
  const std::optional<int> dim = d;
  if (*dim < 0 || *dim >= ndim()) {
    throw OutOfRange("get_group: mesh_dim " + std::to_string(*dim) + " is out of range [0, " +
                     std::to_string(ndim()) + ") of " + to_string());
  }
  std::optional<std::vector<int64_t>> ranks = group_of(rank, *dim);
  if (!ranks) {
    throw FailedPrecondition("get_group: rank " + std::to_string(rank) + " is not in " + to_string() +
                             " (a rank outside the mesh has no groups)");
  }
  GroupHandle h;
  h.ranks = std::move(*ranks);
  h.config = backend_config(*dim);
  h.backend = h.config.backend.empty() ? u_->default_backend : h.config.backend;
  h.group_desc = names_ ? "mesh_" + (*names_)[static_cast<std::size_t>(*dim)] : "mesh_dim_" + std::to_string(*dim);
  h.record = group_record(*dim);
  return h;
}

GroupHandle DeviceMesh::get_group(int64_t rank, std::string_view dim) const {
  if (!u_->init_backend) throw FailedPrecondition("DeviceMesh process groups not initialized!");
  const bool own = names_ && std::find(names_->begin(), names_->end(), dim) != names_->end();
  if (!own) {
    // PyTorch looks a name up in the root's flatten mapping first (root.get_group("dp_cp")).
    if (std::optional<Universe::Flattened> f = u_->find_flattened(std::string(dim))) {
      const DeviceMesh flat(u_, f->layout, f->canonical, std::vector<std::string>{f->name}, false, {f->config});
      return flat.get_group(rank, 0);
    }
    if (!names_) throw FailedPrecondition("No `mesh_dim_names` found. (" + to_string() + ")");
    throw NotFound("Mesh dimension '" + std::string(dim) + "' does not exist. Available mesh dimensions are: "
                   "mesh_dim_names=" + py_tuple(*names_));
  }
  return get_group(rank, dim_index(dim));
}

std::vector<GroupHandle> DeviceMesh::get_all_groups(int64_t rank) const {
  std::vector<GroupHandle> out;
  for (int d = 0; d < ndim(); ++d) out.push_back(get_group(rank, d));
  return out;
}

DeviceMesh DeviceMesh::concatenate(std::span<const DeviceMesh> meshes) {
  if (meshes.empty()) throw InvalidArgument("concatenate: needs at least one mesh");
  const DeviceMesh& first = meshes.front();
  std::vector<Layout> modes;
  std::vector<std::string> names;
  std::vector<BackendConfig> configs;
  bool any_config = false;
  std::size_t total_dims = 0;
  for (const DeviceMesh& m : meshes) total_dims += static_cast<std::size_t>(m.ndim());
  check_dims(total_dims, "concatenate");
  for (const DeviceMesh& m : meshes) {
    if (m.u_ != first.u_) {
      throw InvalidArgument("Cannot concatenate DeviceMeshes derived from different device meshs: " +
                            first.to_string() + " (universe " + std::to_string(first.u_->id) +
                            ") and " + m.to_string() + " (universe " + std::to_string(m.u_->id) +
                            ")");
    }
    if (m.names_.has_value() != first.names_.has_value()) {
      throw InvalidArgument("concatenate: " + first.to_string() + " and " + m.to_string() +
                            " mix named and unnamed meshes");
    }
    for (int i = 0; i < m.ndim(); ++i) {
      modes.push_back(m.layout_[i]);
      configs.push_back(m.backend_config(i));
      any_config = any_config || !m.configs_.empty();
    }
    if (m.names_) names.insert(names.end(), m.names_->begin(), m.names_->end());
  }
  Layout joined = make_layout(std::span<const Layout>(modes.data(), modes.size()));
  if (!mesh_check_non_overlap(joined)) {
    std::vector<std::string> reprs;
    for (const DeviceMesh& m : meshes) reprs.push_back(m.to_string());
    throw InvalidArgument("Cannot concatenate overlapping meshes: [" + join(reprs, ", ", false) +
                          "] (joined layout " + meshsim::to_string(joined) + ")");
  }
  if (first.names_) check_unique_names(names, " after concatenate");
  if (!any_config) configs.clear();
  MeshNames out_names;
  if (first.names_) out_names = std::move(names);
  return DeviceMesh(first.u_, std::move(joined), std::move(out_names), false, std::move(configs));
}

}  // namespace meshsim
