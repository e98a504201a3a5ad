// Reading Flight Recorder dumps: bytes (pickle or JSON) into a Dump, and a directory of them.
#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <rapidjson/error/en.h>
#include <rapidjson/reader.h>

#include "meshsim/decimal.hpp"
#include "meshsim/error.hpp"
#include "meshsim/dump_reader.hpp"
#include "meshsim/json_codec.hpp"
#include "meshsim/pickle.hpp"
#include "meshsim/stop.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::trace {

const char* state_name(EntryState s) {
  switch (s) {
    case EntryState::kScheduled: return "scheduled";
    case EntryState::kStarted: return "started";
    case EntryState::kCompleted: return "completed";
  }
  return "?";
}

namespace {

using K = PyData::Kind;
constexpr int kMaxJsonDepth = 64;

// JsonToTape is RapidJSON's SAX handler that writes a dump's JSON onto the pickle reader's tape
// (strings read in place in the tape's copy of the text), so one schema reader serves both forms.
struct JsonToTape {
  PickleTape& t;
  std::size_t max_nodes;
  std::vector<uint32_t> stack;   // values of the open containers, innermost last
  std::vector<std::size_t> open;  // where each open container's values start on `stack`
  bool overflow = false, too_many = false;
  uint64_t big = 0;

  bool value(const PickleTape::Node& n) {
    if (t.nodes() >= max_nodes) {
      too_many = true;
      return false;
    }
    stack.push_back(t.add(n));
    return true;
  }
  bool scalar(K k, int64_t i) {
    PickleTape::Node n;
    n.kind = k;
    n.i = i;
    return value(n);
  }
  bool Null() { return scalar(K::kNone, 0); }
  bool Bool(bool b) { return scalar(K::kBool, b); }
  bool Int(int v) { return scalar(K::kInt, v); }
  bool Uint(unsigned v) { return scalar(K::kInt, v); }
  bool Int64(int64_t v) { return scalar(K::kInt, v); }
  bool Uint64(uint64_t v) {
    if (v > static_cast<uint64_t>(INT64_MAX)) {
      overflow = true;
      big = v;
      return false;
    }
    return scalar(K::kInt, static_cast<int64_t>(v));
  }
  bool Double(double d) {
    PickleTape::Node n;
    n.kind = K::kFloat;
    n.f = d;
    return value(n);
  }
  bool RawNumber(const char*, rapidjson::SizeType, bool) { return false; }
  bool String(const char* s, rapidjson::SizeType len, bool) {
    PickleTape::Node n;
    n.kind = K::kStr;
    n.own = true;
    n.n = len;
    n.at = static_cast<uint64_t>(s - t.text().data());
    return value(n);
  }
  bool Key(const char* s, rapidjson::SizeType len, bool copy) { return String(s, len, copy); }
  bool StartObject() {
    open.push_back(stack.size());
    return true;
  }
  bool StartArray() { return StartObject(); }
  bool end(K k) {
    const std::size_t from = open.back();
    open.pop_back();
    if (t.nodes() >= max_nodes) {
      too_many = true;
      return false;
    }
    const uint32_t v = t.add_container(k, stack.data() + from, stack.size() - from);
    stack.resize(from);
    stack.push_back(v);
    return true;
  }
  bool EndObject(rapidjson::SizeType) { return end(K::kDict); }
  bool EndArray(rapidjson::SizeType) { return end(K::kList); }
};

void read_json_tape(std::string_view bytes, const std::string& what, PickleTape& t) {
  t.clear();
  // Refuse absurd nesting before the JSON parser sees it.
  const int best = json::max_nesting(bytes);
  if (best > kMaxJsonDepth) throw InvalidArgument(what + ": JSON nested " + std::to_string(best) + " deep, over " + std::to_string(kMaxJsonDepth));
  // RapidJSON reads in place in the tape's copy of the text; the copy is padded with zeros (the
  // first ends the text for it; its SSE scans may load up to 15 bytes past that).
  std::string& text = t.text();
  text.assign(bytes);
  text.append(16, '\0');
  JsonToTape h{t, PickleLimits{}.max_nodes, {}, {}};
  rapidjson::InsituStringStream in(text.data());
  rapidjson::Reader reader;
  constexpr unsigned kFlags = rapidjson::kParseInsituFlag | rapidjson::kParseNanAndInfFlag | rapidjson::kParseStopWhenDoneFlag;
  const rapidjson::ParseResult r = reader.Parse<kFlags>(in, h);
  if (h.overflow) throw OverflowError(what + ": integer " + std::to_string(h.big) + " does not fit in int64");
  if (h.too_many) {
    throw ResourceExhausted(what + ": more than " + std::to_string(PickleLimits{}.max_nodes) + " JSON values");
  }
  if (r.IsError()) {
    throw ParseError(what + " is not valid JSON: " + rapidjson::GetParseError_En(r.Code()) + " at offset " +
                     std::to_string(r.Offset()));
  }
  // After the value only whitespace (and the padding) may follow, as json.load wants.
  for (std::size_t k = in.Tell(); k < bytes.size(); ++k) {
    const char c = bytes[k];
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') {
      throw ParseError(what + " is not valid JSON: text after the top-level value at offset " + std::to_string(k));
    }
  }
  if (h.stack.size() != 1) throw ParseError(what + " is not valid JSON: no value");
  t.set_root(h.stack.back());
}

