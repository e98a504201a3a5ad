#include "meshsim/group_names.hpp"

#include <algorithm>
#include <cstdio>
#include <span>
#include <type_traits>
#include <unordered_map>

#include <boost/uuid/detail/sha1.hpp>

#include "meshsim/error.hpp"
#include "meshsim/rank_text.hpp"

namespace meshsim {

namespace {

// RankStates is PyTorch's naming state on every rank of the world: group_count and the count of
// groups the rank holds (len(_world.pg_names)). Ranks the program never names share one state;
// a world-wide increment is one add to a common offset.
class RankStates {
 public:
  RankStates(std::vector<int64_t> touched, int64_t world) : ids_(std::move(touched)), world_(world) {
    std::sort(ids_.begin(), ids_.end());
    ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
    if (!ids_.empty() && ids_.back() < static_cast<int64_t>(4 * ids_.size() + 64)) {
      dense_.assign(static_cast<std::size_t>(ids_.back() + 1), -1);
      for (std::size_t s = 0; s < ids_.size(); ++s) dense_[static_cast<std::size_t>(ids_[s])] = static_cast<int64_t>(s);
    }
    gc_.assign(ids_.size(), 0);
    held_.assign(ids_.size(), 0);
  }

  // slot is the rank's own state, or -1 for the shared state of the ranks never named.
  int64_t slot(int64_t r) const {
    if (!dense_.empty()) return r < static_cast<int64_t>(dense_.size()) ? dense_[static_cast<std::size_t>(r)] : -1;
    auto it = std::lower_bound(ids_.begin(), ids_.end(), r);
    return it != ids_.end() && *it == r ? it - ids_.begin() : -1;
  }
  int64_t group_count(int64_t r) const { return gc_all_ + local(gc_, gc_rest_, slot(r)); }
  int64_t held(int64_t r) const { return held_all_ + local(held_, held_rest_, slot(r)); }
  void add_count(int64_t r, int64_t k) { local(gc_, gc_rest_, slot(r)) += k; }
  void add_held(int64_t r) { local(held_, held_rest_, slot(r)) += 1; }
  void add_count_everywhere(int64_t k) { gc_all_ += k; }
  void add_held_everywhere() { held_all_ += 1; }
  // untouched is whether some rank of the world is never named (it shares the common state).
  bool untouched() const { return world_ > static_cast<int64_t>(ids_.size()); }
  const std::vector<int64_t>& ids() const { return ids_; }
  int64_t rest_count() const { return gc_all_ + gc_rest_; }

 private:
  static int64_t local(const std::vector<int64_t>& v, int64_t rest, int64_t s) {
    return s < 0 ? rest : v[static_cast<std::size_t>(s)];
  }
  static int64_t& local(std::vector<int64_t>& v, int64_t& rest, int64_t s) {
    return s < 0 ? rest : v[static_cast<std::size_t>(s)];
  }
  std::vector<int64_t> ids_;
  std::vector<int64_t> dense_;
  int64_t world_;
  std::vector<int64_t> gc_, held_;
  int64_t gc_all_ = 1;    // init_process_group named the default group "0"
  int64_t held_all_ = 1;  // and every rank holds it
  int64_t gc_rest_ = 0, held_rest_ = 0;
};

std::string join_ranks(std::span<const int64_t> ranks) {
  std::string out;
  for (int64_t r : ranks) {
    if (!out.empty()) out += '_';
    out += std::to_string(r);
  }
  return out;
}

// ranks_text is " rank 3" or " ranks 0-1,4", for a message.
std::string ranks_text(const std::vector<int64_t>& ranks) {
  return (ranks.size() == 1 ? " rank " : " ranks ") + format_rank_runs(ranks, 8);
}

std::string sha1_hex(const std::string& text) {
  boost::uuids::detail::sha1 h;
  h.process_bytes(text.data(), text.size());
  boost::uuids::detail::sha1::digest_type d;
  h.get_digest(d);
  // Boost before 1.86 gives five 32-bit words, later twenty bytes: either way, big-endian hex.
  using Word = std::remove_cv_t<std::remove_reference_t<decltype(d[0])>>;
  constexpr int kDigits = static_cast<int>(sizeof(Word)) * 2;
  std::string out;
  char buf[16];
  for (std::size_t i = 0; i < std::extent_v<boost::uuids::detail::sha1::digest_type>; ++i) {
    std::snprintf(buf, sizeof buf, "%0*llx", kDigits, static_cast<unsigned long long>(d[i]));
    out += buf;
  }
  return out;
}

// Owner is a name's first holder: one group of one item, and the ranks that call it so (side
// -1: every member of the group; else an entry of Namer::sides_, where the members disagreed).
struct Owner {
  std::size_t item = 0;
  int64_t group = 0;
  int64_t side = -1;
};

// One group of one call, as the engine names it: its members (ascending), and what a hashed
// name joins (the ranks as sorted by new_group, or as given to split_group).
struct GroupCall {
  std::span<const int64_t> members;
  std::span<const int64_t> hash_ranks;
  bool hashed = false;
};

class Namer {
 public:
  Namer(const CreationPlan& plan, int64_t me)
      : plan_(plan), me_(me), items_(group_program_items(plan)), states_(touched(plan), plan.world) {}

