// member_communicator.hpp (backends-private) — what every backend's communicator answers the
// same way: its rank in the group, the group's size and global ranks, the backend's name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshsim/communicator.hpp"
#include "meshsim/error.hpp"
#include "meshsim/spmd_backend.hpp"

namespace meshsim::detail {

class MemberCommunicator : public Communicator {
 public:
  // ranks: the group's global ranks, in group order (kept alive by the communicator); rank: this
  // member's index in them.
  MemberCommunicator(std::shared_ptr<const std::vector<int64_t>> ranks, int rank, const char* backend)
      : ranks_(std::move(ranks)), rank_(rank), backend_(backend) {}

  int rank() const final { return rank_; }
  int size() const final { return static_cast<int>(ranks_->size()); }
  const std::vector<int64_t>& global_ranks() const final { return *ranks_; }
  std::string backend() const final { return backend_; }
  const BackendConfig& config() const final { return config_; }
  // set_config records the config the group was made with (new_group calls it once, before the
  // communicator is handed out).
  void set_config(const BackendConfig& c) { config_ = c; }
  // check_peer: `peer` (a group rank) is a member, and for a message (`another`) not this one;
  // OutOfRange naming it, what it is ("send peer", "broadcast root") and the
  // group, in every backend's words.
  void check_peer(int peer, const char* what, bool another) const {
    if (peer < 0 || peer >= size()) {
      throw OutOfRange(std::string(what) + " " + std::to_string(peer) + " is out of range [0, " + std::to_string(size()) +
                       ") of group " + format_ranks(*ranks_));
    }
    if (another && peer == rank_) {
      throw OutOfRange(std::string(what) + " " + std::to_string(peer) + " is this rank itself: a message needs "
                            "another member of group " + format_ranks(*ranks_));
    }
  }

 private:
  std::shared_ptr<const std::vector<int64_t>> ranks_;
  int rank_;
  const char* backend_;
  BackendConfig config_;
};

}  // namespace meshsim::detail