// Schema walks over a tape with errors that name the file and the field's path. Paths are
// callables that make the text only when an error needs it (a dump of 10^5 records would
// otherwise build a million strings that no one reads).
// ListCache keeps the sizes and dtypes lists and the names one reader has made, by a hash of
// their items: the records of a step repeat a few shapes and names, so most records share a list
// or a name made before (one thread's
// cache, no lock; a list's reference count is touched by its own thread while reading).
class ListCache {
 public:
  static constexpr std::size_t kMaxLists = 4096;  // then it starts over: the lists live on in the records

  template <class L>
  using Table = std::unordered_multimap<uint64_t, L>;
  Table<SizesList> sizes;
  Table<DtypeList> dtypes;
  std::unordered_map<std::string_view, Text> texts;  // each key views its Text's own string

  // text: the copy of `s` this reader made before, or a new one kept.
  Text text(std::string_view s) {
    if (auto it = texts.find(s); it != texts.end()) return it->second;
    if (texts.size() >= kMaxLists) texts.clear();
    Text t(s);
    texts.emplace(std::string_view(t.str()), t);
    return t;
  }

  static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
  template <class L, class Same>
  static const L* find(const Table<L>& t, uint64_t h, const Same& same) {
    auto [lo, hi] = t.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      if (same(it->second.get())) return &it->second;
    }
    return nullptr;
  }
  template <class L>
  static L keep(Table<L>& t, uint64_t h, L list) {
    if (t.size() >= kMaxLists) t.clear();
    t.emplace(h, list);
    return list;
  }
};

class Walk {
 public:
  Walk(const PickleTape& t, const std::string& what, std::size_t budget) : t_(t), what_(what), left_(budget), budget_(budget) {}

  // charge: `bytes` more of decoded records, refused past the dump's budget.
  template <class P>
  void charge(std::size_t bytes, const P& path) const {
    if (bytes > left_) {
      throw ResourceExhausted(what_ + ": at " + path() + " its records decode to more than " + std::to_string(budget_) +
                              " bytes (32 per input byte, and 64 MiB more): a pickle whose memo names one big value " +
                              "many times, which no Flight Recorder writes");
    }
    left_ -= bytes;
  }
  template <class P>
  std::string_view charged_str(uint32_t i, const P& path) const {
    const std::string_view s = str(i, path);
    charge(32 + s.size(), path);
    return s;
  }