  GroupNames run() {
    out_.items.resize(items_.size());
    for (std::size_t i = 0; i < items_.size(); ++i) {
      item_ = i;
      if (items_[i].user) {
        user_call(plan_.program[items_[i].index]);
      } else {
        batch(plan_.batches[items_[i].index]);
      }
    }
    return std::move(out_);
  }

 private:
  static std::vector<int64_t> touched(const CreationPlan& plan) {
    std::vector<int64_t> ids;
    for (const CreationBatch& b : plan.batches) {
      if (b.kind == CreationBatch::Kind::kDefault || b.group_desc == "mesh_default") continue;
      const GroupTable& t = b.record->table();
      ids.insert(ids.end(), t.ranks.begin(), t.ranks.end());
    }
    for (const GroupCallSpec& c : plan.program) {
      if (c.ranks) ids.insert(ids.end(), c.ranks->begin(), c.ranks->end());
      for (const auto& row : c.split_ranks) ids.insert(ids.end(), row.begin(), row.end());
    }
    return ids;
  }

  bool v213() const { return plan_.torch_version == TorchVersion::k2_13; }
  int64_t salt(int64_t r) const { return v213() ? states_.held(r) : states_.group_count(r); }
  std::string version() const { return "PyTorch " + std::string(torch_version_name(plan_.torch_version)); }

  // key is a member's name of the group before it is written out: a counter value, or the
  // salt of a hashed name.
  int64_t key(const GroupCall& g, int64_t r, int64_t offset) const {
    return g.hashed ? salt(r) : states_.group_count(r) + offset;
  }
  std::string name_of(const GroupCall& g, int64_t k) const {
    return g.hashed ? hashed_group_name(std::vector<int64_t>(g.hash_ranks.begin(), g.hash_ranks.end()), k)
                    : std::to_string(k);
  }

  // describe words group `group` of item `item` for a message; members lists its ranks.
  std::string describe(std::size_t item, int64_t group) const {
    const ProgramItem& it = items_[item];
    if (it.user) {
      const GroupCallSpec& c = plan_.program[it.index];
      std::string out = describe_call(c, it.index);
      if (c.kind == GroupCallSpec::Kind::kSplitGroup && c.split_ranks.size() > 1) {
        out += ", split " + format_ranks(c.split_ranks[static_cast<std::size_t>(group)], 16);
      }
      return out;
    }
    const CreationBatch& b = plan_.batches[it.index];
    std::string out = describe_batch(plan_, b);
    if (b.group_desc == "mesh_default") return out;
    return out + (b.kind == CreationBatch::Kind::kSplitGroup ? ", split " : ", group ") +
           format_ranks(b.record->table().row(group), 16);
  }
  std::vector<int64_t> members(std::size_t item, int64_t group) const {
    const ProgramItem& it = items_[item];
    std::span<const int64_t> row;
    std::vector<int64_t> world;
    if (it.user) {
      const GroupCallSpec& c = plan_.program[it.index];
      if (c.kind == GroupCallSpec::Kind::kSplitGroup) {
        row = c.split_ranks[static_cast<std::size_t>(group)];
      } else if (c.ranks) {
        row = *c.ranks;
      }
    } else {
      const CreationBatch& b = plan_.batches[it.index];
      if (b.group_desc != "mesh_default") row = b.record->table().row(group);
    }
    if (row.empty()) {
      for (int64_t r = 0; r < plan_.world; ++r) world.push_back(r);
      return world;
    }
    return sorted_row(row);
  }
  std::vector<int64_t> ranks_of(const Owner& o) const {
    return o.side < 0 ? members(o.item, o.group) : sides_[static_cast<std::size_t>(o.side)];
  }

