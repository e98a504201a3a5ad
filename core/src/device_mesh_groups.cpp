#include "meshsim/device_mesh.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "meshsim/algebra.hpp"
#include "meshsim/digest.hpp"
#include "meshsim/error.hpp"
#include "checked_math.hpp"
#include "device_mesh_parts.hpp"
#include "flat_modes.hpp"
#include "rank_map.hpp"
#include "universe.hpp"

namespace meshsim {

using namespace mesh_detail;

namespace {
// table_of lists every group of a dim layout over the rank map's positions, as global ranks, in
// one buffer.
GroupTable table_of(const Universe& u, const Layout& dim_layout) {
  GroupTable t = mesh_group_table(dim_layout, u.rank_map.size());
  for (int64_t& v : t.ranks) v = u.rank_map.at(v);
  return t;
}

// floor_div is division rounding toward negative infinity (d > 0).
int64_t floor_div(int64_t a, int64_t d) { return a / d - ((a % d != 0) && (a < 0)); }

// FamilyName is a dim's groups as global ranks, named by what they are, not by the universe
// they were found in: the coalesced dim layout L (PyTorch's order, as canonical layouts print)
// and the offset of the family's rows modulo L's span M (the family's period: shifting every
// row by a multiple of M gives rows of the same family), "L" or "L+o". Two universes that hold
// a rank in groups of the same name hold it in the same group. A family no layout describes
// (an explicit rank map's rows that are not the rows of one layout shifted) is named by a
// digest of its rows: "{16 hex digits}".
struct FamilyName {
  static std::string of(const Layout& dim, int64_t first_rank) {
    const detail::Leaves modes = detail::leaves(dim);
    int64_t span = 1;
    for (const detail::Leaf& m : modes) {
      if (m.s > 1 && m.d > 0) span = std::max(span, checked_mul(m.s, m.d, "group name"));
    }
    const int64_t o = ((first_rank % span) + span) % span;
    return meshsim::to_string(dim) + (o == 0 ? "" : "+" + std::to_string(o));
  }
  // derived is the coalesced layout whose row is `row` (strictly positive strides), if any.
  static std::optional<Layout> derived(std::span<const int64_t> row) {
    const int64_t k = static_cast<int64_t>(row.size());
    if (k == 1) return Layout();
    detail::Leaves modes;  // fastest first
    int64_t block = 1;
    while (block < k) {
      const int64_t stride = row[static_cast<std::size_t>(block)] - row[0];
      if (stride <= 0) return std::nullopt;
      int64_t m = 1;
      int64_t next = 0;
      while (block * (m + 1) <= k && !__builtin_mul_overflow(m, stride, &next) &&
             row[static_cast<std::size_t>(block * m)] - row[0] == next) {
        ++m;
      }
      while (m > 1 && k % (block * m) != 0) --m;
      if (m < 2) return std::nullopt;
      detail::add(modes, m, stride);
      block *= m;
    }
    Layout l = coalesce(detail::make_flat(modes.data(), modes.size(), true), Convention::kTorch);
    for (int64_t i = 0; i < k; ++i) {
      if (row[static_cast<std::size_t>(i)] - row[0] != mesh_rank_at(l, i)) return std::nullopt;
    }
    return l;
  }
  // of_table names an explicit rank map's family from its rows: the layout of row 0, when every
  // row is that layout shifted by an offset whose digits along the layout's modes are those of
  // row 0's; else the digest of the rows.
  static std::string of_table(const GroupTable& t) {
    if (t.count > 0) {
      if (std::optional<Layout> l = derived(t.row(0))) {
        const detail::Leaves modes = detail::leaves(*l);
        const int64_t base = t.row(0)[0];
        bool same = true;
        for (int64_t g = 1; g < t.count && same; ++g) {
          std::span<const int64_t> r = t.row(g);
          for (int64_t i = 0; i < t.size && same; ++i) same = r[static_cast<std::size_t>(i)] - r[0] == mesh_rank_at(*l, i);
          for (const detail::Leaf& m : modes) {
            if (same && m.s > 1 && m.d > 0) {
              const int64_t diff = r[0] - base;  // |diff| < 2^63: both are ranks
              same = ((floor_div(diff, m.d) % m.s) + m.s) % m.s == 0;
            }
          }
        }
        if (same) return of(*l, base);
      }
    }
    std::vector<int64_t> firsts(static_cast<std::size_t>(t.count));
    for (int64_t g = 0; g < t.count; ++g) firsts[static_cast<std::size_t>(g)] = g;
    std::sort(firsts.begin(), firsts.end(), [&](int64_t a, int64_t b) { return t.row(a)[0] < t.row(b)[0]; });
    Fnv1a f;
    f.u64(static_cast<uint64_t>(t.count));
    f.u64(static_cast<uint64_t>(t.size));
    for (int64_t g : firsts) {
      for (int64_t r : t.row(g)) f.u64(static_cast<uint64_t>(r));
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(f.value()));
    return std::string("{") + hex + "}";
  }
};

std::vector<std::vector<int64_t>> rows_of(const GroupTable& t) {
  std::vector<std::vector<int64_t>> rows;
  rows.reserve(static_cast<std::size_t>(t.count));
  for (int64_t g = 0; g < t.count; ++g) rows.emplace_back(t.row(g).begin(), t.row(g).end());
  return rows;
}
// members_name names a dim's groups by what they are: the family's layout over global ranks (or
// a digest of rows no layout describes) and the config.
std::string members_name(const Universe& u, const Layout& canonical, const BackendConfig& config) {
  const std::string family = u.rank_map.start() ? FamilyName::of(canonical, *u.rank_map.start())
                                                : FamilyName::of_table(table_of(u, canonical));
  return "group[" + family + "]@" + config.to_string();
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
    // The name follows the groups' members and the config, whatever universe found them (the
    // same group is the same name in every mesh of every root), unless the root was handed the
    // group under a name of its own (from_group).
    std::optional<std::string> name = u_->handed_name(canonical_[dim], config);
    if (!name) name = members_name(*u_, canonical_[dim], config);
    return std::make_shared<GroupRecord>(
        std::move(*name), canonical_[dim],
        config, [weak, dim_layout] {
          std::shared_ptr<const Universe> u = weak.lock();
          if (!u) {
            throw FailedPrecondition("GroupRecord::rows: every mesh of this record's root is gone");
          }
          return table_of(*u, dim_layout);
        });
  });
}