  [[noreturn]] void fail(const std::string& path, const std::string& why) const {
    throw InvalidArgument(what_ + ": " + path + " " + why);
  }
  const PickleTape& tape() const { return t_; }
  template <class P>
  void expect(uint32_t i, K k, const P& path) const {
    const K has = t_.kind(i);
    if (has != k && !(k == K::kList && has == K::kTuple)) fail(path(), std::string("is a ") + kind_name(has) + ", not a " + kind_name(k));
  }
  // field: the value under the str key `key` of dict `dict` (the last, as Python keeps).
  std::optional<uint32_t> field(uint32_t dict, std::string_view key) const {
    const uint32_t* it = t_.items(dict);
    for (uint32_t k = t_.size(dict); k >= 2; k -= 2) {
      if (t_.kind(it[k - 2]) == K::kStr && t_.str(it[k - 2]) == key) return it[k - 1];
    }
    return std::nullopt;
  }
  template <class P>
  uint32_t need(uint32_t dict, std::string_view key, const P& path) const {
    auto v = field(dict, key);
    if (!v) fail(path(), "has no field '" + std::string(key) + "'");
    return *v;
  }
  template <class P>
  int64_t integer(uint32_t i, const P& path) const {
    const K has = t_.kind(i);
    if (has != K::kInt) fail(path(), std::string("is a ") + kind_name(has) + ", not an int");
    return t_.node(i).i;
  }
  template <class P>
  std::string_view str(uint32_t i, const P& path) const {
    expect(i, K::kStr, path);
    return t_.str(i);
  }
  // strs and sizes: a record's dtypes and sizes, validated and charged as if copied (a memo that
  // names one list many times still costs its reading each time), the list itself shared with
  // the earlier records that hold it alike.
  template <class P>
  DtypeList strs(uint32_t i, const P& path, ListCache& cache) const {
    expect(i, K::kList, path);
    charge(24, path);
    const uint32_t n = t_.size(i);
    const uint32_t* it = t_.items(i);
    uint64_t h = n;
    for (uint32_t k = 0; k < n; ++k) {
      h = ListCache::mix(h, std::hash<std::string_view>{}(charged_str(it[k], [&] { return path() + "[" + std::to_string(k) + "]"; })));
    }
    auto same = [&](const std::vector<std::string>& v) {
      if (v.size() != n) return false;
      for (uint32_t k = 0; k < n; ++k) {
        if (v[k] != t_.str(it[k])) return false;
      }
      return true;
    };
    if (const DtypeList* hit = cache.find(cache.dtypes, h, same)) return *hit;
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t k = 0; k < n; ++k) out.emplace_back(t_.str(it[k]));
    return cache.keep(cache.dtypes, h, DtypeList(std::move(out)));
  }
  template <class P>
  SizesList sizes(uint32_t i, const P& path, ListCache& cache) const {
    expect(i, K::kList, path);
    charge(24, path);
    const uint32_t n = t_.size(i);
    const uint32_t* it = t_.items(i);
    uint64_t h = n;
    for (uint32_t k = 0; k < n; ++k) {
      auto p = [&] { return path() + "[" + std::to_string(k) + "]"; };
      expect(it[k], K::kList, p);
      const uint32_t m = t_.size(it[k]);
      const uint32_t* dims = t_.items(it[k]);
      charge(24 + 8 * std::size_t{m}, p);
      h = ListCache::mix(h, m);
      for (uint32_t j = 0; j < m; ++j) {
        const PickleTape::Node& x = t_.node(dims[j]);
        if (x.kind != K::kInt || x.i < 0) {
          auto pj = [&] { return p() + "[" + std::to_string(j) + "]"; };
          const int64_t v = integer(dims[j], pj);
          fail(pj(), "is " + std::to_string(v) + ", not a size >= 0");
        }
        h = ListCache::mix(h, static_cast<uint64_t>(x.i));
      }
    }
    auto same = [&](const std::vector<std::vector<int64_t>>& v) {
      if (v.size() != n) return false;
      for (uint32_t k = 0; k < n; ++k) {
        const uint32_t m = t_.size(it[k]);
        if (v[k].size() != m) return false;
        const uint32_t* dims = t_.items(it[k]);
        for (uint32_t j = 0; j < m; ++j) {
          if (v[k][j] != t_.node(dims[j]).i) return false;
        }
      }
      return true;
    };
    if (const SizesList* hit = cache.find(cache.sizes, h, same)) return *hit;
    std::vector<std::vector<int64_t>> out;
    out.reserve(n);
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t m = t_.size(it[k]);
      const uint32_t* dims = t_.items(it[k]);
      int64_t* d = out.emplace_back(m).data();
      for (uint32_t j = 0; j < m; ++j) d[j] = t_.node(dims[j]).i;
    }
    return cache.keep(cache.sizes, h, SizesList(std::move(out)));
  }

 private:
  const PickleTape& t_;
  const std::string& what_;
  mutable std::size_t left_;
  std::size_t budget_;
};

// RankCache keeps the rank lists already read from long strings: every rank's dump lists the
// default group's and its wide groups' ranks in the same words, so the readers of many dumps (one
// cache for all their threads) read each such string once and share its list after.
class RankCache {
 public:
  static constexpr std::size_t kMinBytes = 256;  // shorter strings are read as fast as looked up
  static constexpr std::size_t kMaxLists = 256;  // then it starts over: bounded by 256 lists' bytes

  std::optional<RankList> find(std::string_view s) const {
    const uint64_t k = key(s);
    std::lock_guard<std::mutex> lock(mu_);
    auto [lo, hi] = lists_.equal_range(k);
    for (auto it = lo; it != hi; ++it) {
      if (it->second.text == s) return it->second.ranks;
    }
    return std::nullopt;
  }
  void keep(std::string_view s, const RankList& ranks) {
    const uint64_t k = key(s);
    std::lock_guard<std::mutex> lock(mu_);
    if (lists_.size() >= kMaxLists) lists_.clear();  // the lists live on in the dumps that share them
    lists_.emplace(k, List{std::string(s), ranks});
  }

