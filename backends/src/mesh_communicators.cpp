#include "meshsim/mesh_communicators.hpp"

#include <algorithm>

#include "meshsim/error.hpp"

namespace meshsim {

namespace {
std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
}  // namespace

MeshCommunicators::MeshCommunicators(Backend& backend, int64_t rank)
    : backend_(backend), rank_(rank) {}

Communicator& MeshCommunicators::get(const DeviceMesh& mesh, int dim) {
  std::optional<std::vector<int64_t>> group = mesh.group_of(rank_, dim);
  if (!group) {
    throw FailedPrecondition("rank " + std::to_string(rank_) + " is not in " + mesh.to_string() +
                             ", so it has no communicator along dim " + mesh.dim_name(dim));
  }
  std::shared_ptr<const GroupRecord> rec = mesh.group_record(dim);
  auto it = by_record_.find(rec.get());
  if (it != by_record_.end()) return *it->second;
  // A dim over the whole world is one split of the world communicator where the backend
  // prefers that (every world rank asks for its group here at once: SPMD).
  const bool split = backend_.splits_world() && mesh.rank_map_size() == backend_.world_size();
  std::shared_ptr<Communicator> comm = split ? backend_.split_group(rank_, *group, rec->config)
                                             : backend_.new_group(rank_, *group, rec->config);
  ++created_;
  records_.push_back(rec);
  return *by_record_.emplace(rec.get(), std::move(comm)).first->second;
}

void MeshCommunicators::adopt(const DeviceMesh& mesh, int dim, std::shared_ptr<Communicator> comm) {
  if (!comm) throw InvalidArgument("adopt: no communicator given for dim " + mesh.dim_name(dim));
  check_communicator(mesh, dim, rank_, *comm);
  std::shared_ptr<const GroupRecord> rec = mesh.group_record(dim);
  records_.push_back(rec);
  by_record_.insert_or_assign(rec.get(), std::move(comm));
}

void check_communicator(const DeviceMesh& mesh, int dim, int64_t rank, const Communicator& comm) {
  std::optional<std::vector<int64_t>> group = mesh.group_of(rank, dim);
  if (!group) {
    throw InvalidArgument("rank " + std::to_string(rank) + " is not in " + mesh.to_string());
  }
  if (comm.global_ranks() != *group) {
    throw InvalidArgument("the communicator given for dim " + mesh.dim_name(dim) + " of rank " +
                          std::to_string(rank) + " holds ranks " + list(comm.global_ranks()) +
                          " but the mesh's group is " + list(*group) + " (" + mesh.to_string() + ")");
  }
}

DeviceMesh mesh_from_communicators(std::span<Communicator* const> dims, MeshNames names,
                                   int64_t rank, RootOptions options) {
  if (dims.empty()) throw InvalidArgument("mesh_from_communicators: needs one communicator per dim");
  std::vector<int64_t> shape;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (!dims[d]) throw InvalidArgument("mesh_from_communicators: communicator " + std::to_string(d) + " is null");
    const auto& g = dims[d]->global_ranks();
    if (g[static_cast<std::size_t>(dims[d]->rank())] != rank) {
      throw InvalidArgument("mesh_from_communicators: communicator " + std::to_string(d) +
                            " places rank " + std::to_string(g[static_cast<std::size_t>(dims[d]->rank())]) +
                            " at this rank's position, not rank " + std::to_string(rank));
    }
    shape.push_back(dims[d]->size());
  }
  // Gather along the last dim, then the block along the one before, and so on: afterwards every
  // rank holds the whole mesh in row-major order.
  std::vector<int64_t> block{rank};
  for (std::size_t d = dims.size(); d-- > 0;) {
    std::vector<int64_t> next(block.size() * static_cast<std::size_t>(dims[d]->size()));
    dims[d]->all_gather(std::span<const int64_t>(block), std::span<int64_t>(next));
    block = std::move(next);
  }
  DeviceMesh mesh = DeviceMesh::from_ranks(shape, block, std::move(names), std::move(options));
  for (std::size_t d = 0; d < dims.size(); ++d) check_communicator(mesh, static_cast<int>(d), rank, *dims[d]);
  return mesh;
}

}  // namespace meshsim
