// report_json.cpp — a report as the JSON tree `meshsim run --format json` prints and
// meshsim.run returns (one writer of the report's shape for both).
#include <algorithm>

#include "meshsim/check_meshes.hpp"

namespace meshsim::check {

nlohmann::json report_json(const MeshCheckReport& r) {
  using Json = nlohmann::json;
  const int64_t world = r.world_size;
  const std::vector<DeviceMesh>& meshes = r.meshes;
  Json j;
  j["ok"] = r.ok;
  j["backend"] = r.engine;
  j["world_size"] = world;
  if (r.own) j["rank"] = *r.rank;  // one launched rank's report: its own groups only
  if (r.hosts) {
    j["ok"] = r.passed();
    j["placement_failures"] = r.misplaced;
  }
  Json ms = Json::array();
  for (std::size_t i = 0; i < meshes.size(); ++i) {
    const DeviceMesh& m = meshes[i];
    Json md;
    md["mesh_dim_names"] = m.names() ? Json(*m.names()) : Json(nullptr);
    md["shape"] = m.shape();
    Json g = Json::object();
    for (int d = 0; d < m.ndim(); ++d) {
      g[m.dim_name(d)] = r.ok ? Json(r.seen[i][static_cast<std::size_t>(d)]) : Json(nullptr);
    }
    md["groups_by_dim"] = g;
    if (r.hosts) {
      Json pl = Json::object();
      for (int d = 0; d < m.ndim(); ++d) {
        const placement::DimPlacement p = placement::place(m, d, *r.hosts);
        pl[m.dim_name(d)] = {{"groups", p.groups}, {"max_hosts", p.max_hosts},
                             {"groups_crossing_hosts", p.groups_crossing_hosts}, {"max_domains", p.max_domains}};
      }
      md["placement"] = pl;
    }
    ms.push_back(md);
  }
  j["meshes"] = ms;
  // The views the recipe names: the root and every mesh bound by `let`, in recipe order.
  Json vs = Json::array();
  for (const View& v : r.views) {
    Json view = ms[v.step];
    view.erase("placement");
    view["name"] = v.name;
    vs.push_back(std::move(view));
  }
  j["views"] = vs;
  j["checks"] = r.checks;
  j["collectives"] = r.collectives;
  j["seconds"] = r.seconds;
  if (!r.warnings.empty()) j["warnings"] = shown_warnings(r.warnings);
  Json fs = Json::array();
  // One entry per rank at fault, as many as the budget allows; failures_count says how many.
  j["failures_count"] = r.failures.size() + r.stuck.size();
  for (const Diagnosis& d : r.failures) {
    if (fs.size() >= kListedRanks) break;
    Json f{{"rank", d.ranks.empty() ? Json(nullptr) : Json(d.ranks[0])}, {"kind", to_string(d.kind)}, {"message", d.message}};
    if (d.kind == DiagnosisKind::kStall) {
      // The first ranks and a count: a report does not grow with the world.
      auto first = [](const std::vector<int64_t>& v) {
        return std::vector<int64_t>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(v.size(), kListedRanks)));
      };
      f["waiting"] = first(d.waiting);
      f["waiting_count"] = d.waiting.size();
      f["missing"] = first(d.missing);
      f["missing_count"] = d.missing.size();
    }
    fs.push_back(f);
  }
  for (const RankReport& s : r.stuck) {
    if (fs.size() >= kListedRanks) break;
    fs.push_back({{"rank", s.rank}, {"kind", "stuck"}, {"message", s.message}});
  }
  j["failures"] = fs;
  return j;
}

}  // namespace meshsim::check