  // claim gives `name` to group `group` of this item, as held by `side` of its members (empty:
  // all): a name some other group holds already is a problem.
  void claim(const std::string& name, bool hashed, int64_t seq, int64_t group, std::vector<int64_t> side) {
    Owner fresh{item_, group, -1};
    const Owner* held = nullptr;
    if (hashed) {
      auto [it, added] = hashed_.try_emplace(name, fresh);
      if (!added) held = &it->second;
      if (added && !side.empty()) it->second.side = keep(side);
    } else {
      auto [it, added] = seq_.try_emplace(seq, fresh);
      if (!added) held = &it->second;
      if (added && !side.empty()) it->second.side = keep(side);
    }
    if (held == nullptr || (held->item == item_ && held->group == group)) return;
    const std::vector<int64_t> mine = side.empty() ? members(item_, group) : side;
    problem(NameProblem::Kind::kNameShared, describe(item_, group),
            "group name '" + name + "' means two groups (" + version() + "): " + describe(held->item, held->group) +
                " on ranks " + format_rank_runs(ranks_of(*held), 8) + ", and " + describe(item_, group) + " on ranks " +
                format_rank_runs(mine, 8) + "; both rendezvous under the store prefix '" + name +
                "/' and read each other's keys");
  }
  int64_t keep(std::vector<int64_t> side) {
    sides_.push_back(std::move(side));
    return static_cast<int64_t>(sides_.size()) - 1;
  }

  // name_group names one group on each of its members, checks that they agree and that no other
  // group holds the name, and keeps `me`'s name. `offset` is the group's place in a batch of
  // sequential names.
  void name_group(const GroupCall& g, int64_t group, int64_t offset, std::optional<std::string>* mine) {
    if (g.members.empty()) return;
    const int64_t first = key(g, g.members.front(), offset);
    bool agree = true;
    for (int64_t r : g.members) {
      if (key(g, r, offset) != first) {
        agree = false;
        break;
      }
    }
    const bool member = std::binary_search(g.members.begin(), g.members.end(), me_);
    if (agree) {
      std::string name = name_of(g, first);
      claim(name, g.hashed, first, group, {});
      if (member) *mine = std::move(name);
      return;
    }
    // The members split by the name each gives: list each side.
    std::vector<std::pair<int64_t, std::vector<int64_t>>> sides;
    for (int64_t r : g.members) {
      const int64_t k = key(g, r, offset);
      auto it = std::find_if(sides.begin(), sides.end(), [k](const auto& s) { return s.first == k; });
      if (it == sides.end()) {
        sides.push_back({k, {r}});
      } else {
        it->second.push_back(r);
      }
    }
    std::string text = describe(item_, group) + ": its members name it differently (" + version() + "):";
    for (std::size_t s = 0; s < sides.size(); ++s) {
      std::string name = name_of(g, sides[s].first);
      if (s < 4) text += std::string(s ? "," : "") + ranks_text(sides[s].second) + " '" + name + "'";
      if (member && std::binary_search(sides[s].second.begin(), sides[s].second.end(), me_)) *mine = name;
      claim(name, g.hashed, sides[s].first, group, sides[s].second);
    }
    if (sides.size() > 4) text += ", and " + std::to_string(sides.size() - 4) + " more names";
    text += g.hashed ? (v213() ? "; 2.13 salts a hashed name with the count of groups the rank holds, which differs "
                                 "where the ranks were members of different earlier groups"
                               : "; 2.14 salts a hashed name with the group counter, which differs where some ranks "
                                 "skipped an earlier use_local_synchronization new_group")
                     : (v213() ? "; their group counters differ"
                               : "; 2.14 advances the group counter on every name, hashed or not, and a non-member of "
                                 "a use_local_synchronization new_group returns before naming it, so the ranks that "
                                 "skipped one count one less");
    text += ". The name is the group's store prefix: each side waits for the other under its own, and the job hangs";
    problem(NameProblem::Kind::kMembersDisagree, describe(item_, group), std::move(text));
  }

