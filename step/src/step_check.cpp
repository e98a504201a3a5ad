// The step's check: the programs built, every group's agreement, and the progress event loop.
#include "step_check.hpp"

#include <algorithm>
#include <deque>
#include <string>

#include "meshsim/error.hpp"
#include "meshsim/stop.hpp"
#include "step_builder.hpp"

namespace meshsim::step::detail {

Checker::Checker(const Job& job, const StageLayout& layout, const Options& o) : job_(job), p_(job.parallel), o_(o) {
  world_ = world_size(p_);
  const auto builder = make_builder(job, layout);
  int64_t total = 0;
  for (int64_t pp = 0; pp < p_.pp; ++pp) {
    base_.push_back(builder->build(pp));
    total += static_cast<int64_t>(base_.back().size());
    if (total > kMaxEvents) {
      throw ResourceExhausted("the step's programs hold over " + std::to_string(kMaxEvents) +
                              " events (pp ranks x layers x microbatches): check fewer microbatches or layers");
    }
  }
  // A faulted rank's program is a copy of its pp rank's: the copies count against the same bound.
  for (const Fault& f : o.faults) {
    auto it = faulted_.find(f.rank);
    if (it == faulted_.end()) {
      const std::vector<Event>& base = base_[pp_coordinate(p_, f.rank)];
      total += static_cast<int64_t>(base.size());
      if (total > kMaxEvents) {
        throw ResourceExhausted("the step's programs with " + std::to_string(faulted_.size() + 1) +
                                " faulted ranks (each a copy of its program) hold over " + std::to_string(kMaxEvents) +
                                " events: plant fewer faults, or check fewer microbatches or layers");
      }
      it = faulted_.emplace(f.rank, base).first;
    }
    apply_fault(job, f, it->second);
  }
}

// agree checks one group: every member issues the same collectives on it, in order.
bool Checker::agree(Dim d, int64_t rank, Report& r) {
  const int64_t lead = leader(p_, d, rank);
  if (!checked_.insert({static_cast<int>(d), lead}).second) return true;
  ++r.groups_checked;
  // The members' classes without listing the members (a group may hold millions): a non-pp
  // group shares one pp coordinate, so its classes are that coordinate's and its faulted
  // members'; a pp group has one member per pp coordinate.
  std::map<int64_t, int64_t> classes;  // class -> its lowest member
  std::set<int64_t> faulted_here;
  for (const auto& [f, _] : faulted_) {
    if (leader(p_, d, f) == lead) faulted_here.insert(f);
  }
  if (d == Dim::kPp) {
    for (int64_t pp = 0; pp < p_.pp; ++pp) {
      const int64_t m = with_pp(p_, lead, pp);
      classes.emplace(class_of(m), m);
    }
  } else {
    for (int64_t f : faulted_here) classes.emplace(class_of(f), f);
    // The lowest member that is not faulted, if any: walk the group in order past the faulted.
    if (static_cast<int64_t>(faulted_here.size()) < dim_size(p_, d)) {
      int64_t m = lead;
      for (std::size_t k = 0; faulted_here.count(m); ++k) m = nth_member(d, lead, static_cast<int64_t>(k) + 1);
      classes.emplace(class_of(m), m);
    }
  }
  if (classes.size() < 2) return true;
  // The reference: the lowest member that is not faulted (else the lowest member).
  int64_t ref = -1;
  for (const auto& [cls, m] : classes) {
    if (!faulted_.count(m) && (ref < 0 || m < ref)) ref = m;
  }
  if (ref < 0) {
    for (const auto& [cls, m] : classes) ref = ref < 0 ? m : std::min(ref, m);
  }
  const auto ref_events = projection(program_of(ref), d);
  for (const auto& [cls, m] : classes) {
    if (cls == class_of(ref)) continue;
    const auto other = projection(program_of(m), d);
    const std::size_t n = std::min(ref_events.size(), other.size());
    for (std::size_t i = 0; i <= n; ++i) {
      if (i < n && same_collective(*ref_events[i], *other[i])) continue;
      if (i == n && ref_events.size() == other.size()) break;
      r.ok = false;
      r.ranks = {std::min(ref, m), std::max(ref, m)};
      const std::string where = group_text(job_, d, lead);
      const std::string nth = "collective #" + std::to_string(i + 1);
      if (i < n) {
        r.diagnosis = "FAILED: rank " + std::to_string(m) + " and rank " + std::to_string(ref) + " disagree on their " +
                      where + " at its " + nth + ": rank " + std::to_string(m) + " issues " + describe(*other[i]) +
                      ", rank " + std::to_string(ref) + " issues " + describe(*ref_events[i]);
      } else {
        const bool ref_longer = ref_events.size() > other.size();
        const int64_t more = ref_longer ? ref : m, fewer = ref_longer ? m : ref;
        const Event& next = ref_longer ? *ref_events[i] : *other[i];
        r.diagnosis = "FAILED: rank " + std::to_string(fewer) + " issues " + std::to_string(n) +
                      " collectives on its " + where + ", rank " + std::to_string(more) + " issues " +
                      std::to_string(std::max(ref_events.size(), other.size())) + ": rank " + std::to_string(more) +
                      "'s " + nth + ", " + describe(next) + ", is never met";
      }
      return false;
    }
  }
  return true;
}

std::vector<const Event*> Checker::projection(const std::vector<Event>& prog, Dim d) {
  std::vector<const Event*> out;
  for (const Event& e : prog) {
    if (e.dim == d && !is_p2p(e.op)) out.push_back(&e);
  }
  return out;
}

void Checker::check_agreement(Report& r) {
  std::vector<int64_t> seeds;
  if (o_.all_ranks) {
    for (int d = 0; d < kDims; ++d) {
      if (dim_size(p_, static_cast<Dim>(d)) < 2) continue;
      for (int64_t rank = 0; rank < world_; ++rank) {
        if (leader(p_, static_cast<Dim>(d), rank) == rank && !agree(static_cast<Dim>(d), rank, r)) return;
      }
    }
    return;
  }
  for (int64_t pp = 0; pp < p_.pp; ++pp) seeds.push_back(with_pp(p_, 0, pp));
  for (const auto& [rank, _] : faulted_) seeds.push_back(rank);
  for (int64_t rank : o_.ranks) seeds.push_back(rank);
  seeds.push_back(o_.rank);
  for (int d = 0; d < kDims; ++d) {
    if (dim_size(p_, static_cast<Dim>(d)) < 2) continue;
    for (int64_t s : seeds) {
      if (!agree(static_cast<Dim>(d), s, r)) return;
    }
  }
}

void Checker::simulate(Report& r) {
  std::vector<int64_t> set;
  if (o_.all_ranks) {
    if (checked_mul(world_, static_cast<int64_t>(longest()), "the simulation's events") > kMaxSimulatedEvents) {
      throw ResourceExhausted("simulating every rank steps through over " + std::to_string(kMaxSimulatedEvents) +
                              " events: leave out --ranks all (one program per pp rank is exact for a step "
                              "without faults) or name fewer ranks");
    }
    set.resize(world_);
    for (int64_t i = 0; i < world_; ++i) set[i] = i;
  } else {
    std::set<int64_t> s;
    auto add_pipeline = [&](int64_t rank) {
      for (int64_t pp = 0; pp < p_.pp; ++pp) s.insert(with_pp(p_, rank, pp));
    };
    add_pipeline(o_.rank);
    for (const auto& [rank, _] : faulted_) add_pipeline(rank);
    for (int64_t rank : o_.ranks) add_pipeline(rank);
    set.assign(s.begin(), s.end());
    if (checked_mul(static_cast<int64_t>(set.size()), static_cast<int64_t>(longest()), "the simulation's events") >
        kMaxSimulatedEvents) {
      throw ResourceExhausted("simulating the pipelines of " + std::to_string(set.size()) + " ranks steps through over " +
                              std::to_string(kMaxSimulatedEvents) + " events: name fewer --ranks");
    }
  }
  r.ranks_simulated = static_cast<int64_t>(set.size());
  const std::size_t n = set.size();
  Simulation sim;
  sim.set = set;
  auto& index = sim.index;
  index.reserve(n * 2);
  for (std::size_t i = 0; i < n; ++i) index.emplace(set[i], i);
  sim.prog.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    if ((i & 255) == 0) check_stop();
    sim.prog[i] = &program_of(set[i]);
  }
  auto& pc = sim.pc;
  pc.assign(n, 0);
  auto& arrived = sim.arrived;
  arrived.assign(n, false);
  sim.end.assign(n, 0);
  sim.done.assign(n, {});
  std::map<std::pair<int, int64_t>, Arrival> arrivals;
  // Eager sends in flight per (from, to): the events, in order.
  std::map<std::pair<std::size_t, std::size_t>, std::deque<const Event*>> in_flight;
  std::deque<std::size_t> ready;
  for (std::size_t i = 0; i < n; ++i) ready.push_back(i);
  auto head = [&](std::size_t i) { return sim.head(i); };
  // The members of a group in the simulated set: all of it when every rank runs, else those
  // of the set on it (the set is a few pipeline groups), counted once per group.
  std::map<std::pair<int, int64_t>, int64_t> expected_cache;
  auto expected_members = [&](Dim d, int64_t lead) {
    if (o_.all_ranks) return dim_size(p_, d);
    auto [it, fresh] = expected_cache.try_emplace({static_cast<int>(d), lead}, 0);
    if (fresh) {
      for (int64_t m : set) it->second += leader(p_, d, m) == lead ? 1 : 0;
    }
    return it->second;
  };
  auto peer_index = [&](std::size_t i, const Event& e) { return sim.peer_index(p_, i, e); };
  // p2p_fail reports a send met by a receive that is not its own (another size or microbatch).
  auto p2p_fail = [&](std::size_t s, const Event& se, std::size_t t, const Event& re) {
    r.ok = false;
    r.ranks = {std::min(set[s], set[t]), std::max(set[s], set[t])};
    r.diagnosis = "FAILED: rank " + std::to_string(set[s]) + "'s send to rank " + std::to_string(set[t]) + ", " +
                  describe(se) + ", meets rank " + std::to_string(set[t]) + "'s receive " + describe(re);
  };
  auto matches = [](const Event& s, const Event& rcv) {
    return s.bytes == rcv.bytes && s.dtype == rcv.dtype && s.microbatch == rcv.microbatch &&
           std::string_view(s.what) == rcv.what;
  };
  // open_window posts the rank's next sends and receives: its head, or the run of its batch.
  auto open_window = [&](std::size_t i) {
    if (sim.end[i] > pc[i]) return;
    const auto& p = *sim.prog[i];
    std::size_t e = pc[i] + 1;
    if (const int32_t b = p[pc[i]].batch; b >= 0) {
      while (e < p.size() && p[e].batch == b && is_p2p(p[e].op)) ++e;
    }
    sim.end[i] = e;
    sim.done[i].assign(e - pc[i], 0);
  };
  // close_window: once every posted op is done, the rank moves past them.
  auto close_window = [&](std::size_t i) {
    if (sim.end[i] <= pc[i]) return false;
    for (char d : sim.done[i]) {
      if (!d) return false;
    }
    pc[i] = sim.end[i];
    sim.done[i].clear();
    return true;
  };
  while (!ready.empty() && r.ok) {
    check_stop();
    const std::size_t i = ready.front();
    ready.pop_front();
    while (r.ok) {
      const Event* e = head(i);
      if (!e || arrived[i]) break;
      if (!is_p2p(e->op)) {
        const auto key = std::make_pair(static_cast<int>(e->dim), leader(p_, e->dim, set[i]));
        auto [it, fresh] = arrivals.try_emplace(key);
        if (fresh) it->second.expected = expected_members(e->dim, key.second);
        it->second.waiting.push_back(i);
        arrived[i] = true;
        if (static_cast<int64_t>(it->second.waiting.size()) == it->second.expected) {
          for (std::size_t w : it->second.waiting) {
            arrived[w] = false;
            ++pc[w];
            if (w != i) ready.push_back(w);
          }
          arrivals.erase(it);
          continue;
        }
        break;
      }
      // Sends and receives: the rank posts its next one, or a batch's run of them together
      // (batch_isend_irecv), and goes on once each has met its peer's (rendezvous) or, eager,
      // once its receives have their messages.
      open_window(i);
      const std::size_t base = pc[i];
      const auto& mine = *sim.prog[i];
      for (std::size_t k = 0; k < sim.done[i].size() && r.ok; ++k) {
        if (sim.done[i][k]) continue;
        const Event& o = mine[base + k];
        const auto peer = peer_index(i, o);
        if (!peer) continue;  // outside the simulated set: waits forever (diagnosed below)
        const std::size_t j = *peer;
        if (o_.semantics == SendSemantics::kEager) {
          if (o.op == Op::kSend) {
            in_flight[{i, j}].push_back(&o);
            sim.done[i][k] = 1;
            if (const Event* h = head(j); h && is_p2p(h->op) && !arrived[j]) ready.push_back(j);
            continue;
          }
          auto it = in_flight.find({j, i});
          if (it == in_flight.end() || it->second.empty()) continue;
          const Event* snd = it->second.front();
          if (!matches(*snd, o)) {
            p2p_fail(j, *snd, i, o);
            break;
          }
          it->second.pop_front();
          sim.done[i][k] = 1;
          continue;
        }
        // Rendezvous: the first waiting op of the peer's posted ones toward this rank, of the
        // other kind, is this one's partner.
        const Event* h = head(j);
        if (!h || !is_p2p(h->op) || arrived[j]) continue;
        open_window(j);
        const int64_t me = pp_coordinate(p_, set[i]);
        const Op want = o.op == Op::kSend ? Op::kRecv : Op::kSend;
        for (std::size_t q = 0; q < sim.done[j].size(); ++q) {
          const Event& t = (*sim.prog[j])[pc[j] + q];
          if (sim.done[j][q] || t.peer != me || t.op != want) continue;
          const Event& se = o.op == Op::kSend ? o : t;
          const Event& re = o.op == Op::kSend ? t : o;
          if (!matches(se, re)) {
            if (o.op == Op::kSend) p2p_fail(i, se, j, re);
            else p2p_fail(j, se, i, re);
            break;
          }
          sim.done[i][k] = 1;
          sim.done[j][q] = 1;
          if (close_window(j)) ready.push_back(j);
          break;
        }
      }
      if (!r.ok) break;
      if (close_window(i)) continue;
      break;
    }
  }
  if (!r.ok) return;
  diagnose_stuck(sim, r);
}

std::size_t Checker::longest() const {
  std::size_t m = 0;
  for (const auto& b : base_) m = std::max(m, b.size());
  for (const auto& [_, f] : faulted_) m = std::max(m, f.size());
  return m;
}

}  // namespace meshsim::step::detail
