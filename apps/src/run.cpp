#include "meshsim/run.hpp"

#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>

#include "meshsim/error.hpp"
#include "meshsim/spmd.hpp"

namespace meshsim::run {

namespace {

using Json = nlohmann::json;

enum class Fault { kThrow, kSkip, kMismatch, kMesh, kStall };

struct Planted {
  Fault kind;
  int64_t rank;
};

std::vector<Planted> parse_faults(const std::vector<std::string>& specs, int64_t world) {
  static const std::map<std::string, Fault> kinds{{"throw", Fault::kThrow}, {"skip", Fault::kSkip},
                                                  {"mismatch", Fault::kMismatch},
                                                  {"mesh", Fault::kMesh}, {"stall", Fault::kStall}};
  std::vector<Planted> out;
  for (const std::string& s : specs) {
    const auto at = s.find('@');
    if (at == std::string::npos) throw InvalidArgument("--fault '" + s + "' is not KIND@RANK");
    const std::string kind = s.substr(0, at);
    auto it = kinds.find(kind);
    if (it == kinds.end()) {
      throw InvalidArgument("--fault '" + s + "': unknown kind '" + kind +
                            "' (known: throw, skip, mismatch, mesh, stall)");
    }
    const std::string rank_text = s.substr(at + 1);
    std::size_t used = 0;
    int64_t rank = -1;
    try {
      rank = std::stoll(rank_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (rank_text.empty() || used != rank_text.size() || !std::isdigit(static_cast<unsigned char>(rank_text[0]))) {
      throw InvalidArgument("--fault '" + s + "': '" + rank_text + "' is not a rank");
    }
    if (rank >= world) {
      throw OutOfRange("--fault '" + s + "': rank " + std::to_string(rank) + " is out of range [0, " +
                       std::to_string(world) + ")");
    }
    if (world == 1 && (it->second == Fault::kSkip || it->second == Fault::kMismatch)) {
      throw InvalidArgument("--fault '" + s + "' needs at least 2 ranks: with one rank no peer can "
                            "observe a skipped or different collective");
    }
    out.push_back({it->second, rank});
  }
  return out;
}

bool planted(const std::vector<Planted>& f, Fault kind, int64_t rank) {
  for (const Planted& p : f) {
    if (p.kind == kind && p.rank == rank) return true;
  }
  return false;
}

// different_recipe is what a rank with a `mesh` fault builds: the same mesh over a reversed
// rank map (or, with one rank, with renamed dims).
MeshRecipe different_recipe(MeshRecipe r, const DeviceMesh& root) {
  std::vector<int64_t> ranks = root.rank_map();
  if (ranks.size() > 1) {
    std::reverse(ranks.begin(), ranks.end());
    r.root.kind = RootSpec::Kind::kRanks;
    r.root.ranks = std::move(ranks);
  } else {
    if (!r.root.names) r.root.names = std::vector<std::string>(r.root.shape.size(), "");
    for (std::size_t i = 0; i < r.root.names->size(); ++i) (*r.root.names)[i] += "_planted" + std::to_string(i);
    r.steps.clear();
  }
  return r;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

int run(const Options& o, std::ostream& out) {
  if (o.backend != "threaded") {
    throw InvalidArgument("--backend '" + o.backend + "' is not available (known: threaded)");
  }
  if (!(o.timeout_seconds > 0) || !std::isfinite(o.timeout_seconds) || o.timeout_seconds > 86400) {
    throw InvalidArgument("--timeout " + std::to_string(o.timeout_seconds) +
                          " is not in (0, 86400] seconds");
  }
  if (o.format != "text" && o.format != "json") {
    throw InvalidArgument("--format must be text or json, not " + o.format);
  }
  const MeshRecipe recipe = recipe_from_flags(o.recipe);
  const BuiltMeshes expected = meshsim::apply(recipe);  // bad recipes stop here (exit 2)
  const int64_t world = recipe.world_size;
  if (world > 16384) {
    throw InvalidArgument("--world-size " + std::to_string(world) +
                          " is over the 16384 rank threads a threaded run supports");
  }
  const std::vector<Planted> faults = parse_faults(o.faults, world);
  std::vector<DeviceMesh> meshes{expected.root};
  meshes.insert(meshes.end(), expected.meshes.begin(), expected.meshes.end());
  std::vector<MeshParts> parts;
  for (const DeviceMesh& m : meshes) parts.push_back(mesh_parts(m));
  // checks each rank runs: per mesh it belongs to, per dim, 3 checks.
  int64_t expected_checks = 0;
  for (const DeviceMesh& m : meshes) expected_checks += int64_t{3} * m.ndim() * m.rank_map_size();

  // gathered[rank][mesh][dim]: the group each rank saw over the backend.
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> gathered(static_cast<std::size_t>(world));
  std::mutex gathered_mu;
  int64_t checks_passed = 0;

  SpmdOptions so;
  so.world_size = world;
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(o.timeout_seconds * 1000)));
  RunReport report = run_spmd(so, [&](RankContext& ctx) {
    const int64_t me = ctx.rank();
    if (planted(faults, Fault::kStall, me)) ctx.sleep_for(so.timeout + std::chrono::seconds(2));
    // Every rank builds the recipe itself, as real ranks do.
    BuiltMeshes built = planted(faults, Fault::kMesh, me)
                            ? meshsim::apply(different_recipe(recipe, expected.root))
                            : meshsim::apply(recipe);
    std::vector<DeviceMesh> mine{built.root};
    mine.insert(mine.end(), built.meshes.begin(), built.meshes.end());
    // World check: all_gather of ranks over the world communicator.
    {
      const bool odd = planted(faults, Fault::kMismatch, me);
      std::vector<int64_t> in(odd ? 2 : 1, me), got(static_cast<std::size_t>(world) * in.size());
      ctx.world().all_gather(in.data(), got.data(), static_cast<int64_t>(in.size()), DType::kInt64);
      for (int64_t r = 0; r < world; ++r) {
        if (got[static_cast<std::size_t>(r)] != r) ctx.fail("world all_gather returned " + list(got));
      }
    }
    for (std::size_t i = 0; i < mine.size(); ++i) ctx.check_mesh_agreement(mine[i], parts[i]);
    std::vector<std::vector<std::vector<int64_t>>> seen(mine.size());
    int64_t passed = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const DeviceMesh& m = mine[i];
      if (!m.contains(me)) continue;
      for (int d = 0; d < m.ndim(); ++d) {
        Communicator& c = ctx.comm(m, d);
        const std::vector<int64_t> group = *m.group_of(me, d);
        const std::string where = "mesh " + std::to_string(i) + " " + m.to_string() + " dim " + m.dim_name(d);
        if (c.global_ranks() != group) {
          ctx.fail(where + ": the communicator holds " + list(c.global_ranks()) + ", the mesh says " + list(group));
        }
        ++passed;
        std::vector<int64_t> got(group.size());
        c.all_gather(std::span<const int64_t>(&me, 1), std::span<int64_t>(got));
        if (got != group) ctx.fail(where + ": all_gather of ranks returned " + list(got) + ", the mesh says " + list(group));
        ++passed;
        int64_t sum = me + 1, want = 0;
        for (int64_t g : group) want += g + 1;
        c.all_reduce(std::span<int64_t>(&sum, 1), ReduceOp::kSum);
        if (sum != want) ctx.fail(where + ": all_reduce(sum) of rank+1 gave " + std::to_string(sum) + ", expected " + std::to_string(want));
        ++passed;
        seen[i].push_back(std::move(got));
      }
      if (i == 0 && planted(faults, Fault::kThrow, me)) {
        throw Internal("planted fault: rank " + std::to_string(me) + " throws mid-run");
      }
    }
    if (planted(faults, Fault::kThrow, me)) {
      throw Internal("planted fault: rank " + std::to_string(me) + " throws mid-run");
    }
    {
      std::lock_guard lk(gathered_mu);
      gathered[static_cast<std::size_t>(me)] = std::move(seen);
      checks_passed += passed;
    }
    // Global agreement: every rank's check count sums to what the recipe predicts.
    if (planted(faults, Fault::kSkip, me)) return;
    int64_t total = passed;
    ctx.world().all_reduce(std::span<int64_t>(&total, 1), ReduceOp::kSum);
    if (total != expected_checks) {
      ctx.fail("global agreement: ranks ran " + std::to_string(total) + " checks, the recipe predicts " +
               std::to_string(expected_checks));
    }
  });
  const int code = report.ok ? 0 : 1;

  if (o.format == "json") {
    Json j;
    j["ok"] = report.ok;
    j["backend"] = o.backend;
    j["world_size"] = world;
    Json ms = Json::array();
    for (std::size_t i = 0; i < meshes.size(); ++i) {
      const DeviceMesh& m = meshes[i];
      Json md;
      md["mesh_dim_names"] = m.names() ? Json(*m.names()) : Json(nullptr);
      md["shape"] = m.shape();
      Json g = Json::object();
      for (int d = 0; d < m.ndim(); ++d) {
        Json rows = Json::array();
        if (report.ok) {
          for (const auto& row : m.groups(d)) {
            // The group as its first member saw it over the backend.
            const auto& s = gathered[static_cast<std::size_t>(row[0])];
            rows.push_back(i < s.size() && static_cast<std::size_t>(d) < s[i].size() ? Json(s[i][static_cast<std::size_t>(d)]) : Json(nullptr));
          }
        }
        g[m.dim_name(d)] = report.ok ? rows : Json(nullptr);
      }
      md["groups_by_dim"] = g;
      ms.push_back(md);
    }
    j["meshes"] = ms;
    j["checks"] = checks_passed;
    j["collectives"] = report.collectives;
    j["seconds"] = report.seconds;
    Json fs = Json::array();
    for (const Diagnosis& d : report.failures) {
      Json f{{"rank", d.ranks.empty() ? Json(nullptr) : Json(d.ranks[0])}, {"kind", d.kind}, {"message", d.message}};
      if (d.kind == "stall") {
        f["waiting"] = d.waiting;
        f["missing"] = d.missing;
      }
      fs.push_back(f);
    }
    for (const RankReport& r : report.ranks) {
      if (r.status == "stuck") fs.push_back({{"rank", r.rank}, {"kind", "stuck"}, {"message", r.message}});
    }
    j["failures"] = fs;
    out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  } else {
    out << "meshsim run: " << world << " ranks over the " << o.backend << " backend, timeout "
        << o.timeout_seconds << " s\n";
    for (std::size_t i = 0; i < meshes.size(); ++i) {
      const DeviceMesh& m = meshes[i];
      out << (i == 0 ? "  root " : "  step " + std::to_string(i) + " ") << m.to_string() << "\n";
      for (int d = 0; d < m.ndim(); ++d) {
        auto groups = m.groups(d);
        out << "    " << m.dim_name(d) << ": " << groups.size() << " groups of " << m.size(d);
        for (std::size_t k = 0; k < groups.size() && k < 8; ++k) out << " " << list(groups[k]);
        if (groups.size() > 8) out << " ...";
        out << "\n";
      }
    }
    out << "checks passed: " << checks_passed << " of " << expected_checks << "; collectives: "
        << report.collectives << "; wall time " << report.seconds << " s\n";
    if (report.ok) {
      out << "OK: every rank's groups match the mesh on every dim\n";
    } else {
      for (const Diagnosis& d : report.failures) {
        out << "FAILED rank " << (d.ranks.empty() ? -1 : d.ranks[0]) << " [" << d.kind << "]: " << d.message << "\n";
      }
      for (const RankReport& r : report.ranks) {
        if (r.status == "stuck") out << "STUCK rank " << r.rank << ": " << r.message << "\n";
      }
    }
  }
  out.flush();
  bool stuck = false;
  for (const RankReport& r : report.ranks) stuck = stuck || r.status == "stuck";
  if (stuck) std::_Exit(code);  // detached rank threads must not outlive main's destructors
  return code;
}

}  // namespace meshsim::run
