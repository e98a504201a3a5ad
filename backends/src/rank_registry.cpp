#include "meshsim/decimal.hpp"
#include "rank_registry.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <tuple>

#include "meshsim/error.hpp"
#include "meshsim/registry_backend.hpp"

namespace meshsim {

std::string encode_diagnosis(const Diagnosis& d) {
  std::string ranks;
  for (int64_t r : d.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  return std::string(to_string(d.kind)) + "\n" + ranks + "\n" + d.message;
}

std::optional<Diagnosis> decode_diagnosis(const std::string& text) {
  const auto a = text.find('\n');
  if (a == std::string::npos) return std::nullopt;
  const auto b = text.find('\n', a + 1);
  if (b == std::string::npos) return std::nullopt;
  Diagnosis d;
  const auto kind = diagnosis_kind(std::string_view(text).substr(0, a));
  if (!kind) return std::nullopt;
  d.kind = *kind;
  const std::string ranks = text.substr(a + 1, b - a - 1);
  std::size_t i = 0;
  while (i < ranks.size()) {
    std::size_t j = ranks.find(',', i);
    if (j == std::string::npos) j = ranks.size();
    const std::optional<int64_t> r = read_decimal(std::string_view(ranks).substr(i, j - i));
    if (!r) return std::nullopt;
    d.ranks.push_back(*r);
    i = j + 1;
  }
  d.message = text.substr(b + 1);
  return d;
}

namespace {

// wait_text: "<who> in all_reduce(sum, int64, count=1) #2 of group [0, 1, 2, 3] for rank 1".
std::string wait_text(const std::string& who, const WaitInfo& w) {
  // Where every member has arrived the collective is slow, not waiting for anyone: said so.
  return who + " " + w.desc.to_string() + " #" + std::to_string(w.seq) + " of group " + format_ranks(w.group) +
         (w.missing.empty()       ? " (every member arrived; it has not completed)"
          : w.missing.size() == 1 ? " for rank " + std::to_string(w.missing[0])
                                  : " for ranks " + format_ranks(w.missing));
}

// ListDigests hashes each distinct shared list once, however many waits share it.
class ListDigests {
 public:
  uint64_t operator()(const SharedRanks& ranks) {
    auto [it, fresh] = cache_.try_emplace(ranks.identity(), 0);
    if (fresh) it->second = detail::group_digest(ranks, 0);
    return it->second;
  }

 private:
  std::map<const void*, uint64_t> cache_;
};

}  // namespace

std::string WaitInfo::to_string() const { return wait_text("rank " + std::to_string(rank) + " waits in", *this); }

Diagnosis stall_diagnosis(const std::vector<WaitInfo>& waits, const std::string& why, const std::string& extra) {
  // One entry per distinct wait (group, collective, number, missing members), in the order of
  // its lowest waiting rank; each shared list is read once.
  struct Entry {
    const WaitInfo* first;
    std::vector<int64_t> ranks;
  };
  ListDigests digest;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t, std::string>, std::size_t> index;
  std::vector<Entry> entries;
  std::set<const void*> missing_lists;
  std::vector<int64_t> waiting_v, missing_v;
  for (const WaitInfo& w : waits) {
    waiting_v.push_back(w.rank);
    if (missing_lists.insert(w.missing.identity()).second) missing_v.insert(missing_v.end(), w.missing.begin(), w.missing.end());
    const auto key = std::make_tuple(digest(w.group), w.seq, digest(w.missing), w.desc.to_string());
    auto [it, fresh] = index.try_emplace(key, entries.size());
    if (fresh) entries.push_back(Entry{&w, {}});
    entries[it->second].ranks.push_back(w.rank);
  }
  std::sort(waiting_v.begin(), waiting_v.end());
  waiting_v.erase(std::unique(waiting_v.begin(), waiting_v.end()), waiting_v.end());
  std::sort(missing_v.begin(), missing_v.end());
  missing_v.erase(std::unique(missing_v.begin(), missing_v.end()), missing_v.end());
  std::vector<int64_t> culprits;
  std::set_difference(missing_v.begin(), missing_v.end(), waiting_v.begin(), waiting_v.end(), std::back_inserter(culprits));
  if (culprits.empty()) culprits = missing_v;
  Diagnosis d;
  d.kind = DiagnosisKind::kStall;
  d.ranks = culprits;
  d.waiting = std::move(waiting_v);
  d.missing = std::move(missing_v);
  d.message = "stall: " + why + (d.missing.empty() ? "; every rank arrived in the collective it waits in, and "
                                                      "none of those completed (slow, or a backend that lost a message)"
                                                    : "; ranks " + detail::rank_list(d.missing, 32) + " never arrived");
  if (!culprits.empty() && culprits.size() < d.missing.size()) {
    d.message += " (rank" + std::string(culprits.size() > 1 ? "s " : " ") + detail::rank_list(culprits, 32) +
                 " waits in no collective)";
  }
  constexpr std::size_t kListedWaits = 16;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i == kListedWaits) {
      d.message += "; ... " + std::to_string(entries.size() - kListedWaits) + " more distinct waits";
      break;
    }
    const Entry& e = entries[i];
    d.message += "; " + (e.ranks.size() == 1 ? e.first->to_string()
                                              : wait_text("ranks " + format_ranks(e.ranks) + " wait in", *e.first));
  }
  if (!extra.empty()) d.message += "; " + extra;
  return d;
}

