#include <algorithm>
#include <thread>

#include "meshsim/error.hpp"
#include "meshsim/spmd_backend.hpp"
#include "rank_registry.hpp"
#include "store_diagnosis.hpp"

namespace meshsim {

namespace {

constexpr std::pair<DiagnosisKind, std::string_view> kKindNames[] = {
    {DiagnosisKind::kError, "error"},     {DiagnosisKind::kMismatch, "mismatch"}, {DiagnosisKind::kStall, "stall"},
    {DiagnosisKind::kMesh, "mesh"},       {DiagnosisKind::kDeparted, "departed"}, {DiagnosisKind::kCheck, "check"},
    {DiagnosisKind::kExit, "exit"},       {DiagnosisKind::kStore, "store"},       {DiagnosisKind::kConnect, "connect"},
    {DiagnosisKind::kAssertion, "assertion"}};

}  // namespace

std::string_view to_string(DiagnosisKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

std::optional<DiagnosisKind> diagnosis_kind(std::string_view name) {
  for (const auto& [k, n] : kKindNames) {
    if (n == name) return k;
  }
  return std::nullopt;
}

std::string collective_label(const std::string& call, uint64_t number) { return call + " #" + std::to_string(number); }

std::string collective_label(const CollectiveDesc& d, uint64_t number) { return collective_label(d.to_string(), number); }

namespace {

std::string ranks_phrase(const std::vector<int64_t>& r) {
  return r.size() == 1 ? "rank " + std::to_string(r[0]) : "ranks " + format_ranks(r);
}

}  // namespace

Diagnosis departed_diagnosis(std::vector<int64_t> gone, const std::string& collective, std::span<const int64_t> group,
                             std::vector<int64_t> waiting) {
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  if (waiting.empty()) {
    for (int64_t g : group) {
      if (!std::binary_search(gone.begin(), gone.end(), g)) waiting.push_back(g);
    }
  }
  std::sort(waiting.begin(), waiting.end());
  std::string msg = ranks_phrase(gone) + " ended " + (gone.size() == 1 ? "its program" : "their programs") +
                    " without joining " + collective + " of group " + format_ranks(group);
  if (!waiting.empty()) msg += " (" + ranks_phrase(waiting) + (waiting.size() == 1 ? " waits" : " wait") + " for it)";
  return Diagnosis{DiagnosisKind::kDeparted, std::move(gone), std::move(msg), {}, {}};
}

Diagnosis mesh_diagnosis(std::vector<int64_t> odd, const std::vector<std::string>& parts, bool against_recipe,
                         const std::string& built) {
  std::sort(odd.begin(), odd.end());
  std::string what;
  for (const std::string& p : parts) what += (what.empty() ? "" : ", ") + p;
  std::string msg = ranks_phrase(odd) + " built a different mesh than " + (against_recipe ? "the recipe's" : "the other ranks'") +
                    ": its " + what + (parts.size() == 1 ? " differs" : " differ") + " (this rank built " + built + ")";
  return Diagnosis{DiagnosisKind::kMesh, std::move(odd), std::move(msg), {}, {}};
}

std::string message_label(const CollectiveDesc& d, uint64_t nth, int64_t src, int64_t dst) {
  return d.to_string() + " #" + std::to_string(nth) + " from rank " + std::to_string(src) + " to rank " + std::to_string(dst);
}

Diagnosis p2p_mismatch_diagnosis(std::span<const int64_t> group, int64_t src, const std::string& send, int64_t dst,
                                 const std::string& recv) {
  return Diagnosis{DiagnosisKind::kMismatch,
                   {src, dst},
                   "send/recv mismatch in group " + format_ranks(group) + ": rank " + std::to_string(src) + " called " +
                       send + ", rank " + std::to_string(dst) + " called " + recv,
                   {},
                   {}};
}

Diagnosis mismatch_diagnosis(const std::string& at, std::span<const int64_t> group,
                             std::vector<std::pair<std::string, std::vector<int64_t>>> calls) {
  // One order whoever writes it: each call's ranks sorted, the calls by their lowest rank.
  for (auto& c : calls) std::sort(c.second.begin(), c.second.end());
  std::sort(calls.begin(), calls.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::size_t most = 0;
  for (const auto& c : calls) most = std::max(most, c.second.size());
  std::size_t holders = 0;
  for (const auto& c : calls) holders += c.second.size() == most;
  std::vector<int64_t> culprits;
  std::string msg = "collective mismatch at " + at + " of group " + format_ranks(group) + ":";
  // The first calls are listed, the rest counted: a line does not grow with the world.
  constexpr std::size_t kListedCalls = 16;
  std::size_t listed = 0;
  for (const auto& [call, ranks] : calls) {
    if (listed++ < kListedCalls) msg += " " + ranks_phrase(ranks) + " called " + call + ";";
    if (ranks.size() < most || holders > 1) culprits.insert(culprits.end(), ranks.begin(), ranks.end());
  }
  if (calls.size() > kListedCalls) msg += " ... and " + std::to_string(calls.size() - kListedCalls) + " more different calls;";
  msg.pop_back();
  std::sort(culprits.begin(), culprits.end());
  return Diagnosis{DiagnosisKind::kMismatch, culprits, msg, {}, {}};
}

double SpmdBackend::oldest_wait() const {
  double oldest = 0;
  for (const WaitInfo& w : waits()) oldest = std::max(oldest, w.seconds);
  return oldest;
}

void SpmdBackend::run_ranks(const std::function<void(int64_t)>&) {
  throw InvalidArgument("backend '" + name() + "' does not run ranks itself (its runner starts a thread per rank)");
}

}  // namespace meshsim

namespace meshsim::detail {

std::optional<Diagnosis> store_diagnosis(Store& store, const std::string& prefix, const std::vector<int64_t>& group,
                                         int64_t me, const std::string& where) {
  if (auto f = lookup_key(store, prefix + "/failure")) {
    if (auto d = decode_diagnosis(*f)) return d;
  }
  for (int64_t g : group) {
    if (g == me) continue;
    if (auto e = lookup_key(store, prefix + "/exit/" + std::to_string(g))) {
      return Diagnosis{DiagnosisKind::kExit, {g},
                       "rank " + std::to_string(g) + " exited abruptly (" + *e + ") while rank " + std::to_string(me) +
                           " was in " + where,
                       {}, {}};
    }
    if (auto p = lookup_key(store, prefix + "/rank/" + std::to_string(g))) {
      const auto space = p->rfind(' ');
      if (space != std::string::npos && p->substr(0, space) == this_host()) {
        const std::string pid = p->substr(space + 1);
        if (!pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos && !process_alive(pid)) {
          return Diagnosis{DiagnosisKind::kExit, {g},
                           "rank " + std::to_string(g) + " exited abruptly (its process " + pid + " on this host is gone) while rank " +
                               std::to_string(me) + " was in " + where,
                           {}, {}};
        }
      }
    }
  }
  return std::nullopt;
}

std::optional<Diagnosis> unstarted_diagnosis(Store& store, const std::string& prefix, const std::vector<int64_t>& group,
                                             int64_t me, const std::string& where, std::chrono::milliseconds waited) {
  try {
    if (!lookup_key(store, prefix + "/rank/" + std::to_string(me))) return std::nullopt;
    std::vector<int64_t> never;
    for (int64_t g : group) {
      if (g != me && !lookup_key(store, prefix + "/rank/" + std::to_string(g))) never.push_back(g);
    }
    if (never.empty()) return std::nullopt;
    const std::string who = never.size() == 1 ? "rank " + std::to_string(never[0]) : "ranks " + rank_list(never);
    return Diagnosis{DiagnosisKind::kStall, never,
                     "stall: " + who + " never arrived: no process claimed " + (never.size() == 1 ? "it" : "them") +
                         " in the store (" + (never.size() == 1 ? "it" : "they") + " never reached the store); rank " +
                         std::to_string(me) + " waited " + std::to_string(waited.count()) + " ms in " + where,
                     {me}, never};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {

bool holds(const CensusFacts& f, const std::string& key) { return lookup_key(*f.store, f.prefix + "/" + key).has_value(); }

}  // namespace

std::optional<Diagnosis> lost_store_diagnosis(Store& store, const std::string& prefix, int64_t me,
                                              const std::string& where, const std::string& what) {
  try {
    store.set(prefix + "/probe/" + std::to_string(me), "");
    return std::nullopt;
  } catch (const Unavailable& e) {
    return Diagnosis{DiagnosisKind::kStore, {},
                     "the store was lost: rank " + std::to_string(me) + " failed in " + where + " (" + what +
                         ") and could not reach the store: " + e.what(),
                     {}, {}};
  } catch (const DeadlineExceeded& e) {
    return Diagnosis{DiagnosisKind::kStore, {},
                     "the store was lost: rank " + std::to_string(me) + " failed in " + where + " (" + what +
                         ") and could not reach the store: " + e.what(),
                     {}, {}};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {

// never_came: `me` waited `waited` (`waited_where`: "in <collective>" or what it was doing) for
// `missing`, who never came (`came`: "arrived" or "joined (<error>)"): a member whose process
// never reached the store is named as such (unstarted_diagnosis), else a stall naming them.
Diagnosis never_came(Store& store, const std::string& prefix, const std::vector<int64_t>& missing, int64_t me,
                     const std::string& where, const std::string& waited_where, std::chrono::milliseconds waited,
                     const std::string& came) {
  if (auto dg = unstarted_diagnosis(store, prefix, missing, me, where, waited)) return *dg;
  return Diagnosis{DiagnosisKind::kStall, missing,
                   "stall: rank " + std::to_string(me) + " waited " + std::to_string(waited.count()) + " ms " +
                       waited_where + "; " +
                       (missing.size() == 1 ? "rank " + std::to_string(missing[0]) : "ranks " + rank_list(missing)) +
                       " never " + came,
                   {me}, missing};
}

}  // namespace

std::optional<Diagnosis> join_census_diagnosis(const JoinFacts& f, const std::string& what, std::chrono::milliseconds waited,
                                               const std::string& where) {
  using Clock = std::chrono::steady_clock;
  Store& store = *f.store;
  // A member whose process ended, or the run's diagnosis, may reach the store a moment later.
  const auto settle = Clock::now() + f.settle;
  for (;;) {
    if (auto dg = store_diagnosis(store, f.prefix, f.group, f.me, where)) return dg;
    if (Clock::now() >= settle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (auto dg = lost_store_diagnosis(store, f.prefix, f.me, where, what)) return dg;
  std::vector<int64_t> missing;
  try {
    for (std::size_t i = 0; i < f.group.size(); ++i) {
      const int64_t g = f.group[i];
      if (g != f.me && store.add(f.key + ".joined/" + std::to_string(i), 0) == 0) missing.push_back(g);
    }
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (missing.empty()) return std::nullopt;  // every member came: the transport's own error says why
  return never_came(store, f.prefix, missing, f.me, where, where, waited, "joined (" + what + ")");
}

std::optional<Diagnosis> census_diagnosis(const CensusFacts& f, const std::string& what, bool timed_out, bool late,
                                          const std::function<std::optional<Diagnosis>()>& recorded,
                                          const std::function<void()>& close) {
  using Clock = std::chrono::steady_clock;
  const std::string where = collective_label(f.desc, f.seq) + " of group " + rank_list(f.group);
  const auto settle = Clock::now() + std::min<std::chrono::milliseconds>(std::chrono::milliseconds(3000), f.timeout);
  // Across processes, a rank that timed out tells the store it was waiting here and keeps its
  // connections open while its peers time out too (closing them would make the peers fail for
  // another reason and never say they were waiting); then the members that never said so are
  // the ones that never arrived. (Every failure counts, not only timeouts: a transport's
  // deadlines are per wait, so a rank that made some progress may see a peer's connection close
  // before its own deadline.)
  const bool census = f.across_processes;
  const std::string stall = "stall/" + f.collective_key + "/";
  auto waiting = [&](int64_t g) { return holds(f, stall + std::to_string(g)); };
  auto departed = [&](int64_t g) { return holds(f, "departed/" + std::to_string(g)); };
  if (census && !timed_out && !late &&
      std::all_of(f.group.begin(), f.group.end(), [&](int64_t g) { return g == f.me || waiting(g); })) {
    // Every peer had already given up waiting here when this rank arrived: it is the one late.
    return Diagnosis{DiagnosisKind::kStall, {f.me},
                     "stall: rank " + std::to_string(f.me) + " arrived at " + where + " after every other member had waited " +
                         std::to_string(f.timeout.count()) + " ms for it",
                     {}, {f.me}};
  }
  // The store is gone: no census can say who arrived, so no rank is blamed; the store is.
  auto store_lost = [&](const Error& e) {
    return Diagnosis{DiagnosisKind::kStore, {},
                     "the store was lost: rank " + std::to_string(f.me) + " failed in " + where + " (" + what +
                         ") and could not reach the store to learn who arrived: " + e.what(),
                     {}, {}};
  };
  if (census) {
    try {
      f.store->set(f.prefix + "/" + stall + std::to_string(f.me), f.desc.to_string());
    } catch (const Unavailable& e) {
      return store_lost(e);
    } catch (const DeadlineExceeded& e) {
      return store_lost(e);
    } catch (const std::exception&) {
    }
  } else {
    close();  // so the peers fail too
  }
  for (;;) {
    if (auto dg = recorded()) return dg;
    if (auto dg = store_diagnosis(*f.store, f.prefix, f.group, f.me, where)) return dg;
    // Every member waits here (a deadlock), or waits or has returned from its program (which can
    // never arrive, so settling longer changes nothing below): the census is complete.
    if (census && std::all_of(f.group.begin(), f.group.end(),
                              [&](int64_t g) { return g == f.me || waiting(g) || departed(g); })) {
      break;
    }
    if (timed_out && !census) break;  // the watchdog, which sees every rank, decides
    if (Clock::now() >= settle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!census) return std::nullopt;
  std::vector<int64_t> missing, gone;
  for (int64_t g : f.group) {
    if (g != f.me && !waiting(g)) missing.push_back(g);
  }
  for (int64_t g : missing) {
    if (departed(g)) gone.push_back(g);
  }
  // A member whose program returned without entering this collective.
  if (!gone.empty()) return departed_diagnosis(gone, collective_label(f.desc, f.seq), f.group);
  if (missing.empty()) return std::nullopt;
  return never_came(*f.store, f.prefix, missing, f.me, where, "in " + where, f.timeout, "arrived");
}

}  // namespace meshsim::detail