  void problem(NameProblem::Kind kind, std::string call, std::string text) {
    ++out_.problem_count;
    if (out_.problems.size() < kMaxNameProblems) out_.problems.push_back({kind, std::move(call), std::move(text)});
  }

  // sorted_row is a group's members ascending (what new_group sorts, and what membership reads).
  static std::vector<int64_t> sorted_row(std::span<const int64_t> row) {
    std::vector<int64_t> s(row.begin(), row.end());
    std::sort(s.begin(), s.end());
    return s;
  }

  void batch(const CreationBatch& b) {
    NamedItem& mine = out_.items[item_];
    if (b.kind == CreationBatch::Kind::kDefault) return;
    if (b.group_desc == "mesh_default") {
      world_group(mine);  // one new_group of every rank
      return;
    }
    const GroupTable& t = b.record->table();
    if (b.kind == CreationBatch::Kind::kSplitGroup) {
      split([&](int64_t g) { return t.row(g); }, t.count, mine);
      return;
    }
    // new_group per group: on every rank (sequential names), or on members only (hashed).
    const bool local = b.local_sync;
    for (int64_t g = 0; g < t.count; ++g) {
      const std::vector<int64_t> members = sorted_row(t.row(g));
      std::optional<std::string> name;
      name_group(GroupCall{members, members, local}, g, local ? 0 : g, &name);
      if (!local || name) mine.names.push_back(std::move(name));
      for (int64_t r : members) {
        states_.add_held(r);
        if (local && !v213()) states_.add_count(r, 1);
      }
    }
    if (!local) states_.add_count_everywhere(t.count);
  }

  // world_group is one new_group of every rank of the world: each names it by its counter.
  void world_group(NamedItem& mine) {
    std::vector<std::pair<int64_t, std::vector<int64_t>>> sides;
    auto add = [&](int64_t k, int64_t r) {
      auto it = std::find_if(sides.begin(), sides.end(), [k](const auto& s) { return s.first == k; });
      if (it == sides.end()) {
        sides.push_back({k, {}});
        it = sides.end() - 1;
      }
      if (r >= 0) it->second.push_back(r);
    };
    for (int64_t r : states_.ids()) add(states_.group_count(r), r);
    if (states_.untouched()) add(states_.rest_count(), -1);
    if (sides.size() > 1) {
      std::string text = describe(item_, 0) + ": the world's ranks name it differently (" + version() + "):";
      for (std::size_t s = 0; s < sides.size() && s < 4; ++s) {
        text += std::string(s ? "," : "") +
                (sides[s].second.empty() ? " the ranks no earlier call named" : ranks_text(sides[s].second)) +
                " '" + std::to_string(sides[s].first) + "'";
      }
      text += ". The name is the group's store prefix: the sides wait for each other, and the job hangs";
      problem(NameProblem::Kind::kMembersDisagree, describe(item_, 0), std::move(text));
    }
    const int64_t k = states_.group_count(me_);
    claim(std::to_string(k), false, k, 0, {});
    mine.names.push_back(std::to_string(k));
    states_.add_count_everywhere(1);
    states_.add_held_everywhere();
  }

