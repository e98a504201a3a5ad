#include "meshsim/show.hpp"

#include <algorithm>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "meshsim/json_codec.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/error.hpp"

namespace meshsim::show {

namespace {

using Json = nlohmann::json;

std::string join_ints(const Json& a) {
  std::string s;
  for (const Json& v : a) s += (s.empty() ? "" : " ") + v.dump();
  return s;
}

}  // namespace

void run(const Options& o, std::ostream& out) {
  if (o.max_rows < 0 || o.max_rows > INT32_MAX) {
    throw OutOfRange("--max-rows " + std::to_string(o.max_rows) + " is out of range [0, 2^31)");
  }
  if (o.format != "text" && o.format != "json") {
    throw InvalidArgument("--format must be text or json, not " + o.format);
  }
  const MeshRecipe recipe = recipe_from_flags(o.recipe);
  BuiltMeshes built = meshsim::apply(recipe);
  if (o.format == "json") {
    std::vector<std::string> want{"mesh_dim_names", "layout", "shape", "size", "groups_by_dim",
                                  "coordinate_by_rank", "mesh_by_rank"};
    if (recipe.rank) want.insert(want.end(), {"coordinate", "my_groups"});
    Json result = query::describe(recipe, built, want);
    out << "{\n";
    std::size_t i = 0;
    for (const auto& [k, v] : result.items()) {
      out << "  " << Json(k).dump() << ": " << json::short_dump(v, SIZE_MAX)
          << (++i < result.size() ? ",\n" : "\n");
    }
    out << "}\n";
    return;
  }
  const DeviceMesh& m = built.result;
  if (m.rank_map_size() > kMaxEnumeration) {
    throw ResourceExhausted("the rank map holds " + std::to_string(m.rank_map_size()) +
                            " ranks, over the limit of " + std::to_string(kMaxEnumeration) +
                            " that meshsim show lists");
  }
  const std::optional<int64_t> rank = recipe.rank;
  const int64_t me = rank.value_or(0);
  int64_t rows_left = o.max_rows;
  auto budget = [&](std::ostream& os) {
    if (rows_left-- > 0) return true;
    if (rows_left == -1) os << "  ... (more rows; raise --max-rows)\n";
    return false;
  };
  out << m.to_string() << "\n  layout " << to_string(m.layout()) << ", " << m.size()
      << " ranks, " << m.copies() << (m.copies() == 1 ? " copy" : " copies")
      << " in a rank map of " << m.rank_map_size() << "\n\n";
  // The mesh array as the rank sees it, one row per last-dim row.
  auto arr = m.mesh_for(me);
  if (!arr) {
    out << "mesh: rank " << me << " is not in any copy of this mesh\n";
  } else {
    out << "mesh (as seen by rank " << me << "):\n";
    const int64_t row = arr->shape.back();
    const int nd = m.ndim();
    for (std::size_t i = 0; i < arr->values.size(); i += static_cast<std::size_t>(row)) {
      if (!budget(out)) break;
      std::string label;
      int64_t idx = static_cast<int64_t>(i) / row;
      std::vector<int64_t> c(static_cast<std::size_t>(std::max(nd - 1, 0)));
      for (int d = nd - 2; d >= 0; --d) {
        c[static_cast<std::size_t>(d)] = idx % arr->shape[static_cast<std::size_t>(d)];
        idx /= arr->shape[static_cast<std::size_t>(d)];
      }
      for (int d = 0; d + 1 < nd; ++d) label += m.dim_name(d) + "=" + std::to_string(c[d]) + " ";
      out << "  " << label << "| ";
      for (int64_t k = 0; k < row; ++k) out << (k ? " " : "") << arr->values[i + k];
      out << "\n";
    }
  }
  rows_left = o.max_rows;
  out << "\ngroups:\n";
  for (int d = 0; d < m.ndim(); ++d) {
    auto g = m.groups(d);
    out << "  " << m.dim_name(d) << " (size " << m.size(d) << ", " << g.size() << " groups):";
    std::size_t shown = 0;
    for (const auto& row : g) {
      if (shown++ == static_cast<std::size_t>(o.max_rows)) {
        out << " ...";
        break;
      }
      out << " [" << join_ints(Json(row)) << "]";
    }
    out << "\n";
  }
  if (rank) {
    auto c = m.coordinate(me);
    out << "\nrank " << me << ": ";
    if (!c) {
      out << "not in the mesh\n";
    } else {
      out << "coordinate (" << join_ints(Json(*c)) << ")";
      for (int d = 0; d < m.ndim(); ++d) {
        out << ", " << m.dim_name(d) << " group [" << join_ints(Json(*m.group_of(me, d))) << "]";
      }
      out << "\n";
    }
  }
  out << "\ncoordinates:\n  " << std::setw(8) << "rank";
  for (int d = 0; d < m.ndim(); ++d) out << " " << std::setw(6) << m.dim_name(d);
  out << "\n";
  rows_left = o.max_rows;
  std::vector<int64_t> ranks = m.rank_map();
  std::sort(ranks.begin(), ranks.end());
  for (int64_t r : ranks) {
    if (!budget(out)) break;
    out << "  " << std::setw(8) << r;
    auto c = m.coordinate(r);
    for (int d = 0; d < m.ndim(); ++d) out << " " << std::setw(6) << (*c)[static_cast<std::size_t>(d)];
    out << "\n";
  }
}

}  // namespace meshsim::show
