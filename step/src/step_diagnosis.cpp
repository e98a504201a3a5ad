// The progress check's diagnosis: when the simulated ranks stop with events left, the wait-for
// graph (a rank in a collective waits for the first member of its group not there yet, a rank in
// a send or receive for its peer) followed to its cycle, each rank's wait named.
#include <algorithm>
#include <map>
#include <string>

#include "step_check.hpp"

namespace meshsim::step::detail {

// diagnose_stuck: ranks left with events when no rank can move are in a wait cycle (or wait for
// a rank outside the simulated set): the first cycle found, each rank's wait in words.
void Checker::diagnose_stuck(const Simulation& sim, Report& r) const {
  const auto& set = sim.set;
  const auto& index = sim.index;
  const auto& arrived = sim.arrived;
  const auto& pc = sim.pc;
  const std::size_t n = set.size();
  auto head = [&](std::size_t i) { return sim.head(i); };
  auto peer_index = [&](std::size_t i, const Event& e) { return sim.peer_index(p_, i, e); };
  std::vector<std::size_t> stuck;
  for (std::size_t i = 0; i < n; ++i) {
    if (head(i)) stuck.push_back(i);
  }
  if (stuck.empty()) return;
  // The wait-for graph: a rank in a collective waits for the first member of its group (in
  // the simulated set) not there yet; a rank in a send or receive waits for its peer.
  auto waits_for = [&](std::size_t i) -> std::optional<std::size_t> {
    const Event& e = *head(i);
    if (is_p2p(e.op)) return peer_index(i, e);
    const int64_t lead = leader(p_, e.dim, set[i]);
    for (std::size_t k = 0; k < n; ++k) {
      const int64_t m = set[k];
      if (k == i || leader(p_, e.dim, m) != lead) continue;
      const auto it = index.find(m);
      const Event* h = head(it->second);
      if (!h || !arrived[it->second] || h->dim != e.dim || leader(p_, h->dim, m) != leader(p_, e.dim, set[i])) {
        return it->second;
      }
    }
    return std::nullopt;
  };
  auto waiting_text = [&](std::size_t i) {
    const Event& e = *head(i);
    std::string s = "rank " + std::to_string(set[i]) + " waits in its ";
    if (e.op == Op::kSend) s += "send to rank " + std::to_string(with_pp(p_, set[i], e.peer));
    else if (e.op == Op::kRecv) s += "receive from rank " + std::to_string(with_pp(p_, set[i], e.peer));
    else s += std::string(op_name(e.op)) + " on its " + group_text(job_, e.dim, set[i]);
    return s + " (" + describe(e) + ", its event #" + std::to_string(pc[i] + 1) + ")";
  };
  // Follow the waits from the first stuck rank (a faulted or named one when stuck) until one
  // repeats: that is the cycle.
  std::vector<std::size_t> path;
  std::map<std::size_t, std::size_t> seen;
  std::optional<std::size_t> at = stuck.front();
  for (std::size_t i : stuck) {
    if (faulted_.count(set[i]) || std::find(o_.ranks.begin(), o_.ranks.end(), set[i]) != o_.ranks.end()) {
      at = i;
      break;
    }
  }
  while (at && head(*at) && !seen.count(*at)) {
    seen.emplace(*at, path.size());
    path.push_back(*at);
    at = waits_for(*at);
  }
  std::vector<std::size_t> cycle;
  if (at && seen.count(*at)) cycle.assign(path.begin() + static_cast<std::ptrdiff_t>(seen[*at]), path.end());
  else cycle = path;
  r.ok = false;
  r.ranks.clear();
  for (std::size_t c : cycle) r.ranks.push_back(set[c]);
  std::sort(r.ranks.begin(), r.ranks.end());
  std::string text;
  const std::size_t shown = std::min<std::size_t>(cycle.size(), 6);
  for (std::size_t k = 0; k < shown; ++k) text += (k ? "; " : "") + waiting_text(cycle[k]);
  if (shown < cycle.size()) text += "; ... (" + std::to_string(cycle.size()) + " ranks in the cycle)";
  r.diagnosis = "FAILED: the step cannot progress (" +
                std::string(send_semantics_name(o_.semantics)) + " sends): " + text;
}

}  // namespace meshsim::step::detail
