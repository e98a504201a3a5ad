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
  // PyTorch 2.13's checks, in its order (device_mesh.py, _get_slice_mesh_layout): the slice's
  // layout collapsed (every dim's modes flattened and coalesced, torch convention: size-1
  // modes gone) must have its strides in descending order, else KeyError; then be orthogonal,
  // else RuntimeError. A non-contiguous flattened dim passes where its modes keep that order.
  const Layout collapsed =
      coalesce(Layout(meshsim::flatten(joined.shape()), meshsim::flatten(joined.stride())), Convention::kTorch);
  const IntTuple strides = meshsim::flatten(collapsed.stride());
  for (int k = 1; k < strides.rank(); ++k) {
    if (strides[k].value() > strides[k - 1].value()) {
      throw NotFound("Invalid mesh_dim_names " + py_tuple(want) +  // PyTorch's KeyError
                     " specified. Mesh dim indices should be in ascending order (the slice's layout " +
                     meshsim::to_string(joined) + " collapses to " + meshsim::to_string(collapsed) +
                     ", whose strides do not descend).");
    }
  }
  if (!mesh_check_orthogonal(joined) || !mesh_check_non_overlap(joined)) {
    throw FailedPrecondition("Slicing overlapping dim_names " + py_tuple(want) +
                             " is not allowed (their layouts overlap in " +
                             meshsim::to_string(joined) + ").");  // PyTorch's RuntimeError
  }
  return DeviceMesh(u_, std::move(joined), std::move(canonical), std::move(want), false,
                    std::move(configs));
}

std::string flattened_slice_warning(const std::string& name) {
  return "slicing " + quote_input(name) +
         " takes a flattened dim from the root mesh, which PyTorch deprecates (a warning since 2.10, "
         "pytorch/pytorch#164993: \"Slicing a flattened dim from root mesh will be deprecated in PT 2.11. "
         "Users need to bookkeep the flattened mesh directly.\"): keep the mesh flatten returned, or look it "
         "up by the dims it flattens (find_flattened: by layout; a flattened dim found by its size alone may "
         "hold other ranks)";
}

std::vector<std::string> DeviceMesh::flattened_from_root(std::span<const std::string> names) const {
  std::vector<std::string> out;
  if (!is_root_) return out;
  for (const std::string& n : names) {
    const bool own = names_ && std::find(names_->begin(), names_->end(), n) != names_->end();
    if (!own && u_->find_flattened(n)) out.push_back(n);
  }
  return out;
}

std::optional<DeviceMesh> DeviceMesh::find_flattened(std::span<const std::string> dims) const {
  const DeviceMesh selected = slice(dims);
  const Layout want = canonical_of(mesh_flatten(selected.layout_));
  for (Universe::Flattened& f : u_->flattened()) {
    if (f.canonical == want) {
      return DeviceMesh(u_, std::move(f.layout), std::move(f.canonical), std::vector<std::string>{f.name}, false,
                        {std::move(f.config)});
    }
  }
  return std::nullopt;
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
  // (A flatten that makes no groups is not logged: a loop that flattens the same name again and
  // again does not grow the log.)
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
  const bool fresh = !u_->find_flattened(flat_name);
  Universe::Flattened reg = u_->register_flatten(flat_name, flat, canonical_of(flat), config);
  BackendConfig cfg = std::move(reg.config);
  DeviceMesh out(u_, std::move(reg.layout), std::move(reg.canonical), std::vector<std::string>{flat_name}, false, {cfg});
  if (fresh) u_->record(GroupCreationEvent::Op::kFlatten, "flatten", true, 0, 1, out.layout_, out.names_, out.configs_);
  return out;
}

DeviceMesh DeviceMesh::unflatten(std::string_view dim, std::span<const int64_t> sizes,
                                 std::span<const std::string> names) const {
  return unflatten(dim, sizes, names, {});
}

DeviceMesh DeviceMesh::unflatten(std::string_view dim, std::span<const int64_t> sizes, std::span<const std::string> names,
                                 std::vector<BackendConfig> new_configs) const {
  if (!names_) {
    // The same condition and class as unflatten by index (and as slice and flatten).
    throw FailedPrecondition("Cannot unflatten a DeviceMesh without mesh_dim_names! (" +
                             to_string() + ")");
  }
  if (std::find(names_->begin(), names_->end(), dim) == names_->end()) {
    throw InvalidArgument("dim " + std::string(dim) + " specified in `_unflatten` is not in " +
                   py_tuple(*names_) + ".");
  }
  return unflatten(dim_index(dim), sizes, names, std::move(new_configs));
}

DeviceMesh DeviceMesh::unflatten(int64_t dim, std::span<const int64_t> sizes,
                                 std::span<const std::string> names) const {
  return unflatten(dim, sizes, names, {});
}

DeviceMesh DeviceMesh::unflatten(int64_t dim, std::span<const int64_t> sizes, std::span<const std::string> names,
                                 std::vector<BackendConfig> new_configs) const {
  if (dim >= ndim() || dim < 0) {
    throw InvalidArgument("dim " + std::to_string(dim) + " specified in `_unflatten` is out of range " +
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
  if (!new_configs.empty() && new_configs.size() != sizes.size()) {
    throw InvalidArgument("_unflatten: " + std::to_string(new_configs.size()) + " backend configs for " +
                          std::to_string(sizes.size()) + " new dims");
  }
  std::vector<BackendConfig> configs;
  if (!configs_.empty() || !new_configs.empty()) {
    for (int k = 0; k < d; ++k) configs.push_back(backend_config(k));
    for (std::size_t k = 0; k < sizes.size(); ++k) configs.push_back(new_configs.empty() ? BackendConfig{} : new_configs[k]);
    for (int k = d + 1; k < ndim(); ++k) configs.push_back(backend_config(k));
  }
  Layout layout = mesh_unflatten(layout_, dim, sizes);
  Layout canonical = canonical_after_unflatten(canonical_, layout, d, static_cast<int>(sizes.size()));
  DeviceMesh out(u_, std::move(layout), std::move(canonical), std::move(new_names), false, std::move(configs));
  u_->record(GroupCreationEvent::Op::kUnflatten, "unflatten", true, d, static_cast<int>(sizes.size()), out.layout_,
             out.names_, out.configs_);
  return out;
}

std::vector<GroupCreationEvent> DeviceMesh::creation_events() const { return u_->events(); }
uint64_t DeviceMesh::creation_log_digest() const { return u_->events_digest(); }

DeviceMesh DeviceMesh::event_mesh(const GroupCreationEvent& e) const {
  return DeviceMesh(u_, e.layout, e.names, e.op == GroupCreationEvent::Op::kRoot, e.configs);
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
      // PyTorch's RuntimeError; 2.14 corrected the spelling of its words ("meshs" in 2.13).
      throw FailedPrecondition(std::string("Cannot concatenate DeviceMeshes derived from different device ") +
                            (first.torch_version() == TorchVersion::k2_13 ? "meshs: " : "meshes: ") +
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
    throw FailedPrecondition("Cannot concatenate overlapping meshes: [" + join(reprs, ", ", false) +
                             "] (joined layout " + meshsim::to_string(joined) + ")");  // PyTorch's RuntimeError
  }
  if (first.names_) check_unique_names(names, " after concatenate");
  if (!any_config) configs.clear();
  MeshNames out_names;
  if (first.names_) out_names = std::move(names);
  return DeviceMesh(first.u_, std::move(joined), std::move(out_names), false, std::move(configs));
}

}  // namespace meshsim