bool DeviceMesh::init_backend() const { return u_->init_backend; }
const std::string& DeviceMesh::default_backend() const { return u_->default_backend; }
TorchVersion DeviceMesh::torch_version() const { return u_->torch_version; }

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
  h.pg_ranks = h.ranks;
  std::sort(h.pg_ranks.begin(), h.pg_ranks.end());
  h.config = backend_config(*dim);
  h.backend = h.config.backend.empty() ? u_->default_backend : h.config.backend;
  h.group_desc = names_ ? "mesh_" + (*names_)[static_cast<std::size_t>(*dim)] : "mesh_dim_" + std::to_string(*dim);
  h.record = group_record(*dim);
  // A dim as large as the world, with no backend override, is PyTorch's default group
  // (device_mesh.py _init_one_process_group at 2.13: "Early return if there is only one
  // sub_layout"), described "default_pg";
  // on an accelerator whose default backend is gloo, one new_group of every rank, "mesh_default".
  const int64_t world = world_size().value_or(rank_map_size());
  if (size(*dim) == world && h.config == BackendConfig{}) {
    const bool accelerator = device_type() != "cpu" && device_type() != "meta";
    const std::string backend = !u_->default_backend.empty() ? u_->default_backend : accelerator ? "nccl" : "gloo";
    h.group_desc = accelerator && backend == "gloo" ? "mesh_default" : "default_pg";
  }
  // A group the root was handed (from_group) is that ProcessGroup, named and described as it
  // was, whatever its size (PyTorch keeps the groups it is given: _dim_group_names). A dim of
  // the same members that flatten or unflatten made is a group of its own, named by them.
  const std::optional<std::string> dim_name = names_ ? std::optional<std::string>((*names_)[static_cast<std::size_t>(*dim)]) : std::nullopt;
  if (const Universe::HandedGroup* handed = u_->handed_dim(canonical_[*dim], h.config, dim_name)) {
    h.group_desc = handed->desc;
    h.name = handed->name.value_or(h.record->name);
  } else {
    h.name = u_->handed_name(canonical_[*dim], h.config) ? members_name(*u_, canonical_[*dim], h.config) : h.record->name;
  }
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

}  // namespace meshsim
