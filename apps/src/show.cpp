#include "meshsim/show.hpp"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <ostream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "meshsim/creation_plan.hpp"
#include "meshsim/group_names.hpp"
#include "meshsim/json_codec.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/error.hpp"
#include "meshsim/placement.hpp"
#include "meshsim/spmd_backend.hpp"
#include "meshsim/svg.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::show {

namespace {

using Json = nlohmann::json;

// kMaxRowValues is how many ranks of one group or mesh row the text output lists.
constexpr int64_t kMaxRowValues = 64;

std::string join_ints(const Json& a) {
  std::string s;
  for (const Json& v : a) s += (s.empty() ? "" : " ") + json::output_text(v);
  return s;
}

// placement_json is {dim: {groups, max_hosts, groups_crossing_hosts, max_domains}} of a mesh.
Json placement_json(const DeviceMesh& m, const placement::Hosts& h) {
  Json j = Json::object();
  for (int d = 0; d < m.ndim(); ++d) {
    const placement::DimPlacement p = placement::place(m, d, h);
    j[m.dim_name(d)] = {{"groups", p.groups}, {"max_hosts", p.max_hosts},
                        {"groups_crossing_hosts", p.groups_crossing_hosts}, {"max_domains", p.max_domains}};
  }
  return j;
}

// print_placement writes one line per dim: how far its widest group spreads, how many cross a host.
void print_placement(const DeviceMesh& m, const placement::Hosts& h, const std::string& indent, std::ostream& out) {
  for (int d = 0; d < m.ndim(); ++d) {
    const placement::DimPlacement p = placement::place(m, d, h);
    out << indent << m.dim_name(d) << ": a group spans at most " << p.max_hosts << (p.max_hosts == 1 ? " host" : " hosts")
        << " (" << p.max_domains << (p.max_domains == 1 ? " domain" : " domains") << "); " << p.groups_crossing_hosts
        << " of " << p.groups << " groups cross a host\n";
  }
}

std::string placement_title(const placement::Hosts& h) {
  return "placement (" + std::to_string(h.gpus_per_host) + " GPUs per host, NVLink domains of " +
         std::to_string(h.nvlink_domain) + ")";
}

// view_mesh is the mesh of a view (the root, or the mesh of its step).
const DeviceMesh& view_mesh(const BuiltMeshes& built, const View& v) {
  return v.step == 0 ? built.root : built.meshes[v.step - 1];
}

// views_json lists the recipe's views: name, mesh_dim_names, shape, groups_by_dim, within the
// answer budget.
Json views_json(const MeshRecipe& recipe, const BuiltMeshes& built, const std::optional<placement::Hosts>& hosts,
                int64_t budget) {
  int64_t left = budget;
  Json out = Json::array();
  for (const View& v : views(recipe)) {
    const DeviceMesh& m = view_mesh(built, v);
    Json g = Json::object();
    for (int d = 0; d < m.ndim(); ++d) {
      if (m.rank_map_size() > left) {
        throw ResourceExhausted("the groups of view " + quote_input(v.name) + " would list " + std::to_string(m.rank_map_size()) +
                                " ranks, over what is left of the budget of " +
                                std::to_string(budget) + " elements (raise it with --max-elements)");
      }
      left -= m.rank_map_size();
      const GroupTable t = m.group_table(d);
      Json rows = Json::array();
      for (int64_t k = 0; k < t.count; ++k) rows.push_back(std::vector<int64_t>(t.row(k).begin(), t.row(k).end()));
      g[m.dim_name(d)] = std::move(rows);
    }
    out.push_back({{"name", v.name}, {"mesh_dim_names", m.names() ? Json(*m.names()) : Json(nullptr)},
                   {"shape", m.shape()}, {"groups_by_dim", std::move(g)}});
    if (hosts) out.back()["placement"] = placement_json(m, *hosts);
  }
  return out;
}

// print_views lists each view the recipe names (when it names more than the root), its first
// groups per dim, and where they land on hosts.
void print_views(const MeshRecipe& recipe, const BuiltMeshes& built, const std::optional<placement::Hosts>& hosts,
                 std::ostream& out) {
  const std::vector<View> vs = views(recipe);
  if (vs.size() < 2) {
    if (hosts) {
      out << "\n" << placement_title(*hosts) << ":\n";
      print_placement(built.result, *hosts, "  ", out);
    }
    return;
  }
  out << "\nviews:\n";
  for (const View& v : vs) {
    const DeviceMesh& m = view_mesh(built, v);
    out << "  " << v.name << ": " << m.to_string() << "\n";
    for (int d = 0; d < m.ndim(); ++d) {
      const GroupTable g = m.group_table_prefix(d, 8, kMaxRowValues);
      const int64_t count = m.rank_map_size() / m.size(d);
      out << "    " << m.dim_name(d) << " (" << count << (count == 1 ? " group of " : " groups of ") << m.size(d)
          << "):";
      for (int64_t k = 0; k < g.count; ++k) out << " " << format_ranks(g.row(k), 16, m.size(d));  // rows cut to kMaxRowValues
      if (count > g.count) out << " ...";
      out << "\n";
    }
    if (hosts) {
      out << "    " << placement_title(*hosts) << ":\n";
      print_placement(m, *hosts, "      ", out);
    }
  }
}

// print_creation_plan lists rank `me`'s process-group calls in order, step by step: at most
// `max_calls` calls per dim (the rest counted), each group cut to kMaxRowValues ranks.
// Each call shows the group's name on that rank (" -> '3'") or what a non-member gets back;
// returns whether the ranks disagree on a name (each disagreement printed as "FAILED group
// names: ...").
bool print_creation_plan(const CreationPlan& plan, int64_t me, int64_t max_calls, std::ostream& out) {
  auto ranks_text = [](std::span<const int64_t> r) { return format_ranks(r, static_cast<std::size_t>(kMaxRowValues)); };
  const GroupNames named = name_groups(plan, me);
  const std::vector<ProgramItem> items = group_program_items(plan);
  std::vector<std::size_t> item_of_batch(plan.batches.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].user) item_of_batch[items[i].index] = i;
  }
  auto gets = [&](std::size_t item, std::size_t k, bool split_or_local) {
    const auto& names = named.items[item].names;
    if (k < names.size() && names[k]) return " -> '" + *names[k] + "'";
    return " -> " + std::string(non_member_result(plan.torch_version, split_or_local));
  };
  int64_t total = 0;
  auto user_calls = [&](std::size_t from, std::size_t to, const char* where) {
    if (from >= to) return;
    out << "  process_groups (" << where << "):\n";
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!items[i].user || items[i].index < from || items[i].index >= to) continue;
      const GroupCallSpec& c = plan.program[items[i].index];
      out << "    " << describe_call(c, items[i].index)
          << gets(i, 0, c.kind == GroupCallSpec::Kind::kSplitGroup || c.local_sync) << "\n";
      ++total;
    }
  };
  out << "creation plan of rank " << me << " as PyTorch " << torch_version_name(plan.torch_version)
      << " makes it (default backend " << plan.default_backend << ", "
      << (plan.accelerator ? "an accelerator" : "no accelerator") << "; bound_device "
      << (plan.options.bound_device ? "true" : "false") << ", new_group_use_split_group "
      << (plan.options.new_group_use_split_group ? "true" : "false") << ", use_torchcomms "
      << (plan.options.use_torchcomms ? "true" : "false") << "):\n";
  const std::size_t at = std::min(plan.mesh_at, plan.program.size());
  user_calls(0, at, "before the mesh");
  for (std::size_t k = 0; k < plan.steps.size(); ++k) {
    const CreationStep& st = plan.steps[k];
    out << "  " << st.view << " (" << st.op << (st.pytorch ? "" : ", meshsim's own") << "): creates " << st.created
        << (st.created == 1 ? " group" : " groups") << ", reuses " << st.reused;
    if (st.created_again) out << "; " << st.created_again << " of them exist already (PyTorch creates them again)";
    out << "\n";
    for (std::size_t bi = 0; bi < plan.batches.size(); ++bi) {
      const CreationBatch& b = plan.batches[bi];
      const std::size_t item = item_of_batch[bi];
      if (b.step != k) continue;
      const std::string tail = ", backend='" + b.backend + "', group_desc='" + b.group_desc + "')";
      if (b.kind == CreationBatch::Kind::kDefault) {
        out << "    " << b.dim << ": the default group (no call) -> '0'\n";
        continue;
      }
      if (b.kind == CreationBatch::Kind::kSplitGroup) {
        const GroupTable t = b.record->table();
        out << "    " << b.dim << ": split_group(parent=default, split_ranks=[";
        for (int64_t g = 0; g < t.count && g < 8; ++g) out << (g ? ", " : "") << ranks_text(t.row(g));
        if (t.count > 8) out << ", ... (" << t.count << " groups)";
        out << "]" << tail << gets(item, 0, true) << "\n";
        ++total;
        continue;
      }
      if (b.group_desc == "mesh_default") {
        out << "    " << b.dim << ": new_group(ranks=range(" << plan.world << ")" << tail << gets(item, 0, false) << "\n";
        ++total;
        continue;
      }
      const GroupTable& t = b.record->table();
      int64_t shown = 0, mine = 0;
      for (int64_t g = 0; g < t.count; ++g) {
        if (!makes_call(b, g, me)) continue;
        ++mine;
        if (shown++ >= max_calls) continue;
        out << "    " << b.dim << ": new_group(ranks=" << ranks_text(t.row(g));
        if (b.local_sync) out << ", use_local_synchronization=True";
        out << tail << (b.via_split ? " (a split of the default group: new_group_use_split_group)" : "")
            << gets(item, static_cast<std::size_t>(mine - 1), b.local_sync) << "\n";
      }
      if (shown > max_calls) out << "    " << b.dim << ": ... " << (shown - max_calls) << " more new_group calls (raise --max-rows)\n";
      total += mine;
    }
  }
  user_calls(at, plan.program.size(), at == 0 && plan.batches.empty() ? "the program" : "after the mesh");
  out << total << (total == 1 ? " call" : " calls") << " on rank " << me << ", in this order (a rank that makes them in "
      << "another order hangs in them)\n";
  for (const NameProblem& p : named.problems) out << "FAILED group names: " << p.message << "\n";
  if (named.problem_count > static_cast<int64_t>(named.problems.size())) {
    out << "FAILED group names: ... and " << (named.problem_count - static_cast<int64_t>(named.problems.size()))
        << " more\n";
  }
  return named.problem_count > 0;
}