namespace detail {

std::string rank_list(const std::vector<int64_t>& v, std::size_t limit) { return format_ranks(v, limit); }

uint64_t group_digest(std::span<const int64_t> ranks, uint64_t config_fingerprint) {
  uint64_t digest = 1469598103934665603ull ^ config_fingerprint;
  for (int64_t r : ranks) digest = (digest ^ static_cast<uint64_t>(r)) * 1099511628211ull;
  return (digest ^ ranks.size()) * 1099511628211ull;
}

void check_backend(const BackendConfig& config, const char* backend) {
  if (!config.backend.empty() && config.backend != backend) {
    throw InvalidArgument("backend '" + config.backend + "' is not available in a " + backend + " run (its groups use the " +
                          backend + " backend; give \"" + backend + "\" or no backend)");
  }
}

void check_member(int64_t rank, std::span<const int64_t> ranks, int64_t first, int64_t count,
                  const BackendConfig& config, const char* backend) {
  check_backend(config, backend);
  if (rank < first || rank >= first + count) {
    throw OutOfRange(std::string(backend) + " backend: rank " + std::to_string(rank) +
                     " does not run in this process (ranks [" + std::to_string(first) + ", " +
                     std::to_string(first + count) + "))");
  }
  if (ranks.empty()) throw InvalidArgument("new_group: a group needs at least one rank");
  if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) {
    throw InvalidArgument("new_group: rank " + std::to_string(rank) + " is not a member of " +
                          rank_list(std::vector<int64_t>(ranks.begin(), ranks.end())));
  }
}

void check_members(std::span<const int64_t> ranks, int64_t world) {
  // A group in increasing order (a mesh's usually is) needs no sorted copy to find a repeat.
  const bool increasing = std::adjacent_find(ranks.begin(), ranks.end(), std::greater_equal<>()) == ranks.end();
  std::vector<int64_t> copy;
  if (!increasing) {
    copy.assign(ranks.begin(), ranks.end());
    std::sort(copy.begin(), copy.end());
  }
  const std::span<const int64_t> sorted = increasing ? ranks : std::span<const int64_t>(copy);
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= world) {
      throw OutOfRange("new_group: rank " + std::to_string(sorted[i]) + " is out of range [0, " +
                       std::to_string(world) + ")");
    }
    if (i && sorted[i] == sorted[i - 1]) {
      throw InvalidArgument("new_group: rank " + std::to_string(sorted[i]) + " appears twice");
    }
  }
}

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