 private:
  struct List {
    std::string text;
    RankList ranks;
  };
  // key: the length and the first and last 64 bytes (hashing all of a 90 KB string cost more than
  // comparing it); a hit is then confirmed by comparing the whole text.
  static uint64_t key(std::string_view s) {
    const std::size_t n = std::min<std::size_t>(s.size(), 64);
    return std::hash<std::string_view>{}(s.substr(0, n)) * 31 + std::hash<std::string_view>{}(s.substr(s.size() - n)) * 7 +
           s.size();
  }
  mutable std::mutex mu_;
  std::unordered_multimap<uint64_t, List> lists_;
};

// parse_rank_list reads pg_config's ranks: the string "[0, 1, 2]" c10d writes (or a list).
RankList parse_rank_list(const Walk& w, uint32_t v, const std::string& path, const DumpLimits& limits, RankCache& cache) {
  const PickleTape& t = w.tape();
  std::vector<int64_t> ranks;
  auto add = [&](int64_t r) {
    if (r < 0 || r > INT32_MAX) w.fail(path, "names rank " + std::to_string(r) + ", not in [0, 2^31)");
    if (ranks.size() >= limits.max_group_ranks) {
      throw ResourceExhausted("a group of more than " + std::to_string(limits.max_group_ranks) + " ranks at " + path);
    }
    ranks.push_back(r);
  };
  const K kind = t.kind(v);
  auto p = [&] { return path; };
  w.charge(24 + 8 * (kind == K::kStr ? t.str(v).size() / 2 : t.size(v)), p);
  if (kind == K::kList || kind == K::kTuple) {
    for (uint32_t k = 0; k < t.size(v); ++k) add(w.integer(t.items(v)[k], [&] { return path + "[" + std::to_string(k) + "]"; }));
  } else if (kind == K::kStr) {
    std::string_view s = t.str(v);
    const bool cached = s.size() >= RankCache::kMinBytes;
    if (cached) {
      if (std::optional<RankList> known = cache.find(s)) return *std::move(known);
    }
    const std::string_view key = s;
    auto trim = [](std::string_view x) {
      while (!x.empty() && (x.front() == ' ' || x.front() == '\t')) x.remove_prefix(1);
      while (!x.empty() && (x.back() == ' ' || x.back() == '\t')) x.remove_suffix(1);
      return x;
    };
    s = trim(s);
    if (s.size() < 2 || s.front() != '[' || s.back() != ']') {
      w.fail(path, "'" + std::string(t.str(v).substr(0, 60)) + "' is not a list of ranks \"[0, 1]\"");
    }
    s = trim(s.substr(1, s.size() - 2));
    ranks.reserve(s.size() / 2 + 1);
    // One pass over "0, 1, 2": a rank of up to 9 digits is read here; anything else (a sign,
    // more digits, a stray character) goes to read_decimal, which words the refusal.
    std::size_t k = 0;
    while (k < s.size()) {
      const std::size_t begin = k;
      int64_t r = 0;
      for (; k < s.size(); ++k) {
        const unsigned d = static_cast<unsigned char>(s[k]) - '0';
        if (d > 9) break;
        if (k - begin < 9) r = r * 10 + d;  // a longer rank goes to read_decimal: nothing wraps here
      }
      const std::size_t stop = k;  // the digits' end; blanks, then a comma or the end, may follow
      while (k < s.size() && (s[k] == ' ' || s[k] == '\t')) ++k;
      const bool plain = stop > begin && stop - begin <= 9 && (k == s.size() || s[k] == ',');
      if (!plain) {
        const std::size_t comma = s.find(',', begin);
        const std::string_view item = trim(s.substr(begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin));
        const std::optional<int64_t> x = read_decimal(item);
        if (!x) w.fail(path, "'" + std::string(item.substr(0, 30)) + "' is not a rank");
        r = *x;
        k = comma == std::string_view::npos ? s.size() : comma;
      }
      add(r);
      if (k == s.size()) break;
      ++k;  // the comma
      while (k < s.size() && (s[k] == ' ' || s[k] == '\t')) ++k;
      if (k == s.size()) w.fail(path, "'' is not a rank");  // "[0, ]", as read_decimal would refuse it
    }
    if (!std::is_sorted(ranks.begin(), ranks.end())) std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    RankList list(std::move(ranks));
    if (cached) cache.keep(key, list);  // read whole and accepted: kept for the next dump
    return list;
  } else {
    w.fail(path, std::string("is a ") + kind_name(kind) + ", not a list of ranks");
  }
  if (!std::is_sorted(ranks.begin(), ranks.end())) std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

// parse_op splits "nccl:send 0->1" into the operation and, for send/recv, the group ranks.
template <class P>
void parse_op(const Walk& w, Entry& e, const P& path, ListCache& lists) {
  const std::string_view name = e.profiling_name;
  const std::size_t colon = name.find(':');
  const std::string_view rest = colon == std::string_view::npos ? name : name.substr(colon + 1);
  const std::size_t space = rest.find(' ');
  e.op = lists.text(rest.substr(0, space));
  if (e.op.empty()) w.fail(path(), "'" + std::string(name.substr(0, 60)) + "' names no operation");
  if (e.op != "send" && e.op != "recv") return;
  const std::string_view meta = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
  const std::string_view arrow = e.op == "send" ? "->" : "<-";
  const std::size_t a = meta.find(arrow);
  auto number = [&](std::string_view x) {
    const int64_t v = read_decimal(x).value_or(-1);
    if (v < 0) {
      w.fail(path(), "'" + std::string(name.substr(0, 60)) + "' is not '" +
                         (e.op == "send" ? "nccl:send SRC->DST" : "nccl:recv DST<-SRC") + "'");
    }
    return v;
  };
  if (a == std::string_view::npos) number("");
  const int64_t first = number(meta.substr(0, a));
  const int64_t second = number(meta.substr(a + 2));
  if (e.op == "send") {
    e.src = first;
    e.dst = second;
  } else {
    e.dst = first;
    e.src = second;
  }
}

// The fields of a record that are read, found in one pass over its dict (the last of a repeated
// key wins, as Python keeps it).
enum Field : int {
  kRecordId, kPgId, kProcessGroup, kCollectiveSeq, kP2pSeq, kOpId, kProfilingName, kInputSizes,
  kOutputSizes, kInputDtypes, kOutputDtypes, kState, kRetired, kIsP2p, kFields
};

int field_of(std::string_view k) {
  switch (k.size()) {
    case 5:
      if (k == "pg_id") return kPgId;
      if (k == "op_id") return kOpId;
      if (k == "state") return kState;
      return -1;
    case 6: return k == "is_p2p" ? kIsP2p : -1;
    case 7: return k == "retired" ? kRetired : -1;
    case 9: return k == "record_id" ? kRecordId : -1;
    case 10: return k == "p2p_seq_id" ? kP2pSeq : -1;
    case 11: return k == "input_sizes" ? kInputSizes : -1;
    case 12:
      if (k == "output_sizes") return kOutputSizes;
      if (k == "input_dtypes") return kInputDtypes;
      return -1;
    case 13:
      if (k == "process_group") return kProcessGroup;
      if (k == "output_dtypes") return kOutputDtypes;
      return -1;
    case 14: return k == "profiling_name" ? kProfilingName : -1;
    case 17: return k == "collective_seq_id" ? kCollectiveSeq : -1;
    default: return -1;
  }
}

Dump decode(const PickleTape& d, int64_t rank, const std::string& path, const std::string& format, const DumpLimits& limits,
            std::size_t input_bytes, RankCache& cache, ListCache& lists) {
  const std::string what = "dump '" + path + "'";
  std::size_t budget = limits.decoded_bytes_floor;
  if (input_bytes > (SIZE_MAX - budget) / std::max<std::size_t>(limits.decoded_bytes_per_input_byte, 1)) {
    budget = SIZE_MAX;
  } else {
    budget += input_bytes * limits.decoded_bytes_per_input_byte;
  }
  Walk w(d, what, budget);
  auto top = [] { return std::string("the top level"); };
  Dump dump;
  dump.rank = rank;
  dump.path = path;
  dump.format = format;
  w.expect(d.root(), K::kDict, top);
  dump.version = w.str(w.need(d.root(), "version", top), [] { return std::string("version"); });
  if (dump.version.rfind("2.", 0) != 0) w.fail("version", "'" + dump.version.substr(0, 40) + "' is not 2.x (the Flight Recorder format this reads)");
  const uint32_t pgc = w.need(d.root(), "pg_config", top);
  w.expect(pgc, K::kDict, [] { return std::string("pg_config"); });
  std::unordered_map<std::string_view, std::size_t> group_at;  // name -> index in dump.groups
  for (uint32_t k = 0; k + 1 < d.size(pgc); k += 2) {
    const uint32_t* pg = d.items(pgc);
    const std::string_view key = w.charged_str(pg[k], [] { return std::string("pg_config's key"); });
    const std::string p = "pg_config['" + std::string(key.substr(0, 60)) + "']";
    auto pp = [&] { return p; };
    const uint32_t g = pg[k + 1];
    w.expect(g, K::kDict, pp);
    GroupConfig c;
    c.name = key;
    if (auto desc = w.field(g, "desc")) c.desc = w.charged_str(*desc, [&] { return p + ".desc"; });
    c.ranks = parse_rank_list(w, w.need(g, "ranks", pp), p + ".ranks", limits, cache);
    if (auto [at, fresh] = group_at.emplace(key, dump.groups.size()); !fresh) {
      dump.groups[at->second] = std::move(c);  // a dict's later key wins
    } else {
      dump.groups.push_back(std::move(c));
    }
  }
  auto entries = w.field(d.root(), "entries");  // the JSON form omits it when empty
  if (!entries) return dump;
  w.expect(*entries, K::kList, [] { return std::string("entries"); });
  const uint32_t count = d.size(*entries);
  if (count > limits.max_entries) {
    throw ResourceExhausted(what + ": " + std::to_string(count) + " entries, over " + std::to_string(limits.max_entries));
  }
  dump.entries.resize(count);
  const uint32_t* list = d.items(*entries);
  // A pickle names each key once and refers back to it (the memo), so the records' keys are the
  // same few nodes: which field a key node is, remembered by node (direct-mapped; JSON's keys,
  // each a node of its own, just miss).
  constexpr uint32_t kSeen = 256;
  uint32_t seen_node[kSeen];
  int8_t seen_field[kSeen];
  std::fill(seen_node, seen_node + kSeen, UINT32_MAX);
  for (uint32_t k = 0; k < count; ++k) {
    auto p = [&] { return "entries[" + std::to_string(k) + "]"; };
    auto at = [&](const char* f) { return [&p, f] { return p() + f; }; };
    const uint32_t v = list[k];
    w.expect(v, K::kDict, p);
    uint32_t found[kFields];
    std::fill(found, found + kFields, UINT32_MAX);
    {
      const uint32_t* it = d.items(v);
      for (uint32_t j = 0; j + 1 < d.size(v); j += 2) {
        const uint32_t key = it[j];
        int f;
        if (seen_node[key % kSeen] == key) {
          f = seen_field[key % kSeen];
        } else {
          if (d.kind(key) != K::kStr) continue;
          f = field_of(d.str(key));
          seen_node[key % kSeen] = key;
          seen_field[key % kSeen] = static_cast<int8_t>(f);
        }
        if (f >= 0) found[f] = it[j + 1];
      }
    }
    auto need = [&](Field f, const char* name) {
      if (found[f] == UINT32_MAX) w.fail(p(), "has no field '" + std::string(name) + "'");
      return found[f];
    };
    Entry& e = dump.entries[k];
    e.record_id = w.integer(need(kRecordId, "record_id"), at(".record_id"));
    if (found[kPgId] != UINT32_MAX) e.pg_id = w.integer(found[kPgId], at(".pg_id"));
    const uint32_t pgn = need(kProcessGroup, "process_group");
    w.expect(pgn, K::kList, at(".process_group"));
    if (d.size(pgn) != 2) w.fail(p() + ".process_group", "has " + std::to_string(d.size(pgn)) + " items, not (name, desc)");
    w.charge(sizeof(Entry), p);
    e.group = lists.text(w.charged_str(d.items(pgn)[0], at(".process_group[0]")));
    e.desc = lists.text(w.charged_str(d.items(pgn)[1], at(".process_group[1]")));
    e.collective_seq_id = w.integer(need(kCollectiveSeq, "collective_seq_id"), at(".collective_seq_id"));
    e.p2p_seq_id = w.integer(need(kP2pSeq, "p2p_seq_id"), at(".p2p_seq_id"));
    if (found[kOpId] != UINT32_MAX) e.op_id = w.integer(found[kOpId], at(".op_id"));
    e.profiling_name = lists.text(w.charged_str(need(kProfilingName, "profiling_name"), at(".profiling_name")));
    w.charge(e.profiling_name.size(), at(".profiling_name"));  // its operation's copy
    parse_op(w, e, at(".profiling_name"), lists);
    e.input_sizes = w.sizes(need(kInputSizes, "input_sizes"), at(".input_sizes"), lists);
    e.output_sizes = w.sizes(need(kOutputSizes, "output_sizes"), at(".output_sizes"), lists);
    e.input_dtypes = w.strs(need(kInputDtypes, "input_dtypes"), at(".input_dtypes"), lists);
    e.output_dtypes = w.strs(need(kOutputDtypes, "output_dtypes"), at(".output_dtypes"), lists);
    const std::string_view st = w.str(need(kState, "state"), at(".state"));
    if (st == "scheduled") e.state = EntryState::kScheduled;
    else if (st == "started") e.state = EntryState::kStarted;
    else if (st == "completed") e.state = EntryState::kCompleted;
    else w.fail(p() + ".state", "'" + std::string(st.substr(0, 40)) + "' is not scheduled, started or completed");
    // c10d retires a record once its work is done; Gloo's records never leave "scheduled" (no
    // events to query), so a retired record counts as completed.
    if (found[kRetired] != UINT32_MAX) {
      const auto& b = d.node(found[kRetired]);
      if (b.kind != K::kBool && b.kind != K::kInt) w.fail(p() + ".retired", std::string("is a ") + kind_name(b.kind) + ", not a bool");
      if (b.i != 0) e.state = EntryState::kCompleted;
    }
    e.is_p2p = e.op == "send" || e.op == "recv";
    if (found[kIsP2p] != UINT32_MAX) {
      const auto& b = d.node(found[kIsP2p]);
      if (b.kind != K::kBool && b.kind != K::kInt) w.fail(p() + ".is_p2p", std::string("is a ") + kind_name(b.kind) + ", not a bool");
      e.is_p2p = e.is_p2p || b.i != 0;
    }
  }
  return dump;
}

// Scratch is what a reader keeps from dump to dump: its tape, the rank lists read (shared by
// every reader of one directory) and the sizes and dtypes lists it made (its own).
struct Scratch {
  PickleTape tape;
  RankCache& ranks;
  ListCache lists;
};

// parse_into is parse_dump with the caller's scratch.
Dump parse_into(std::string_view bytes, int64_t rank, const std::string& path, const DumpLimits& limits, Scratch& scratch) {
  PickleTape& tape = scratch.tape;
  const std::string what = "dump '" + path + "'";
  if (bytes.size() > limits.max_file_bytes) {
    throw ResourceExhausted(what + " is over " + std::to_string(limits.max_file_bytes) + " bytes");
  }
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80) {
    read_pickle_tape(bytes, what, tape);
    return decode(tape, rank, path, "pickle", limits, bytes.size(), scratch.ranks, scratch.lists);
  }
  std::size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || bytes[first] != '{') {
    throw ParseError(what + " is neither a pickle (it does not start with the PROTO opcode 0x80) nor a JSON object");
  }
  read_json_tape(bytes, what, tape);
  return decode(tape, rank, path, "json", limits, bytes.size(), scratch.ranks, scratch.lists);
}

}  // namespace