  // split is one split_group call of every rank: each member names its own split, hashed on
  // the split's ranks as given; a rank in none gets no group.
  template <class Row>
  void split(Row row, int64_t count, NamedItem& mine) {
    std::optional<std::string> my_name;
    for (int64_t g = 0; g < count; ++g) {
      const std::span<const int64_t> given = row(g);
      const std::vector<int64_t> members = sorted_row(given);
      name_group(GroupCall{members, given, true}, g, 0, &my_name);
    }
    mine.names.push_back(std::move(my_name));
    for (int64_t g = 0; g < count; ++g) {
      for (int64_t r : row(g)) states_.add_held(r);
    }
    if (!v213()) states_.add_count_everywhere(1);
  }

  void user_call(const GroupCallSpec& c) {
    NamedItem& mine = out_.items[item_];
    if (c.kind == GroupCallSpec::Kind::kSplitGroup) {
      split([&](int64_t g) { return std::span<const int64_t>(c.split_ranks[static_cast<std::size_t>(g)]); },
            static_cast<int64_t>(c.split_ranks.size()), mine);
      return;
    }
    if (!c.ranks && !c.local_sync) {
      world_group(mine);  // new_group() of every rank: one sequential name
      return;
    }
    const std::vector<int64_t> members = members_of_call(c);
    std::optional<std::string> name;
    name_group(GroupCall{members, members, c.local_sync}, 0, 0, &name);
    mine.names.push_back(std::move(name));
    for (int64_t r : members) {
      states_.add_held(r);
      if (c.local_sync && !v213()) states_.add_count(r, 1);
    }
    if (!c.local_sync) states_.add_count_everywhere(1);
  }
  std::vector<int64_t> members_of_call(const GroupCallSpec& c) const {
    if (c.ranks) return sorted_row(*c.ranks);
    std::vector<int64_t> all(static_cast<std::size_t>(plan_.world));
    for (int64_t r = 0; r < plan_.world; ++r) all[static_cast<std::size_t>(r)] = r;
    return all;
  }

  const CreationPlan& plan_;
  int64_t me_;
  std::vector<ProgramItem> items_;
  RankStates states_;
  GroupNames out_;
  std::size_t item_ = 0;
  std::unordered_map<int64_t, Owner> seq_;
  std::unordered_map<std::string, Owner> hashed_;
  std::vector<std::vector<int64_t>> sides_;
};

}  // namespace

std::vector<ProgramItem> group_program_items(const CreationPlan& plan) {
  std::vector<ProgramItem> items;
  const std::size_t at = std::min(plan.mesh_at, plan.program.size());
  for (std::size_t i = 0; i < at; ++i) items.push_back({true, i});
  for (std::size_t i = 0; i < plan.batches.size(); ++i) items.push_back({false, i});
  for (std::size_t i = at; i < plan.program.size(); ++i) items.push_back({true, i});
  return items;
}

GroupNames name_groups(const CreationPlan& plan, int64_t me) { return Namer(plan, me).run(); }

std::string_view non_member_result(TorchVersion v, bool split_or_local) {
  return split_or_local && v == TorchVersion::k2_13 ? "None" : "NON_GROUP_MEMBER";
}

std::string describe_call(const GroupCallSpec& c, std::size_t index) {
  std::string out = "process_groups[" + std::to_string(index) + "]: ";
  if (c.kind == GroupCallSpec::Kind::kSplitGroup) {
    out += "split_group(split_ranks=[";
    for (std::size_t k = 0; k < c.split_ranks.size() && k < 8; ++k) out += (k ? ", " : "") + format_ranks(c.split_ranks[k], 16);
    if (c.split_ranks.size() > 8) out += ", ... (" + std::to_string(c.split_ranks.size()) + " groups)";
    out += "]";
  } else {
    out += "new_group(";
    out += c.ranks ? "ranks=" + format_ranks(*c.ranks, 16) : "ranks=None";
    if (c.local_sync) out += ", use_local_synchronization=True";
  }
  if (c.group_desc) out += ", group_desc=" + quote_input(*c.group_desc);
  return out + ")";
}

std::string hashed_group_name(const std::vector<int64_t>& ranks, int64_t salt) {
  return sha1_hex(join_ranks(ranks) + "_" + std::to_string(salt));
}

}  // namespace meshsim