bool process_alive(const std::string& pid) {
  // A zombie (ended, not yet reaped by its launcher) counts as gone.
  std::ifstream stat("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

std::string hex64(uint64_t v) {
  static const char* d = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = d[v & 15];
  return s;
}

void publish_failure(Store& store, const std::string& key, const Diagnosis& d) {
  try {
    store.compare_set(key, "", encode_diagnosis(d));
  } catch (const std::exception&) {
    // The store is gone: the peers fall back to their own diagnosis.
  }
}

std::optional<std::string> lookup_key(Store& store, const std::string& key) {
  try {
    return store.get(key, std::chrono::milliseconds(0));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void check_placement(const char* backend, int64_t world, RankPlacement* placement, std::chrono::milliseconds timeout) {
  const std::string who = std::string(backend) + " backend: ";
  if (world < 1) throw InvalidArgument(who + "world size " + std::to_string(world) + " is not >= 1");
  placement->local_ranks = placement->ranks_here(world);
  const int64_t first = placement->first_rank, local = placement->local_ranks;
  if (first < 0 || local < 1 || first > world || local > world - first) {
    throw OutOfRange(who + "ranks [" + std::to_string(first) + ", " + std::to_string(first) + " + " +
                     std::to_string(local) + ") are not within the world of " + std::to_string(world));
  }
  check_timeout(std::string(backend) + " backend", timeout);
  if (!placement->store) {
    if (local != world) {
      throw InvalidArgument(who + "ranks of several processes need a shared store (Options::placement.store)");
    }
    placement->store = std::make_shared<InProcessStore>();
  }
}

void encode_desc(const CollectiveDesc& d, int64_t* out) {
  out[0] = static_cast<int64_t>(d.op);
  out[1] = static_cast<int64_t>(d.dtype);
  out[2] = d.count;
  out[3] = d.root;
  out[4] = static_cast<int64_t>(d.reduce);
}

CollectiveDesc decode_desc(const int64_t* in) {
  CollectiveDesc d;
  d.op = static_cast<CollectiveOp>(in[0]);
  d.dtype = static_cast<DType>(in[1]);
  d.count = in[2];
  d.root = static_cast<int>(in[3]);
  d.reduce = static_cast<ReduceOp>(in[4]);
  return d;
}

std::optional<Diagnosis> mismatch_diagnosis(const std::vector<CollectiveDesc>& descs,
                                            const std::vector<int64_t>& group, uint64_t seq) {
  std::vector<std::pair<CollectiveDesc, std::vector<int64_t>>> kinds;
  for (std::size_t r = 0; r < descs.size(); ++r) {
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == descs[r]; });
    if (it == kinds.end()) {
      kinds.push_back({descs[r], {}});
      it = kinds.end() - 1;
    }
    it->second.push_back(group[r]);
  }
  if (kinds.size() <= 1) return std::nullopt;
  std::vector<std::pair<std::string, std::vector<int64_t>>> calls;
  for (auto& [d, ranks] : kinds) calls.emplace_back(d.to_string(), std::move(ranks));
  return meshsim::mismatch_diagnosis("#" + std::to_string(seq), group, calls);
}

RankRegistry::RankRegistry(int64_t world, int64_t first, int64_t count)
    : world_(world), first_(first), count_(count), world_ranks_(static_cast<std::size_t>(world)),
      slots_(static_cast<std::size_t>(count)) {
  for (std::size_t i = 0; i < world_ranks_.size(); ++i) world_ranks_[i] = static_cast<int64_t>(i);
}

RankRegistry::GroupKey RankRegistry::key(int64_t rank, std::span<const int64_t> ranks, const BackendConfig& config,
                                         const char* backend) {
  if (ranks.data() == world_ranks_.data() && ranks.size() == world_ranks_.size()) {
    check_backend(config, backend);
    if (!runs_here(rank)) check_member(rank, ranks, first_, count_, config, backend);  // throws, naming it
    const uint64_t fp = config.fingerprint();
    std::lock_guard lk(mu_);
    auto [it, fresh] = world_digests_.try_emplace(fp, 0);
    if (fresh) {
      it->second = group_digest(ranks, fp);
      count_steps(static_cast<int64_t>(ranks.size()));
    }
    count_steps(1);
    return GroupKey{it->second, static_cast<std::size_t>(rank)};
  }
  check_member(rank, ranks, first_, count_, config, backend);
  const auto member = static_cast<std::size_t>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
  count_steps(2 * static_cast<int64_t>(ranks.size()));  // searched, hashed
  return GroupKey{group_digest(ranks, config.fingerprint()), member};
}

std::shared_ptr<GroupInfo> RankRegistry::group(int64_t rank, const GroupKey& key, std::span<const int64_t> ranks,
                                               int64_t* instance) {
  std::lock_guard lk(mu_);
  if (diag_) throw_aborted();
  int64_t& created = slot(rank).instances[key.digest];
  auto& ref = groups_[{key.digest, created}];
  if (!ref) {
    // Once per group, by its first member here.
    try {
      check_members(ranks, world_);
    } catch (...) {
      groups_.erase({key.digest, created});
      throw;
    }
    ref = std::make_shared<GroupInfo>();
    ref->ranks.assign(ranks.begin(), ranks.end());
    ref->entered.assign(ranks.size(), 0);
    ref->local.resize(ranks.size());
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      ref->local[i] = runs_here(ranks[i]);
      ref->local_count += ref->local[i] ? 1 : 0;
    }
    count_steps(static_cast<int64_t>(ranks.size()));
  } else if (!(ranks.data() == world_ranks_.data() && ranks.size() == world_ranks_.size())) {
    count_steps(static_cast<int64_t>(ranks.size()));
    if (!std::equal(ranks.begin(), ranks.end(), ref->ranks.begin(), ref->ranks.end())) {
      throw Internal("new_group: two different groups share the digest " + hex64(key.digest));
    }
  }
  *instance = created++;
  ++ref->joined;
  slot(rank).memberships.emplace_back(ref, key.member);
  return ref;
}

void RankRegistry::start_wait(Slot& s) {
  if (s.linked) end_wait(s);
  const int64_t i = &s - slots_.data();
  s.since = Clock::now();
  s.prev = wait_tail_;
  s.next = -1;
  if (wait_tail_ >= 0) slots_[static_cast<std::size_t>(wait_tail_)].next = i;
  else wait_head_ = i;
  wait_tail_ = i;
  s.linked = true;
}

void RankRegistry::end_wait(Slot& s) {
  if (!s.linked) return;
  if (s.prev >= 0) slots_[static_cast<std::size_t>(s.prev)].next = s.next;
  else wait_head_ = s.next;
  if (s.next >= 0) slots_[static_cast<std::size_t>(s.next)].prev = s.prev;
  else wait_tail_ = s.prev;
  s.prev = s.next = -1;
  s.linked = false;
}

std::optional<Diagnosis> RankRegistry::enter(int64_t rank, const std::shared_ptr<GroupInfo>& g,
                                             std::size_t member, uint64_t seq, const CollectiveDesc& d) {
  std::lock_guard lk(mu_);
  if (diag_) throw_aborted();
  // A member that already departed without entering this collective never will. Only looked
  // for in a group with a departed member, or one a member here has not joined yet while some
  // rank departed (it may have ended without joining): on the way there, entering is O(1).
  if (g->departed > 0 || (departed_ > 0 && g->joined < g->local_count)) {
    count_steps(static_cast<int64_t>(g->ranks.size()));
    for (std::size_t i = 0; i < g->ranks.size(); ++i) {
      if (g->local[i] && g->entered[i] <= seq && slot(g->ranks[i]).departed) {
        return departed_diagnosis({g->ranks[i]}, collective_label(d, seq), g->ranks);
      }
    }
  }
  Slot& s = slot(rank);
  clear_wait(s);  // a collective whose members were let go together may not be left yet
  s.in_op = true;
  WaitInfo w;
  w.rank = rank;
  w.seq = seq;
  w.desc = d;
  s.wait = std::move(w);
  s.wait_group = g;
  s.in_collective = true;
  start_wait(s);
  count_steps(1);
  g->entered[member] = seq + 1;
  arrivals_.fetch_add(1, std::memory_order_relaxed);
  ++g->waiters;
  if (seq >= g->wait_seq) {
    g->wait_seq = seq;
    g->wait_desc = d;
  }
  return std::nullopt;
}

namespace {
// The label of the message rank `me` waits in with `peer` (w.seq is its number on that pair).
std::string label_of(const WaitInfo& w, int64_t peer) {
  const bool sends = w.desc.op == CollectiveOp::kSend;
  return message_label(w.desc, w.seq, sends ? w.rank : peer, sends ? peer : w.rank);
}
}  // namespace

std::optional<Diagnosis> RankRegistry::enter_p2p(int64_t rank, const std::shared_ptr<GroupInfo>& g, int64_t peer,
                                                 const CollectiveDesc& d, uint64_t nth) {
  std::lock_guard lk(mu_);
  if (diag_) throw_aborted();
  count_steps(1);
  WaitInfo w;
  w.rank = rank;
  w.desc = d;
  w.seq = nth;
  const bool sends = d.op == CollectiveOp::kSend;
  ++messages_[{g.get(), sends ? rank : peer, sends ? peer : rank, static_cast<int>(d.op)}];
  if (runs_here(peer) && slot(peer).departed && !peer_joined(g.get(), w, peer)) {
    return departed_diagnosis({peer}, label_of(w, peer), g->ranks, {rank});
  }
  Slot& s = slot(rank);
  clear_wait(s);
  s.in_op = true;
  s.wait = std::move(w);
  s.wait_group = g;
  s.in_collective = false;
  s.p2p_peer = peer;
  if (runs_here(peer)) ++slot(peer).p2p_waiters;
  start_wait(s);
  arrivals_.fetch_add(1, std::memory_order_relaxed);
  return std::nullopt;
}

bool RankRegistry::peer_joined(const GroupInfo* g, const WaitInfo& w, int64_t peer) const {
  const bool sends = w.desc.op == CollectiveOp::kSend;
  const CollectiveOp other = sends ? CollectiveOp::kRecv : CollectiveOp::kSend;
  auto it = messages_.find({g, sends ? w.rank : peer, sends ? peer : w.rank, static_cast<int>(other)});
  return it != messages_.end() && it->second > w.seq;
}

void RankRegistry::enter_connect(int64_t rank, const std::shared_ptr<GroupInfo>& g) {
  std::lock_guard lk(mu_);
  Slot& s = slot(rank);
  clear_wait(s);
  s.in_op = true;
  WaitInfo w;
  w.rank = rank;
  s.wait = std::move(w);
  s.wait_group = g;
  s.in_collective = false;
  start_wait(s);
  count_steps(1);
  arrivals_.fetch_add(1, std::memory_order_relaxed);  // arriving at a group's creation is progress too
}

void RankRegistry::clear_wait(Slot& s) {
  if (s.in_collective && s.wait_group) --s.wait_group->waiters;
  if (s.p2p_peer >= 0 && runs_here(s.p2p_peer)) --slot(s.p2p_peer).p2p_waiters;
  s.p2p_peer = -1;
  s.in_op = false;
  s.in_collective = false;
  s.wait.reset();
  s.wait_group.reset();
  end_wait(s);
}

void RankRegistry::leave(int64_t rank) {
  std::lock_guard lk(mu_);
  clear_wait(slot(rank));
  count_steps(1);
}

void RankRegistry::leave_collective(const std::shared_ptr<GroupInfo>& g, uint64_t seq) {
  std::lock_guard lk(mu_);
  for (std::size_t i = 0; i < g->ranks.size(); ++i) {
    if (!g->local[i]) continue;
    Slot& s = slot(g->ranks[i]);
    if (s.in_collective && s.wait_group == g && s.wait && s.wait->seq == seq) clear_wait(s);
  }
  count_steps(static_cast<int64_t>(g->ranks.size()));
}

bool RankRegistry::in_op(int64_t rank) const {
  std::lock_guard lk(mu_);
  return slot(rank).in_op;
}

RankRegistry::Clock::time_point RankRegistry::entered_at(int64_t rank) const {
  std::lock_guard lk(mu_);
  return slot(rank).since;
}

bool RankRegistry::record(Diagnosis d) {
  {
    std::lock_guard lk(mu_);
    if (diag_) return false;
    diag_ = std::move(d);
  }
  cv_.notify_all();
  return true;
}

bool RankRegistry::aborted() const {
  std::lock_guard lk(mu_);
  return diag_.has_value();
}

std::optional<Diagnosis> RankRegistry::diagnosis() const {
  std::lock_guard lk(mu_);
  return diag_;
}

void RankRegistry::throw_aborted() const {
  // Called with or without the lock held: reads diag_ only after it was set (never reset).
  throw Aborted(diag_->message);
}

std::optional<Diagnosis> RankRegistry::depart(int64_t rank) {
  std::lock_guard lk(mu_);
  if (!runs_here(rank)) return std::nullopt;
  Slot& me = slot(rank);
  if (!me.departed) {
    ++departed_;
    for (const auto& m : me.memberships) ++m.first->departed;
  }
  me.departed = true;
  count_steps(1 + static_cast<int64_t>(me.memberships.size()));
  if (diag_) return std::nullopt;
  // A rank blocked in a message with this rank waits in vain (looked for only when one does).
  if (me.p2p_waiters > 0) {
    for (const Slot& s : slots_) {
      count_steps(1);
      if (s.p2p_peer == rank && s.wait && s.wait_group && !peer_joined(s.wait_group.get(), *s.wait, rank)) {
        return departed_diagnosis({rank}, label_of(*s.wait, rank), s.wait_group->ranks, {s.wait->rank});
      }
    }
  }
  // A rank blocked in a collective that this rank never entered waits for it in vain: only the
  // groups this rank is a member of can hold one (O(its groups), not O(ranks x group size)).
  for (const auto& [g, i] : me.memberships) {
    if (g->waiters > 0 && g->entered[i] <= g->wait_seq) {
      return departed_diagnosis({rank}, collective_label(g->wait_desc, g->wait_seq), g->ranks);
    }
  }
  return std::nullopt;
}

bool RankRegistry::departed(int64_t rank) const {
  std::lock_guard lk(mu_);
  return runs_here(rank) && slot(rank).departed;
}

std::vector<WaitInfo> RankRegistry::waits() const {
  std::lock_guard lk(mu_);
  std::vector<WaitInfo> out;
  const auto now = Clock::now();
  // Every rank waiting in one collective shares its group's list and one missing list: a world
  // waiting in the world group is O(world), not O(world^2).
  std::map<std::pair<const GroupInfo*, uint64_t>, SharedRanks> missing;
  for (const Slot& s : slots_) {
    if (!s.wait) continue;
    WaitInfo w = *s.wait;
    w.seconds = std::chrono::duration<double>(now - s.since).count();
    if (s.wait_group) {
      const GroupInfo& g = *s.wait_group;
      w.group = SharedRanks(std::shared_ptr<const std::vector<int64_t>>(s.wait_group, &s.wait_group->ranks));
      if (s.p2p_peer >= 0) {
        if (!peer_joined(&g, w, s.p2p_peer)) w.missing = SharedRanks{s.p2p_peer};
      } else if (s.in_collective) {
        auto [it, fresh] = missing.try_emplace({&g, w.seq});
        if (fresh) {
          std::vector<int64_t> m;
          for (std::size_t i = 0; i < g.ranks.size(); ++i) {
            if (g.local[i] && g.entered[i] <= w.seq) m.push_back(g.ranks[i]);
          }
          it->second = SharedRanks(std::move(m));
        }
        w.missing = it->second;
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

double RankRegistry::oldest_wait() const {
  std::lock_guard lk(mu_);
  if (wait_head_ < 0) return 0.0;
  return std::chrono::duration<double>(Clock::now() - slots_[static_cast<std::size_t>(wait_head_)].since).count();
}

bool RankRegistry::any_waiting() const {
  std::lock_guard lk(mu_);
  return wait_head_ >= 0;
}

bool RankRegistry::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lk(mu_);
  return !cv_.wait_for(lk, d, [&] { return diag_.has_value(); });
}

}  // namespace detail
}  // namespace meshsim

namespace meshsim {

int64_t RegistryBackend::world_size() const { return registry_->world(); }

std::shared_ptr<Communicator> RegistryBackend::world(int64_t rank) {
  // The registry's own list of every rank: the group key knows it in O(1) per rank.
  return new_group(rank, registry_->world_ranks(), BackendConfig{});
}
bool RegistryBackend::aborted() const { return registry_->aborted(); }
std::optional<Diagnosis> RegistryBackend::diagnosis() const { return registry_->diagnosis(); }

void RegistryBackend::depart(int64_t rank) {
  if (!registry_->runs_here(rank)) return;
  std::optional<Diagnosis> gone = registry_->depart(rank);
  on_depart(rank);
  if (gone) abort(*gone);
}

std::vector<WaitInfo> RegistryBackend::waits() const { return registry_->waits(); }
double RegistryBackend::oldest_wait() const { return registry_->oldest_wait(); }
int64_t RegistryBackend::progress() const { return registry_->progress(); }
int64_t RegistryBackend::steps() const { return registry_->steps(); }
bool RegistryBackend::sleep_for(std::chrono::milliseconds d) { return registry_->sleep_for(d); }
int64_t RegistryBackend::collectives() const { return registry_->collectives(); }

void StoreBackend::attach_store(std::shared_ptr<Store> store, std::string prefix) {
  store_ = std::move(store);
  prefix_ = std::move(prefix);
}

bool StoreBackend::abort(Diagnosis d) {
  if (!registry().record(d)) return false;
  detail::publish_failure(*store_, key("failure"), d);
  on_abort();
  return true;
}

void StoreBackend::on_depart(int64_t rank) {
  if (!registry().all_local()) {
    // Across processes the peers learn of a departure from the store (at their deadline).
    try {
      store_->set(key("departed/" + std::to_string(rank)), "1");
    } catch (const std::exception&) {
    }
  }
  on_departed(rank);
}

bool StoreBackend::exit_abruptly(int64_t rank) {
  if (!can_exit()) return false;
  if (!registry().runs_here(rank)) {
    throw OutOfRange(name() + " backend: rank " + std::to_string(rank) + " does not run in this process");
  }
  registry().leave(rank);
  try {
    store_->set(key("exit/" + std::to_string(rank)), "its thread ended");
  } catch (const std::exception&) {
  }
  on_exit(rank);
  return true;
}

}  // namespace meshsim
