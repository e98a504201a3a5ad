#include "show.hpp"

#include <algorithm>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "mesh_program.hpp"
#include "meshsim/error.hpp"

namespace meshsim::show {

namespace {

using Json = nlohmann::json;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  std::size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size()) {
    throw InvalidArgument(what + ": '" + s + "' is not an integer");
  }
  return v;
}

std::vector<int64_t> parse_ints(const std::string& s, const std::string& what) {
  std::vector<int64_t> out;
  for (const auto& p : split(s, ',')) out.push_back(parse_int(p, what));
  if (out.empty()) throw InvalidArgument(what + ": expected a comma-separated list");
  return out;
}

Json parse_rank_map(const std::string& s, int64_t count) {
  const auto dots = s.find("..");
  if (dots == std::string::npos) return Json(parse_ints(s, "--rank-map"));
  const int64_t lo = parse_int(s.substr(0, dots), "--rank-map");
  const int64_t hi = parse_int(s.substr(dots + 2), "--rank-map");
  if (hi < lo || hi - lo + 1 != count) {
    throw InvalidArgument("--rank-map " + s + " holds " + std::to_string(hi - lo + 1) +
                          " ranks but the mesh has " + std::to_string(count));
  }
  std::vector<int64_t> v;
  for (int64_t r = lo; r <= hi; ++r) v.push_back(r);
  return Json(v);
}

Json nest(const std::vector<int64_t>& shape, const std::vector<int64_t>& values) {
  return query::nested(MeshArray{shape, values});
}

std::string join_ints(const Json& a) {
  std::string s;
  for (const Json& v : a) s += (s.empty() ? "" : " ") + v.dump();
  return s;
}

}  // namespace

std::string program(const Options& o) {
  std::vector<int64_t> shape;
  Json names = nullptr;
  if (!o.mesh.empty()) {
    if (!o.shape.empty() || !o.names.empty()) {
      throw InvalidArgument("give either --mesh or --shape/--names, not both");
    }
    std::vector<std::string> n;
    for (const auto& kv : split(o.mesh, ',')) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) throw InvalidArgument("--mesh: '" + kv + "' is not name=size");
      n.push_back(kv.substr(0, eq));
      shape.push_back(parse_int(kv.substr(eq + 1), "--mesh " + kv));
    }
    names = n;
  } else if (!o.shape.empty()) {
    shape = parse_ints(o.shape, "--shape");
    if (!o.names.empty()) names = split(o.names, ',');
  } else {
    throw InvalidArgument("give the mesh with --mesh dp=2,tp=4 or --shape 2,4 [--names dp,tp]");
  }
  int64_t count = 1;
  for (int64_t s : shape) {
    if (s < 1 || __builtin_mul_overflow(count, s, &count)) {
      throw InvalidArgument("mesh sizes must be >= 1 and their product must fit in int64");
    }
  }
  Json req = {{"op", "mesh.program"}};
  if (o.rank_map.empty()) {
    req["build"] = {{"init_device_mesh", {{"mesh_shape", shape}, {"mesh_dim_names", names}}}};
    req["world_size"] = o.world_size.value_or(count);
  } else {
    Json ranks = parse_rank_map(o.rank_map, count);
    if (static_cast<int64_t>(ranks.size()) != count) {
      throw InvalidArgument("--rank-map holds " + std::to_string(ranks.size()) +
                            " ranks but the mesh has " + std::to_string(count));
    }
    int64_t max_rank = 0;
    for (const Json& r : ranks) max_rank = std::max(max_rank, r.get<int64_t>());
    req["build"] = {{"DeviceMesh", {{"mesh", nest(shape, ranks.get<std::vector<int64_t>>())},
                                    {"mesh_dim_names", names}}}};
    req["world_size"] = o.world_size.value_or(max_rank + 1);
  }
  if (o.rank) req["rank"] = *o.rank;
  Json ops = Json::array();
  for (const Step& s : o.steps) {
    Json step = {{"on", "_last"}};
    if (s.kind == "slice") {
      step["slice"] = split(s.arg, ',');
    } else if (s.kind == "flatten") {
      step["flatten"] = s.arg.empty() ? Json(nullptr) : Json(s.arg);
    } else if (s.kind == "unflatten") {
      auto parts = split(s.arg, ':');
      if (parts.size() != 3) {
        throw InvalidArgument("--unflatten '" + s.arg + "': expected dim:sizes:names, e.g. tp:2,2:a,b");
      }
      Json dim = parts[0];
      if (!parts[0].empty() && std::all_of(parts[0].begin(), parts[0].end(), ::isdigit)) {
        dim = parse_int(parts[0], "--unflatten dim");
      }
      step["unflatten"] = {{"dim", dim}, {"sizes", parse_ints(parts[1], "--unflatten sizes")},
                           {"names", split(parts[2], ',')}};
    } else {
      throw InvalidArgument("unknown transformation '" + s.kind + "'");
    }
    ops.push_back(step);
  }
  req["ops"] = ops;
  return req.dump();
}

void run(const Options& o, std::ostream& out) {
  Json req = Json::parse(program(o));
  if (o.format == "json") {
    req["want"] = {"mesh_dim_names", "layout", "shape", "size", "groups_by_dim",
                   "coordinate_by_rank", "mesh_by_rank"};
    if (o.rank) req["want"].insert(req["want"].end(), {"coordinate", "my_groups"});
    Json result = query::run_mesh_program(req);
    out << "{\n";
    std::size_t i = 0;
    for (const auto& [k, v] : result.items()) {
      out << "  " << Json(k).dump() << ": " << v.dump() << (++i < result.size() ? ",\n" : "\n");
    }
    out << "}\n";
    return;
  }
  if (o.format != "text") throw InvalidArgument("--format must be text or json, not " + o.format);
  DeviceMesh m = query::build_mesh_program(req);
  const int64_t me = o.rank.value_or(0);
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
  if (o.rank) {
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
