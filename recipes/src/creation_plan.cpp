#include "meshsim/creation_plan.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "meshsim/digest.hpp"
#include "meshsim/error.hpp"
#include "meshsim/group_names.hpp"

namespace meshsim {

namespace {

// Planner records each dim's calls as PyTorch's DeviceMesh makes them; its walks (a recipe's
// steps, a universe's creation log) say which dims of which meshes are made.
struct Planner {
  CreationPlan plan;
  std::set<const GroupRecord*> created;         // records some earlier batch created

  void setup(const DeviceMesh& root, const CreationOptions& options, int64_t world) {
    plan.options = options;
    plan.accelerator = root.device_type() != "cpu" && root.device_type() != "meta";
    plan.default_backend = !root.default_backend().empty() ? root.default_backend() : plan.accelerator ? "nccl" : "gloo";
    plan.world = world;
    plan.torch_version = root.torch_version();
  }

  static int64_t groups_of(const DeviceMesh& m, int d) { return m.rank_map_size() / m.size(d); }

  static std::string torch_dim_name(const DeviceMesh& m, int d) {
    return m.names() ? (*m.names())[static_cast<std::size_t>(d)] : "dim_" + std::to_string(d);
  }

  void reuse(CreationStep& s, const DeviceMesh& m, int d) { s.reused += groups_of(m, d); }

  // init_one is _init_one_process_group for dim d of mesh `m`, made by step `step`.
  void init_one(CreationStep& s, std::size_t step, const DeviceMesh& m, int d) {
    CreationBatch b;
    b.step = step;
    b.dim = torch_dim_name(m, d);
    b.group_desc = "mesh_" + b.dim;
    b.config = m.backend_config(d);
    b.backend = b.config.backend.empty() ? plan.default_backend : b.config.backend;
    b.record = m.group_record(d);
    const CreationOptions& o = plan.options;
    const int64_t count = groups_of(m, d);
    b.groups = count;
    if (m.size(d) == plan.world && b.config == BackendConfig{}) {
      // A dim as large as the world, with no override: the default group, or on an accelerator
      // machine whose default backend is gloo, one new_group of every rank.
      if (plan.accelerator && plan.default_backend == "gloo") {
        b.kind = CreationBatch::Kind::kNewGroup;
        b.group_desc = "mesh_default";
        s.created += 1;
      } else {
        b.kind = CreationBatch::Kind::kDefault;
        s.reused += 1;
        plan.batches.push_back(std::move(b));
        return;
      }
    } else if ((o.bound_device || o.use_torchcomms) && plan.accelerator &&
               (b.config.backend.empty() || b.config.backend == plan.default_backend)) {
      if (!can_split(plan.default_backend)) {
        throw FailedPrecondition(
            "dim " + quote_input(b.dim) + " of " + s.view + ": with the default group bound to a device, PyTorch "
            "creates its groups with split_group on the default group, and the default backend " +
            quote_input(plan.default_backend) + " cannot split (\"No backend for the parent process group or its "
            "backend does not support splitting\"); bind no device (bound_device false) or use a backend that splits "
            "(nccl, gloo)");
      }
      b.kind = CreationBatch::Kind::kSplitGroup;
      b.backend = plan.default_backend;
      s.created += count;
    } else {
      b.kind = CreationBatch::Kind::kNewGroup;
      b.local_sync = o.use_torchcomms && b.config.backend == "fake";
      b.via_split = o.new_group_use_split_group;
      if (b.via_split && !can_split(plan.default_backend)) {
        throw FailedPrecondition(
            "dim " + quote_input(b.dim) + " of " + s.view + ": new_group_use_split_group makes each new_group a "
            "split of the default group, and the default backend " + quote_input(plan.default_backend) +
            " cannot split (\"No backend for the parent process group or its backend does not support splitting\")");
      }
      s.created += count;
    }
    if (!created.insert(b.record.get()).second) s.created_again += b.kind == CreationBatch::Kind::kDefault ? 0 : count;
    plan.batches.push_back(std::move(b));
  }

};

// RecipeWalk walks a recipe as PyTorch would run it, step by step.
struct RecipeWalk {
  const MeshRecipe& recipe;
  const BuiltMeshes& built;
  Planner& p;
  std::vector<bool> has_groups;                 // per mesh: root, then one per step
  std::map<std::string, Layout> flattened;      // flatten names registered so far

  const DeviceMesh& mesh(std::size_t i) const { return i == 0 ? built.root : built.meshes[i - 1]; }
  void reuse(CreationStep& s, const DeviceMesh& m, int d) { p.reuse(s, m, d); }
  void init_one(CreationStep& s, std::size_t step, const DeviceMesh& m, int d) { p.init_one(s, step, m, d); }

