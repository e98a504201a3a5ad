// meshsim/mesh_communicators.hpp — one rank's communicators for the dims of its meshes.
//
//   MeshCommunicators comms(backend, my_rank);
//   Communicator& tp = comms.get(mesh, mesh.dim_index("tp"));    // created on first use
//   Communicator& again = comms.get(mesh.slice("tp"), 0);        // the same object
//
// The universe's group cache decides when a group is new: a dim's communicator is keyed by its
// cached GroupRecord (canonical dim layout + BackendConfig), so slicing reuses, flatten creates or
// reuses, and unflatten reuses every key realised before (see DeviceMesh::cache_stats). Every
// rank must ask for its groups in the same order (SPMD). When the backend splits (NCCL) and the
// mesh's rank map covers the world, a new dim's groups come from one split_group call per rank,
// in which every world rank takes part.
//
// The torchcomms path: mesh_from_communicators builds a rank's mesh from one communicator per
// dim, and adopt() registers a given communicator for a dim (flatten with a communicator); both
// check each communicator's global ranks against the group the mesh computes for this rank.
//
// Thread safety: one rank's object; not shared between threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "meshsim/communicator.hpp"
#include "meshsim/device_mesh.hpp"

namespace meshsim {

class MeshCommunicators {
 public:
  MeshCommunicators(Backend& backend, int64_t rank);

  int64_t rank() const { return rank_; }
  // get is this rank's communicator along `dim` of `mesh`; FailedPrecondition when the rank is
  // outside the mesh.
  Communicator& get(const DeviceMesh& mesh, int dim);
  // adopt registers `comm` as this rank's communicator for `dim` of `mesh` after checking that
  // its global ranks equal the mesh's group (InvalidArgument naming both otherwise).
  void adopt(const DeviceMesh& mesh, int dim, std::shared_ptr<Communicator> comm);
  // created counts communicators created through the backend by this object.
  int64_t created() const { return created_; }

 private:
  Backend& backend_;
  int64_t rank_;
  int64_t created_ = 0;
  std::vector<std::shared_ptr<const GroupRecord>> records_;  // keeps keys alive
  std::map<const GroupRecord*, std::shared_ptr<Communicator>> by_record_;
};

// check_communicator throws InvalidArgument unless comm's global ranks equal `rank`'s group
// along `dim` of `mesh` (order included: group order is the local-rank order).
void check_communicator(const DeviceMesh& mesh, int dim, int64_t rank, const Communicator& comm);

// mesh_from_communicators is torchcomms' init_device_mesh(comms, names): the shape comes from
// the communicators' sizes; the rank map is assembled by all-gathering along the dims (the last
// dim first), so the ranks exchange what each knows. Every rank of the mesh must call it. The
// result is validated: distinct ranks, and each communicator's global ranks equal the group
// the mesh computes for this rank (PyTorch and torchcomms check nothing).
DeviceMesh mesh_from_communicators(std::span<Communicator* const> dims, MeshNames names,
                                   int64_t rank, RootOptions options = {});

}  // namespace meshsim
