// step/src/step_check.hpp — the step's check over its programs: agreement (every group's members
// issue the same collectives in order, step_check.cpp), progress (the event loop that steps the
// simulated ranks under rendezvous or eager sends, step_check.cpp, and the wait cycle named when
// it stops, step_diagnosis.cpp), and the bytes each dim moves per link (link_bytes.cpp).
//
// A rank's program depends only on its pp coordinate (and a planted fault), so the checker holds
// one program per pp rank and a copy per faulted rank.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meshsim/step_program.hpp"
#include "step_internal.hpp"

namespace meshsim::step::detail {

// Simulation: the ranks a progress check steps through and where each one stands.
struct Simulation {
  std::vector<int64_t> set;                        // the simulated ranks, ascending
  std::unordered_map<int64_t, std::size_t> index;  // rank -> its place in set
  std::vector<const std::vector<Event>*> prog;
  std::vector<std::size_t> pc;  // each rank's next event
  std::vector<bool> arrived;    // registered at its current collective
  // A rank's posted sends and receives: [pc, end) (one, or a batch_isend_irecv's run of events of
  // one batch, posted together), each done or not; end <= pc when none is posted.
  std::vector<std::size_t> end;
  std::vector<std::vector<char>> done;
  // head: the rank's next event not done (in its posted batch, the first still waiting).
  const Event* head(std::size_t i) const {
    if (pc[i] >= prog[i]->size()) return nullptr;
    if (end[i] > pc[i]) {
      for (std::size_t k = 0; k < done[i].size(); ++k) {
        if (!done[i][k]) return &(*prog[i])[pc[i] + k];
      }
    }
    return &(*prog[i])[pc[i]];
  }
  // peer_index: the simulated index of the peer of a send or receive, if simulated.
  std::optional<std::size_t> peer_index(const Parallel& p, std::size_t i, const Event& e) const {
    const auto it = index.find(with_pp(p, set[i], e.peer));
    if (it == index.end()) return std::nullopt;
    return it->second;
  }
};

class Checker {
 public:
  // Builds one program per pp rank and the faulted ranks' copies (ResourceExhausted past kMaxEvents).
  Checker(const Job& job, const StageLayout& layout, const Options& o);

  const std::vector<Event>& program_of(int64_t rank) const {
    if (auto it = faulted_.find(rank); it != faulted_.end()) return it->second;
    return base_[pp_coordinate(p_, rank)];
  }
  // class_of: -1 - faulted index for a faulted rank, else its pp coordinate.
  int64_t class_of(int64_t rank) const {
    if (auto it = faulted_.find(rank); it != faulted_.end()) return -2 - std::distance(faulted_.begin(), it);
    return pp_coordinate(p_, rank);
  }
  int64_t programs() const { return static_cast<int64_t>(base_.size() + faulted_.size()); }

  // check_agreement: every group of every dim the default set (or every rank) touches.
  void check_agreement(Report& r);
  // simulate: steps the simulated ranks until all finish or none can move (then diagnose_stuck).
  void simulate(Report& r);
  // links: the bytes every dim's collectives move inside a host and across hosts.
  void links(int64_t gpus, Report& r) const;

 private:
  // agree checks one group: every member issues the same collectives on it, in order.
  bool agree(Dim d, int64_t rank, Report& r);
  int64_t nth_member(Dim d, int64_t lead, int64_t k) const { return member_at(p_, d, lead, k); }
  static std::vector<const Event*> projection(const std::vector<Event>& prog, Dim d);
  void diagnose_stuck(const Simulation& sim, Report& r) const;
  std::size_t longest() const;

  struct Arrival {
    int64_t expected = 0;
    std::vector<std::size_t> waiting;  // simulated indexes
  };

  const Job& job_;
  const Parallel& p_;
  const Options& o_;
  int64_t world_ = 0;
  std::vector<std::vector<Event>> base_;
  std::map<int64_t, std::vector<Event>> faulted_;
  std::set<std::pair<int, int64_t>> checked_;
};

}  // namespace meshsim::step::detail