Dump parse_dump(std::string_view bytes, int64_t rank, const std::string& path, const DumpLimits& limits) {
  RankCache cache;
  Scratch scratch{{}, cache, {}};
  return parse_into(bytes, rank, path, limits, scratch);
}

DumpSet read_dump_dir(const std::string& dir, const std::optional<std::string>& prefix, const DumpLimits& limits,
                      unsigned workers) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw InvalidArgument("'" + dir + "' is not a directory of Flight Recorder dumps" + (ec ? ": " + ec.message() : ""));
  }
  // Every regular file below dir (symlinked directories are not followed; depth is bounded).
  std::vector<fs::path> files;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) throw InvalidArgument("'" + dir + "' cannot be read: " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) throw InvalidArgument("'" + dir + "' cannot be read: " + ec.message());
    if (it.depth() > 16) {
      it.disable_recursion_pending();
      continue;
    }
    std::error_code fe;
    if (!it->is_regular_file(fe)) continue;
    if (files.size() >= limits.max_files) {
      throw ResourceExhausted("'" + dir + "' holds more than " + std::to_string(limits.max_files) + " files");
    }
    files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  // rank_of: the rank of a file named <anything><prefix><digits>[.json|.pkl|.pickle], or -1.
  auto strip_ext = [](std::string name) {
    for (const char* ext : {".json", ".pkl", ".pickle"}) {
      const std::string e(ext);
      if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) return name.substr(0, name.size() - e.size());
    }
    return name;
  };
  DumpSet set;
  set.dir = dir;
  if (prefix) {
    if (prefix->empty()) throw InvalidArgument("--prefix '' is empty: give the text before each file's rank (rank_, say)");
    set.prefix = *prefix;
  } else {
    // fr_trace's inference: the prefix every "<word chars><digits>" name shares.
    // fr_trace's `^([\w\-]*?)(\d+)$`: a name of word characters and hyphens that ends in digits;
    // its prefix is the name before its last run of digits (matched by hand: std::regex cost more
    // than reading the dumps of a 4,096-rank job).
    auto word = [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    };
    std::map<std::string, int> prefixes;
    for (const auto& f : files) {
      const std::string name = strip_ext(f.filename().string());
      if (name.empty() || !std::all_of(name.begin(), name.end(), word)) continue;
      std::size_t digits = name.size();
      while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') --digits;
      if (digits == name.size()) continue;
      ++prefixes[name.substr(0, digits)];
    }
    if (prefixes.size() != 1) {
      // The most common few, with how many more: a directory of 10^5 unrelated names gives one line.
      std::vector<std::pair<int, std::string>> common;
      for (const auto& [p, n] : prefixes) common.emplace_back(-n, p);
      const std::size_t shown = std::min<std::size_t>(common.size(), 8);
      std::partial_sort(common.begin(), common.begin() + static_cast<std::ptrdiff_t>(shown), common.end());
      std::string seen;
      for (std::size_t k = 0; k < shown; ++k) {
        seen += (seen.empty() ? "" : ", ") + ("'" + common[k].second.substr(0, 60) + "' (" + std::to_string(-common[k].first) + " files)");
      }
      if (common.size() > shown) seen += ", and " + std::to_string(common.size() - shown) + " more";
      throw InvalidArgument("the files in '" + dir + "' share no one prefix before their ranks" +
                            (seen.empty() ? std::string(" (no file is named <prefix><rank>)") : " (" + seen + ")") +
                            ": give --prefix");
    }
    set.prefix = prefixes.begin()->first;
  }
  // The dumps to read, in file order; a second file of one rank ends the list there (an error
  // once every file before it has been read, as a reader going file by file would meet it).
  struct Job {
    std::string path;
    int64_t rank;
  };
  std::vector<Job> jobs;
  std::optional<InvalidArgument> duplicate;
  std::map<int64_t, std::string> seen;
  for (const auto& f : files) {
    const std::string name = strip_ext(f.filename().string());
    const std::size_t at = name.find(set.prefix);
    if (at == std::string::npos) continue;
    const std::string digits = name.substr(at + set.prefix.size());
    if (digits.empty() || digits.size() > 10 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const int64_t rank = *read_decimal(digits);  // at most 10 digits
    if (rank > INT32_MAX) continue;
    if (auto [pos, fresh] = seen.emplace(rank, f.string()); !fresh) {
      duplicate.emplace("two dumps of rank " + std::to_string(rank) + ": '" + pos->second + "' and '" + f.string() + "'");
      break;
    }
    jobs.push_back({f.string(), rank});
  }
  // Read and decode on `threads` threads, each with its own tape, taking the next file as it
  // finishes one; dumps land at their file's index, so the result (and the error, the first in
  // file order) is the same whatever the threads.
  const std::size_t threads = std::min<std::size_t>(
      jobs.size(), workers ? workers : std::max<unsigned>(1, std::thread::hardware_concurrency()));
  std::vector<Dump> dumps(jobs.size());
  std::vector<std::exception_ptr> errors(jobs.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> first_error{jobs.size()};
  const std::atomic<bool>* stop = detail::stop_flag;
  RankCache cache;
  auto work = [&] {
    StopScope scope(stop);
    Scratch scratch{{}, cache, {}};
    for (std::size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      if (i > first_error.load()) break;  // an earlier file failed: this one is never reported
      try {
        check_stop();
        const std::string bytes = read_text_file(jobs[i].path, limits.max_file_bytes, "dump");
        dumps[i] = parse_into(bytes, jobs[i].rank, jobs[i].path, limits, scratch);
      } catch (...) {
        errors[i] = std::current_exception();
        for (std::size_t e = first_error.load(); i < e && !first_error.compare_exchange_weak(e, i);) {
        }
      }
    }
  };
  if (threads <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
  }
  if (first_error.load() < jobs.size()) std::rethrow_exception(errors[first_error.load()]);
  if (duplicate) throw *duplicate;
  set.dumps = std::move(dumps);
  if (set.dumps.empty()) {
    throw InvalidArgument("no dump in '" + dir + "' is named '" + set.prefix + "<rank>'");
  }
  std::sort(set.dumps.begin(), set.dumps.end(), [](const Dump& a, const Dump& b) { return a.rank < b.rank; });
  return set;
}

}  // namespace meshsim::trace