// read_process_groups takes --process-groups (JSON, or @FILE) into the recipe.
void read_process_groups(const std::string& flag, MeshRecipe& recipe, const BuiltMeshes& built) {
  std::string text = flag;
  if (text[0] == '@') text = read_text_file(text.substr(1), kMaxRecipeFileBytes, "--process-groups");
  if (json::max_nesting(text) > 64) throw ParseError("--process-groups: the JSON nests deeper than 64 levels");
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ParseError("--process-groups " + quote_input(flag) + " is not valid JSON");
  const int64_t world = recipe.world_size > 0 ? recipe.world_size : built.root.world_size().value_or(built.root.rank_map_size());
  GroupProgram g = process_groups_from_json(j, world, recipe.root.torch_version);
  recipe.process_groups = std::move(g.calls);
  recipe.mesh_at = g.mesh_at;
}

}  // namespace

int run(const Options& o, std::ostream& out) {
  if (o.max_rows < 0 || o.max_rows > INT32_MAX) {
    throw OutOfRange("--max-rows " + std::to_string(o.max_rows) + " is out of range [0, 2^31)");
  }
  text::check_format(o.format);
  const std::optional<placement::Hosts> hosts = placement::from_flags(o.placement);
  MeshRecipe recipe = recipe_from_flags(o.recipe);
  const bool setup = o.bound_device || o.new_group_use_split_group || o.use_torchcomms;
  if (setup && !o.creation_plan) {
    throw InvalidArgument("--bound-device, --new-group-use-split-group and --use-torchcomms apply to --creation-plan");
  }
  if (o.bound_device) recipe.root.creation.bound_device = *o.bound_device;
  if (o.new_group_use_split_group) recipe.root.creation.new_group_use_split_group = *o.new_group_use_split_group;
  if (o.use_torchcomms) recipe.root.creation.use_torchcomms = *o.use_torchcomms;
  if (o.default_backend) recipe.root.default_backend = *o.default_backend;
  if (o.device_type) recipe.root.device_type = *o.device_type;
  if (o.torch_version) recipe.root.torch_version = parse_torch_version(*o.torch_version);
  BuiltMeshes built = apply_flags(recipe, o.recipe);
  if (!o.process_groups.empty()) {
    if (!o.creation_plan) throw InvalidArgument("--process-groups applies to --creation-plan");
    read_process_groups(o.process_groups, recipe, built);
  }
  if (o.color_dim && o.svg_file.empty()) throw InvalidArgument("--color-dim needs --svg FILE");
  // Warnings go to stderr (the JSON answer carries them too), so stdout stays the answer.
  for (const std::string& w : shown_warnings(built.warnings)) std::cerr << "meshsim show: warning: " << w << "\n";
  std::vector<std::string> broken;
  if (hosts) {
    // Every view is placed, not only the result: a recipe's views share the hosts.
    std::vector<DeviceMesh> all{built.root};
    all.insert(all.end(), built.meshes.begin(), built.meshes.end());
    placement::check_required(*hosts, all);
    broken = placement::violations(*hosts, all);
  }
  if (o.creation_plan) {
    if (built.root.rank_map_size() > kMaxEnumeration) {
      throw ResourceExhausted("the rank map holds " + std::to_string(built.root.rank_map_size()) +
                              " ranks, over the limit of " + std::to_string(kMaxEnumeration) +
                              " whose groups meshsim show --creation-plan lists");
    }
    if (o.format == "json") {
      Json result{{"creation_plan", query::describe(recipe, built, {"creation_plan"}, o.max_elements)["creation_plan"]}};
      if (!built.warnings.empty()) result["warnings"] = shown_warnings(built.warnings);
      out << "{\n";
      std::size_t i = 0;
      for (const auto& [k, v] : result.items()) {
        out << "  " << json::output_text(Json(k)) << ": " << json::short_dump(v, SIZE_MAX) << (++i < result.size() ? ",\n" : "\n");
      }
      out << "}\n";
      return result["creation_plan"]["problem_count"].get<int64_t>() > 0 ? 1 : 0;
    }
    return print_creation_plan(creation_plan(recipe, built), recipe.rank.value_or(0), o.max_rows, out) ? 1 : 0;
  }
  const DeviceMesh& m = built.result;
  if (o.format == "text" && m.rank_map_size() > kMaxEnumeration) {
    throw ResourceExhausted("the rank map holds " + std::to_string(m.rank_map_size()) +
                            " ranks, over the limit of " + std::to_string(kMaxEnumeration) +
                            " that meshsim show lists");
  }
  // The picture is written once every input has been accepted, and whole or not at all: a
  // refused command leaves an existing file as it was.
  if (!o.svg_file.empty()) {
    write_file_whole(o.svg_file, svg::draw(built.result, {.color_dim = o.color_dim, .hosts = hosts,
                                                          .rank = recipe.rank.value_or(0)}), "--svg");
  }
  if (o.format == "json") {
    std::vector<std::string> want{"mesh_dim_names", "layout", "shape", "size", "groups_by_dim",
                                  "coordinate_by_rank", "mesh_by_rank"};
    if (recipe.rank) want.insert(want.end(), {"coordinate", "my_groups"});
    Json result = query::describe(recipe, built, want, o.max_elements);
    result["views"] = views_json(recipe, built, hosts, o.max_elements);
    if (!built.warnings.empty()) result["warnings"] = shown_warnings(built.warnings);
    if (hosts) {
      result["placement"] = placement_json(built.result, *hosts);
      result["placement_failures"] = broken;
    }
    out << "{\n";
    std::size_t i = 0;
    for (const auto& [k, v] : result.items()) {
      out << "  " << json::output_text(Json(k)) << ": " << json::short_dump(v, SIZE_MAX)
          << (++i < result.size() ? ",\n" : "\n");
    }
    out << "}\n";
    return broken.empty() ? 0 : 1;
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
  // The mesh array as the rank sees it, one row per last-dim row: only the rows printed are
  // computed (a show costs what it prints, not the world).
  const int64_t row = m.ndim() ? m.size(m.ndim() - 1) : 1;
  const int64_t total_rows = m.size() / row;
  if (!m.contains(me) && m.copies() != 1) {
    out << "mesh: rank " << me << " is not in any copy of this mesh\n";
  } else {
    out << "mesh (as seen by rank " << me << "):\n";
    const int nd = m.ndim();
    const std::vector<int64_t> shape = m.shape();
    for (int64_t i = 0; i < total_rows; ++i) {
      if (!budget(out)) break;
      std::string label;
      int64_t idx = i;
      std::vector<int64_t> c(static_cast<std::size_t>(std::max(nd - 1, 0)));
      for (int d = nd - 2; d >= 0; --d) {
        c[static_cast<std::size_t>(d)] = idx % shape[static_cast<std::size_t>(d)];
        idx /= shape[static_cast<std::size_t>(d)];
      }
      for (int d = 0; d + 1 < nd; ++d) label += m.dim_name(d) + "=" + std::to_string(c[d]) + " ";
      out << "  " << label << "| ";
      // Rows past kMaxRowValues ranks are cut, their size printed.
      const std::vector<int64_t> values = *m.mesh_values(me, i * row, std::min(row, kMaxRowValues));
      for (std::size_t k = 0; k < values.size(); ++k) out << (k ? " " : "") << values[k];
      if (row > kMaxRowValues) out << " ... (" << row << " ranks)";
      out << "\n";
    }
  }
  rows_left = o.max_rows;
  out << "\ngroups:\n";
  for (int d = 0; d < m.ndim(); ++d) {
    const int64_t count = m.rank_map_size() / m.size(d);
    const GroupTable g = m.group_table_prefix(d, o.max_rows, kMaxRowValues);
    out << "  " << m.dim_name(d) << " (size " << m.size(d) << ", " << count << " groups):";
    for (int64_t k = 0; k < g.count; ++k) {
      out << " [";
      for (std::size_t j = 0; j < g.row(k).size(); ++j) out << (j ? " " : "") << g.row(k)[j];
      if (g.size < m.size(d)) out << " ... (" << m.size(d) << " ranks)";
      out << "]";
    }
    if (count > g.count) out << " ...";
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
  // The smallest ranks first, only as many as are printed (plus one to know there are more).
  const int64_t want = std::min(m.rank_map_size(), o.max_rows + 1);
  std::vector<int64_t> ranks(static_cast<std::size_t>(want));
  if (auto start = m.rank_map_start()) {
    for (int64_t i = 0; i < want; ++i) ranks[static_cast<std::size_t>(i)] = *start + i;
  } else {
    const std::vector<int64_t> all = m.rank_map();
    std::partial_sort_copy(all.begin(), all.end(), ranks.begin(), ranks.end());
  }
  for (int64_t r : ranks) {
    if (!budget(out)) break;
    out << "  " << std::setw(8) << r;
    auto c = m.coordinate(r);
    for (int d = 0; d < m.ndim(); ++d) out << " " << std::setw(6) << (*c)[static_cast<std::size_t>(d)];
    out << "\n";
  }
  print_views(recipe, built, hosts, out);
  for (const std::string& b : broken) out << "FAILED placement: " << b << "\n";
  return broken.empty() ? 0 : 1;
}

}  // namespace meshsim::show
