#include "program.hpp"

#include "meshsim/error.hpp"

namespace meshsim::check::detail {

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

void run_program(Engine& e) {
  e.world();
  e.exit_point();
  for (std::size_t i = 0; i < e.mesh_count(); ++i) e.agree(i);
  e.creation();
  for (std::size_t i = 0; i < e.mesh_count(); ++i) {
    for (int d = 0; d < e.ndim(i); ++d) e.dim(i, d);
    if (i == 0) e.throw_point();
  }
  e.throw_point();
  e.agreement();
}

namespace checks {

std::string where(std::size_t mesh, const DeviceMesh& m, int d) {
  return "mesh " + std::to_string(mesh) + " " + m.to_string() + " dim " + m.dim_name(d);
}

int64_t group_sum(std::span<const int64_t> group) {
  int64_t want = 0;
  for (int64_t g : group) want += g + 1;
  return want;
}

int64_t of_rank(const std::vector<DeviceMesh>& meshes, int64_t rank) {
  int64_t n = 0;
  for (const DeviceMesh& m : meshes) n += m.contains(rank) ? kPerDim * m.ndim() : 0;
  return n;
}

int64_t total(const std::vector<DeviceMesh>& meshes) {
  int64_t n = 0;
  for (const DeviceMesh& m : meshes) n += kPerDim * m.ndim() * m.rank_map_size();
  return n;
}

bool world_right(int64_t world, int64_t rank_sum, int64_t count) {
  return rank_sum == world * (world - 1) / 2 && count == world;
}

std::string creation_wrong(const CreationPlan& plan, const CreationPlan& own, const std::vector<const CreationBatch*>& mine) {
  const std::vector<const CreationBatch*> want = creation_order(plan, -1);
  std::size_t k = 0;
  while (k < mine.size() && k < want.size() && describe_batch(own, *mine[k]) == describe_batch(plan, *want[k])) ++k;
  if (k == mine.size() && k == want.size()) {
    return "group creation: its process-group calls differ from the plan's within a dim (the calls of a fake dim's "
           "members, or their order)";
  }
  std::string out = "group creation: its process-group calls leave the plan at creation " + std::to_string(k + 1) + " of " +
                    std::to_string(want.size()) + ": it makes ";
  out += k < mine.size() ? describe_batch(own, *mine[k]) : std::string("no more calls");
  out += " where every rank makes ";
  out += k < want.size() ? describe_batch(plan, *want[k]) : std::string("no more calls");
  return out + " (ranks that create groups in different orders hang in new_group)";
}

std::string world_wrong(int64_t rank_sum, int64_t count) {
  return "world all_reduce of (rank, 1) gave (" + std::to_string(rank_sum) + ", " + std::to_string(count) + ")";
}

std::string members_wrong(const std::string& where, std::span<const int64_t> held, std::span<const int64_t> group) {
  return where + ": the communicator holds " + format_ranks(held) + ", the mesh says " + format_ranks(group);
}

std::string gathered_wrong(const std::string& where, std::span<const int64_t> got, std::span<const int64_t> group) {
  return where + ": all_gather of ranks returned " + format_ranks(got) + ", the mesh says " + format_ranks(group);
}

std::string sum_wrong(const std::string& where, int64_t got, int64_t want) {
  return where + ": all_reduce(sum) of rank+1 gave " + std::to_string(got) + ", expected " + std::to_string(want);
}

std::string agreement_wrong(int64_t total, int64_t expected) {
  return "global agreement: ranks ran " + std::to_string(total) + " checks, the recipe predicts " + std::to_string(expected);
}

std::string planted_throw(int64_t rank) { return "planted fault: rank " + std::to_string(rank) + " throws mid-run"; }

}  // namespace checks

}  // namespace meshsim::check::detail
