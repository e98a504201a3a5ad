// store_diagnosis.hpp (backends-private) — the diagnosis module's part over the Store, for
// the transports whose ranks live in several processes (Gloo, NCCL): what the store says about
// a failed collective, and the census by which the members of a group learn who never arrived.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/spmd_backend.hpp"
#include "meshsim/store.hpp"

namespace meshsim::detail {

// store_diagnosis reads why a collective of `group` failed under rank `me` from the store: the
// run's published diagnosis ("<prefix>/failure"), or a member whose process ended abruptly (its
// will, "<prefix>/exit/<rank>"; or, on a store without wills such as PyTorch's, a member whose
// "<prefix>/rank/<rank>" = "<host> <pid>" (claim_rank) names a process on this host that is gone);
// nullopt when the store holds none of these (or is unreachable). `where` describes the
// collective for the message.
std::optional<Diagnosis> store_diagnosis(Store& store, const std::string& prefix, const std::vector<int64_t>& group,
                                         int64_t me, const std::string& where);

// lost_store_diagnosis probes the store (one write of "<prefix>/probe/<me>"): when it cannot be
// reached, a "store" diagnosis saying `me` failed in `where` (`what`: its error) and could not
// reach the store; nullopt when the store answers. A transport whose own failure (a connect
// timeout) hides that the store died under it names the store this way.
std::optional<Diagnosis> lost_store_diagnosis(Store& store, const std::string& prefix, int64_t me,
                                              const std::string& where, const std::string& what);

// unstarted_diagnosis names, at a deadline, the members of `group` that never reached the
// store: no process claimed their rank ("<prefix>/rank/<r>", claim_rank) while `me` did. A stall
// naming them: "rank 2 never arrived: no process claimed rank 2 in the store (it never reached
// the store); rank 3 waited 4000 ms in <where>". nullopt when every member claimed its rank,
// when `me` holds no claim (a run whose ranks do not claim), or when the store cannot answer.
std::optional<Diagnosis> unstarted_diagnosis(Store& store, const std::string& prefix, const std::vector<int64_t>& group,
                                             int64_t me, const std::string& where, std::chrono::milliseconds waited);

// CensusFacts: one collective that failed under rank `me`.
struct CensusFacts {
  Store* store = nullptr;
  std::string prefix;          // the run's keys: "<prefix>/failure", "<prefix>/departed/<r>", ...
  std::string collective_key;  // names this collective of this group instance in the run
  std::vector<int64_t> group;  // global ranks, in group order
  int64_t me = 0;
  CollectiveDesc desc;
  uint64_t seq = 0;  // the collective's number in the group, from 0 (collective_label)
  std::chrono::milliseconds timeout{0};
  bool across_processes = false;  // false: every member runs in this process
};

// census_diagnosis says why the transport failed under `me` (`what`: its error; timed_out: the
// wait passed its deadline; late: `me` entered the collective a whole timeout ago). In order:
// - across processes, when every other member had already recorded waiting here before `me`
//   arrived (and `me` is not late): a stall naming `me`;
// - across processes, `me` records waiting here ("<prefix>/stall/<collective_key>/<me>"); a
//   store that cannot be reached is the diagnosis ("store");
// - then, for up to min(3 s, timeout), every 20 ms: the diagnosis `recorded` gives (one this
//   process already has), or the store's (store_diagnosis), until every member is accounted for
//   (recorded waiting, or departed);
// - the members that departed without entering ("departed"), else those that never recorded
//   waiting ("stall", naming them; `me` waited).
// nullopt: nobody can be blamed (the caller reports the transport's error). When every member
// runs here (!across_processes), close() runs first, so the peers fail too.
std::optional<Diagnosis> census_diagnosis(const CensusFacts& f, const std::string& what, bool timed_out, bool late,
                                          const std::function<std::optional<Diagnosis>()>& recorded,
                                          const std::function<void()>& close);

// JoinFacts: a communicator that `me` failed to create (NCCL's init or split), whose members
// each counted themselves in under "<key>.joined/<k>" (k: the member's index in `group`) before
// waiting for the others.
struct JoinFacts {
  Store* store = nullptr;
  std::string prefix;          // the run's keys, as CensusFacts::prefix
  std::string key;             // this communicator's join keys
  std::vector<int64_t> group;  // the ranks that must join
  int64_t me = 0;
  std::chrono::milliseconds settle{1000};  // how long a peer's failure may take to reach the store
};

// join_census_diagnosis says why `me` failed (`what`, after `waited`) `where` (e.g. "creating
// the NCCL communicator of group [0, 1]"): the store's diagnosis (store_diagnosis, within the
// settle), a lost store, a member whose process never reached the store, else the members that
// never counted themselves in ("stall: ... never joined (<what>)"); nullopt when every member
// joined (the transport's own error says why) or the store cannot answer.
std::optional<Diagnosis> join_census_diagnosis(const JoinFacts& f, const std::string& what, std::chrono::milliseconds waited,
                                               const std::string& where);

}  // namespace meshsim::detail