  void run() {
    const RootSpec& r = recipe.root;
    const DeviceMesh& root = built.root;
    p.setup(root, r.creation, recipe.world_size > 0 ? recipe.world_size : root.rank_map_size());
    CreationPlan& plan = p.plan;
    const bool logical = r.kind == RootSpec::Kind::kLogical;

    CreationStep s0;
    s0.view = "root";
    switch (r.kind) {
      case RootSpec::Kind::kInit: s0.op = "init_device_mesh"; break;
      case RootSpec::Kind::kRanks: s0.op = "DeviceMesh"; break;
      case RootSpec::Kind::kGroup: s0.op = "from_group"; break;
      case RootSpec::Kind::kLogical: s0.op = "from_logical"; s0.pytorch = false; break;
    }
    if (r.kind == RootSpec::Kind::kGroup) {
      for (int d = 0; d < root.ndim(); ++d) reuse(s0, root, d);  // the handed groups
      has_groups.push_back(true);
    } else if (!logical && root.init_backend()) {
      for (int d = 0; d < root.ndim(); ++d) init_one(s0, 0, root, d);
      has_groups.push_back(true);
    } else {
      has_groups.push_back(false);
    }
    plan.steps.push_back(std::move(s0));

    std::map<std::string, std::size_t> handles{{"root", 0}};
    std::size_t last = 0;
    auto index_of = [&](const std::string& h) { return h == "_last" ? last : handles.at(h); };
    for (std::size_t k = 0; k < recipe.steps.size(); ++k) {
      const StepSpec& st = recipe.steps[k];
      const std::size_t src = index_of(st.on);
      const std::size_t me = k + 1;
      const DeviceMesh& m = mesh(me);
      const DeviceMesh& from = mesh(src);
      CreationStep s;
      s.view = st.let ? *st.let : "ops[" + std::to_string(k) + "]";
      bool groups = has_groups[src];
      auto reuse_all = [&] {
        if (groups) {
          for (int d = 0; d < m.ndim(); ++d) reuse(s, m, d);
        }
      };
      switch (st.kind) {
        case StepSpec::Kind::kSlice: s.op = "slice"; reuse_all(); break;
        case StepSpec::Kind::kConcatenate:
          s.op = "concatenate";
          groups = has_groups[index_of(st.handles.front())];
          reuse_all();
          break;
        case StepSpec::Kind::kFindFlattened: s.op = "find_flattened"; s.pytorch = false; groups = true; reuse_all(); break;
        case StepSpec::Kind::kTranspose: s.op = "transpose"; s.pytorch = false; reuse_all(); break;
        case StepSpec::Kind::kReshape: s.op = "reshape"; s.pytorch = false; reuse_all(); break;
        case StepSpec::Kind::kFlatten: {
          s.op = "flatten";
          const std::string name = m.dim_name(0);
          if (from.ndim() == 1 && from.names() && from.dim_name(0) == name) {
            reuse_all();  // a 1-D mesh flattened into its own name is itself
          } else if (logical) {
            groups = false;  // meshsim's from_logical: no groups at all
          } else if (flattened.count(name)) {
            groups = true;
            reuse_all();  // flattened before with the same layout (apply refused another)
          } else {
            flattened.emplace(name, m.layout());
            groups = true;
            init_one(s, me, m, 0);
          }
          break;
        }
        case StepSpec::Kind::kUnflatten: {
          s.op = "unflatten";
          const int first = st.dim_name ? from.dim_index(*st.dim_name) : static_cast<int>(st.dim_index);
          const int count = static_cast<int>(st.sizes.size());
          for (int d = 0; d < m.ndim() && groups; ++d) {
            if (d >= first && d < first + count) {
              init_one(s, me, m, d);
            } else {
              reuse(s, m, d);
            }
          }
          break;
        }
      }
      has_groups.push_back(groups);
      if (st.let) handles[*st.let] = me;
      last = me;
      plan.steps.push_back(std::move(s));
    }
  }
};

}  // namespace

int64_t CreationBatch::calls() const {
  switch (kind) {
    case Kind::kDefault: return 0;
    case Kind::kSplitGroup: return 1;
    case Kind::kNewGroup: return group_desc == "mesh_default" ? 1 : groups;
  }
  return 0;
}

CreationPlan creation_plan(const MeshRecipe& recipe, const BuiltMeshes& built) {
  Planner p;
  RecipeWalk{recipe, built, p, {}, {}}.run();
  p.plan.program = recipe.process_groups;
  p.plan.mesh_at = std::min(recipe.mesh_at, recipe.process_groups.size());
  return std::move(p.plan);
}

CreationPlan creation_plan(const DeviceMesh& mesh, const CreationOptions& options, int64_t world) {
  const DeviceMesh root = mesh.root();
  if (world < 0) throw InvalidArgument("creation_plan: world size " + std::to_string(world) + " is negative");
  if (world > 0) {
    const std::vector<int64_t> ranks = root.rank_map();
    const int64_t top = ranks.empty() ? -1 : *std::max_element(ranks.begin(), ranks.end());
    if (top >= world) {
      throw InvalidArgument("creation_plan: world size " + std::to_string(world) + " does not hold rank " +
                            std::to_string(top) + " of " + root.to_string());
    }
  }
  Planner p;
  p.setup(root, options, world > 0 ? world : root.world_size().value_or(root.rank_map_size()));
  const std::vector<GroupCreationEvent> events = mesh.creation_events();
  for (std::size_t k = 0; k < events.size(); ++k) {
    const GroupCreationEvent& e = events[k];
    const DeviceMesh m = mesh.event_mesh(e);
    CreationStep s;
    s.op = e.what;
    s.view = "call " + std::to_string(k + 1);
    // A mesh of a universe built without process groups unflattens without making any
    // (PyTorch: the mesh has no _dim_group_names); meshsim's from_logical (device meta, no
    // groups) makes none at all.
    const bool logical = !root.init_backend() && root.device_type() == "meta";
    const bool makes = e.creates && !logical && (e.op != GroupCreationEvent::Op::kUnflatten || root.init_backend());
    for (int d = 0; d < m.ndim(); ++d) {
      const bool mine = d >= e.first && d < e.first + e.count;
      if (makes && mine) {
        p.init_one(s, k, m, d);
      } else if ((e.op == GroupCreationEvent::Op::kFlatten && !logical) || root.init_backend()) {
        p.reuse(s, m, d);
      }
    }
    p.plan.steps.push_back(std::move(s));
  }
  return std::move(p.plan);
}

bool makes_call(const CreationBatch& b, int64_t group, int64_t rank) {
  if (!b.local_sync) return true;
  for (int64_t r : b.record->table().row(group)) {
    if (r == rank) return true;
  }
  return false;
}

std::string_view kind_name(CreationBatch::Kind k) {
  switch (k) {
    case CreationBatch::Kind::kDefault: return "default";
    case CreationBatch::Kind::kNewGroup: return "new_group";
    case CreationBatch::Kind::kSplitGroup: return "split_group";
  }
  return "?";
}

bool can_split(std::string_view backend) { return backend == "nccl" || backend == "gloo" || backend == "fake"; }

std::vector<const CreationBatch*> creation_order(const CreationPlan& plan, int64_t swap) {
  std::vector<const CreationBatch*> order;
  for (const CreationBatch& b : plan.batches) {
    if (b.kind != CreationBatch::Kind::kDefault) order.push_back(&b);
  }
  if (swap >= 0 && static_cast<std::size_t>(swap) + 1 < order.size()) {
    std::swap(order[static_cast<std::size_t>(swap)], order[static_cast<std::size_t>(swap) + 1]);
  }
  return order;
}

uint64_t creation_digest(const CreationPlan& plan, int64_t swap) {
  Fnv1a f;
  for (const CreationBatch* b : creation_order(plan, swap)) {
    f.u64(static_cast<uint64_t>(b->kind));
    f.str(b->dim);
    f.str(b->group_desc);
    f.str(b->backend);
    f.u64(b->config.fingerprint());
    f.str(b->record->name);
    f.u64(b->local_sync);
    f.u64(b->via_split);
    f.u64(static_cast<uint64_t>(b->groups));
  }
  return f.value();
}

using Json = nlohmann::json;

// creation_plan_json is the recipe's creation plan as `me` makes it: the options that decide
// it, each step's counts, and the rank's calls in order, one object a call.
Json creation_plan_json(const CreationPlan& plan, int64_t me, const Charge& budget) {
  const GroupNames named = name_groups(plan, me);
  const std::vector<ProgramItem> items = group_program_items(plan);
  const TorchVersion v = plan.torch_version;
  // named_call adds what rank `me`'s PyTorch gets back from the call: the group's name, or the
  // non-member's result.
  auto named_call = [v](Json& c, const std::optional<std::string>& name, bool split_or_local) {
    c["group_name"] = name ? Json(*name) : Json(nullptr);
    c["result"] = name ? std::string("ProcessGroup") : std::string(non_member_result(v, split_or_local));
  };
  Json calls = Json::array();
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::vector<std::optional<std::string>>& names = named.items[i].names;
    if (items[i].user) {
      const GroupCallSpec& u = plan.program[items[i].index];
      const bool split = u.kind == GroupCallSpec::Kind::kSplitGroup;
      int64_t members = 0;
      for (const auto& row : u.split_ranks) members += static_cast<int64_t>(row.size());
      budget(1, split ? members : u.ranks ? static_cast<int64_t>(u.ranks->size()) : 0, 9);
      Json c{{"call", split ? "split_group" : "new_group"}, {"source", "process_groups[" + std::to_string(items[i].index) + "]"},
             {"group_desc", u.group_desc ? Json(*u.group_desc) : Json("undefined")}};
      if (split) {
        c["parent"] = "default";
        c["split_ranks"] = u.split_ranks;
      } else {
        c["ranks"] = u.ranks ? Json(*u.ranks) : Json(nullptr);
        c["use_local_synchronization"] = u.local_sync;
      }
      named_call(c, names.empty() ? std::nullopt : names.front(), split || u.local_sync);
      calls.push_back(std::move(c));
      continue;
    }
    const CreationBatch& b = plan.batches[items[i].index];
    const std::string& view = plan.steps[b.step].view;
    Json base{{"call", std::string(kind_name(b.kind))}, {"dim", b.dim}, {"view", view}, {"group_desc", b.group_desc}};
    if (b.kind == CreationBatch::Kind::kDefault) {
      budget(1, 0, 5);
      base["group_name"] = "0";  // init_process_group's default group
      calls.push_back(std::move(base));
      continue;
    }
    base["backend"] = b.backend;
    if (b.kind == CreationBatch::Kind::kSplitGroup) {
      budget(b.groups, meshsim::size(b.record->layout), 3);
      const GroupTable& t = b.record->table();
      Json rows = Json::array();
      for (int64_t g = 0; g < t.count; ++g) rows.push_back(std::vector<int64_t>(t.row(g).begin(), t.row(g).end()));
      base["parent"] = "default";
      base["split_ranks"] = std::move(rows);
      named_call(base, names.empty() ? std::nullopt : names.front(), true);
      calls.push_back(std::move(base));
      continue;
    }
    base["use_local_synchronization"] = b.local_sync;
    base["new_group_use_split_group"] = b.via_split;
    if (b.group_desc == "mesh_default") {
      budget(1, plan.world, 10);
      std::vector<int64_t> all(static_cast<std::size_t>(plan.world));
      for (int64_t r = 0; r < plan.world; ++r) all[static_cast<std::size_t>(r)] = r;
      base["ranks"] = std::move(all);
      named_call(base, names.empty() ? std::nullopt : names.front(), false);
      calls.push_back(std::move(base));
      continue;
    }
    const GroupTable& t = b.record->table();
    std::size_t k = 0;
    for (int64_t g = 0; g < t.count; ++g) {
      if (!makes_call(b, g, me)) continue;
      budget(1, t.size, 10);
      Json c = base;
      c["ranks"] = std::vector<int64_t>(t.row(g).begin(), t.row(g).end());
      named_call(c, k < names.size() ? names[k] : std::nullopt, b.local_sync);
      ++k;
      calls.push_back(std::move(c));
    }
  }
  Json steps = Json::array();
  for (const CreationStep& s : plan.steps) {
    budget(1, 0, 6);
    steps.push_back(Json{{"op", s.op}, {"view", s.view}, {"created", s.created}, {"reused", s.reused},
                         {"created_again", s.created_again}, {"pytorch", s.pytorch}});
  }
  Json problems = Json::array();
  for (const NameProblem& p : named.problems) {
    budget(1, 0, 3);
    problems.push_back(Json{{"kind", p.kind == NameProblem::Kind::kMembersDisagree ? "members_disagree" : "name_shared"},
                            {"call", p.call},
                            {"message", p.message}});
  }
  return Json{{"rank", me},
              {"torch_version", std::string(torch_version_name(v))},
              {"options", {{"bound_device", plan.options.bound_device},
                           {"new_group_use_split_group", plan.options.new_group_use_split_group},
                           {"use_torchcomms", plan.options.use_torchcomms},
                           {"default_backend", plan.default_backend},
                           {"accelerator", plan.accelerator}}},
              {"steps", std::move(steps)},
              {"calls", std::move(calls)},
              {"problems", std::move(problems)},
              {"problem_count", named.problem_count}};
}

std::string describe_batch(const CreationPlan& plan, const CreationBatch& b) {
  const CreationStep& s = plan.steps[b.step];
  std::string out(kind_name(b.kind));
  if (b.kind == CreationBatch::Kind::kNewGroup && b.calls() > 1) out += " x" + std::to_string(b.calls());
  return out + " for dim " + quote_input(b.dim) + " of " + s.view + " (" + s.op + ", backend " + b.backend + ", groups " +
         b.record->name + ")";
}

}  // namespace meshsim
