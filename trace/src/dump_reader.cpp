// Reading Flight Recorder dumps: bytes (pickle or JSON) into a Dump, and a directory of them.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <regex>
#include <unordered_map>

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

// from_json builds the pickle reader's object model from JSON, so one schema reader serves both.
uint32_t from_json(PyData& d, const nlohmann::json& j, int depth, const std::string& what) {
  if (depth > kMaxJsonDepth) throw InvalidArgument(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth));
  PyData::Node n;
  switch (j.type()) {
    case nlohmann::json::value_t::null: n.kind = K::kNone; break;
    case nlohmann::json::value_t::boolean: n.kind = K::kBool; n.i = j.get<bool>(); break;
    case nlohmann::json::value_t::number_integer: n.kind = K::kInt; n.i = j.get<int64_t>(); break;
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) throw OverflowError(what + ": integer " + std::to_string(u) + " does not fit in int64");
      n.kind = K::kInt;
      n.i = static_cast<int64_t>(u);
      break;
    }
    case nlohmann::json::value_t::number_float: n.kind = K::kFloat; n.f = j.get<double>(); break;
    case nlohmann::json::value_t::string: n.kind = K::kStr; n.s = j.get<std::string>(); break;
    case nlohmann::json::value_t::array:
    case nlohmann::json::value_t::object: {
      n.kind = j.is_array() ? K::kList : K::kDict;
      std::vector<uint32_t> items;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (j.is_object()) {
          PyData::Node key;
          key.kind = K::kStr;
          key.s = it.key();
          d.nodes.push_back(std::move(key));
          items.push_back(static_cast<uint32_t>(d.nodes.size() - 1));
        }
        items.push_back(from_json(d, *it, depth + 1, what));
      }
      n.items = std::move(items);
      break;
    }
    default: throw InvalidArgument(what + ": a JSON value of an unexpected kind");
  }
  d.nodes.push_back(std::move(n));
  return static_cast<uint32_t>(d.nodes.size() - 1);
}

// Schema walks over PyData with errors that name the file and the field's path.
class Walk {
 public:
  Walk(const PyData& d, const std::string& what, std::size_t budget) : d_(d), what_(what), left_(budget), budget_(budget) {}

  // charge: `bytes` more of decoded records, refused past the dump's budget.
  void charge(std::size_t bytes, const std::string& path) const {
    if (bytes > left_) {
      throw ResourceExhausted(what_ + ": at " + path + " its records decode to more than " + std::to_string(budget_) +
                              " bytes (32 per input byte, and 64 MiB more): a pickle whose memo names one big value " +
                              "many times, which no Flight Recorder writes");
    }
    left_ -= bytes;
  }
  const std::string& charged_str(uint32_t i, const std::string& path) const {
    const std::string& s = str(i, path);
    charge(32 + s.size(), path);
    return s;
  }

  [[noreturn]] void fail(const std::string& path, const std::string& why) const {
    throw InvalidArgument(what_ + ": " + path + " " + why);
  }
  const PyData::Node& node(uint32_t i) const { return d_.node(i); }
  const PyData::Node& expect(uint32_t i, K k, const std::string& path) const {
    const auto& n = d_.node(i);
    if (n.kind != k && !(k == K::kList && n.kind == K::kTuple)) {
      fail(path, std::string("is a ") + kind_name(n.kind) + ", not a " + kind_name(k));
    }
    return n;
  }
  std::optional<uint32_t> field(uint32_t dict, std::string_view key) const { return d_.get(dict, key); }
  uint32_t need(uint32_t dict, std::string_view key, const std::string& path) const {
    auto v = d_.get(dict, key);
    if (!v) fail(path, "has no field '" + std::string(key) + "'");
    return *v;
  }
  int64_t integer(uint32_t i, const std::string& path) const {
    const auto& n = d_.node(i);
    if (n.kind != K::kInt) fail(path, std::string("is a ") + kind_name(n.kind) + ", not an int");
    return n.i;
  }
  const std::string& str(uint32_t i, const std::string& path) const { return expect(i, K::kStr, path).s; }
  std::vector<std::string> strs(uint32_t i, const std::string& path) const {
    std::vector<std::string> out;
    const auto& l = expect(i, K::kList, path);
    charge(24, path);
    for (std::size_t k = 0; k < l.items.size(); ++k) out.push_back(charged_str(l.items[k], path + "[" + std::to_string(k) + "]"));
    return out;
  }
  std::vector<std::vector<int64_t>> sizes(uint32_t i, const std::string& path) const {
    std::vector<std::vector<int64_t>> out;
    const auto& l = expect(i, K::kList, path);
    charge(24, path);
    for (std::size_t k = 0; k < l.items.size(); ++k) {
      const std::string p = path + "[" + std::to_string(k) + "]";
      const auto& inner = expect(l.items[k], K::kList, p);
      charge(24 + 8 * inner.items.size(), p);
      std::vector<int64_t> dims;
      for (std::size_t m = 0; m < inner.items.size(); ++m) {
        const int64_t v = integer(inner.items[m], p + "[" + std::to_string(m) + "]");
        if (v < 0) fail(p + "[" + std::to_string(m) + "]", "is " + std::to_string(v) + ", not a size >= 0");
        dims.push_back(v);
      }
      out.push_back(std::move(dims));
    }
    return out;
  }

 private:
  const PyData& d_;
  const std::string& what_;
  mutable std::size_t left_;
  std::size_t budget_;
};

// parse_rank_list reads pg_config's ranks: the string "[0, 1, 2]" c10d writes (or a list).
std::vector<int64_t> parse_rank_list(const Walk& w, uint32_t v, const std::string& path, const DumpLimits& limits) {
  std::vector<int64_t> ranks;
  auto add = [&](int64_t r) {
    if (r < 0 || r > INT32_MAX) w.fail(path, "names rank " + std::to_string(r) + ", not in [0, 2^31)");
    if (ranks.size() >= limits.max_group_ranks) {
      throw ResourceExhausted("a group of more than " + std::to_string(limits.max_group_ranks) + " ranks at " + path);
    }
    ranks.push_back(r);
  };
  const auto& n = w.node(v);
  w.charge(24 + 8 * (n.kind == K::kStr ? n.s.size() / 2 : n.items.size()), path);
  if (n.kind == K::kList || n.kind == K::kTuple) {
    for (std::size_t k = 0; k < n.items.size(); ++k) add(w.integer(n.items[k], path + "[" + std::to_string(k) + "]"));
  } else if (n.kind == K::kStr) {
    std::string_view s = n.s;
    auto trim = [](std::string_view t) {
      while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
      while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
      return t;
    };
    s = trim(s);
    if (s.size() < 2 || s.front() != '[' || s.back() != ']') w.fail(path, "'" + n.s.substr(0, 60) + "' is not a list of ranks \"[0, 1]\"");
    s = trim(s.substr(1, s.size() - 2));
    while (!s.empty()) {
      const std::size_t comma = s.find(',');
      const std::string_view item = trim(s.substr(0, comma));
      const std::optional<int64_t> r = read_decimal(item);
      if (!r) w.fail(path, "'" + std::string(item.substr(0, 30)) + "' is not a rank");
      add(*r);
      if (comma == std::string_view::npos) break;
      s = s.substr(comma + 1);
    }
  } else {
    w.fail(path, std::string("is a ") + kind_name(n.kind) + ", not a list of ranks");
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

// parse_op splits "nccl:send 0->1" into the operation and, for send/recv, the group ranks.
void parse_op(const Walk& w, Entry& e, const std::string& path) {
  const std::string& name = e.profiling_name;
  const std::size_t colon = name.find(':');
  std::string rest = colon == std::string::npos ? name : name.substr(colon + 1);
  const std::size_t space = rest.find(' ');
  e.op = rest.substr(0, space);
  if (e.op.empty()) w.fail(path, "'" + name.substr(0, 60) + "' names no operation");
  if (e.op != "send" && e.op != "recv") return;
  const std::string meta = space == std::string::npos ? "" : rest.substr(space + 1);
  const std::string arrow = e.op == "send" ? "->" : "<-";
  const std::size_t a = meta.find(arrow);
  auto number = [&](std::string_view t) {
    const int64_t v = read_decimal(t).value_or(-1);
    if (v < 0) {
      w.fail(path, "'" + name.substr(0, 60) + "' is not '" + (e.op == "send" ? "nccl:send SRC->DST" : "nccl:recv DST<-SRC") + "'");
    }
    return v;
  };
  if (a == std::string::npos) number("");
  const int64_t first = number(std::string_view(meta).substr(0, a));
  const int64_t second = number(std::string_view(meta).substr(a + 2));
  if (e.op == "send") {
    e.src = first;
    e.dst = second;
  } else {
    e.dst = first;
    e.src = second;
  }
}

Dump decode(const PyData& d, int64_t rank, const std::string& path, const std::string& format, const DumpLimits& limits,
            std::size_t input_bytes) {
  const std::string what = "dump '" + path + "'";
  std::size_t budget = limits.decoded_bytes_floor;
  if (input_bytes > (SIZE_MAX - budget) / std::max<std::size_t>(limits.decoded_bytes_per_input_byte, 1)) {
    budget = SIZE_MAX;
  } else {
    budget += input_bytes * limits.decoded_bytes_per_input_byte;
  }
  Walk w(d, what, budget);
  Dump dump;
  dump.rank = rank;
  dump.path = path;
  dump.format = format;
  w.expect(d.root, K::kDict, "the top level");
  dump.version = w.str(w.need(d.root, "version", "the top level"), "version");
  if (dump.version.rfind("2.", 0) != 0) w.fail("version", "'" + dump.version.substr(0, 40) + "' is not 2.x (the Flight Recorder format this reads)");
  const uint32_t pgc = w.need(d.root, "pg_config", "the top level");
  const auto& pg = w.expect(pgc, K::kDict, "pg_config");
  std::unordered_map<std::string, std::size_t> group_at;  // name -> index in dump.groups
  for (std::size_t k = 0; k + 1 < pg.items.size(); k += 2) {
    const std::string key = w.charged_str(pg.items[k], "pg_config's key");
    const std::string p = "pg_config['" + key.substr(0, 60) + "']";
    const uint32_t g = pg.items[k + 1];
    w.expect(g, K::kDict, p);
    GroupConfig c;
    c.name = key;
    if (auto desc = w.field(g, "desc")) c.desc = w.charged_str(*desc, p + ".desc");
    c.ranks = parse_rank_list(w, w.need(g, "ranks", p), p + ".ranks", limits);
    if (auto [at, fresh] = group_at.emplace(c.name, dump.groups.size()); !fresh) {
      dump.groups[at->second] = std::move(c);  // a dict's later key wins
    } else {
      dump.groups.push_back(std::move(c));
    }
  }
  auto entries = w.field(d.root, "entries");  // the JSON form omits it when empty
  if (!entries) return dump;
  const auto& list = w.expect(*entries, K::kList, "entries");
  if (list.items.size() > limits.max_entries) {
    throw ResourceExhausted(what + ": " + std::to_string(list.items.size()) + " entries, over " + std::to_string(limits.max_entries));
  }
  dump.entries.reserve(list.items.size());
  for (std::size_t k = 0; k < list.items.size(); ++k) {
    const std::string p = "entries[" + std::to_string(k) + "]";
    const uint32_t v = list.items[k];
    w.expect(v, K::kDict, p);
    Entry e;
    e.record_id = w.integer(w.need(v, "record_id", p), p + ".record_id");
    if (auto id = w.field(v, "pg_id")) e.pg_id = w.integer(*id, p + ".pg_id");
    const uint32_t pgn = w.need(v, "process_group", p);
    const auto& t = w.expect(pgn, K::kList, p + ".process_group");
    if (t.items.size() != 2) w.fail(p + ".process_group", "has " + std::to_string(t.items.size()) + " items, not (name, desc)");
    w.charge(sizeof(Entry), p);
    e.group = w.charged_str(t.items[0], p + ".process_group[0]");
    e.desc = w.charged_str(t.items[1], p + ".process_group[1]");
    e.collective_seq_id = w.integer(w.need(v, "collective_seq_id", p), p + ".collective_seq_id");
    e.p2p_seq_id = w.integer(w.need(v, "p2p_seq_id", p), p + ".p2p_seq_id");
    if (auto id = w.field(v, "op_id")) e.op_id = w.integer(*id, p + ".op_id");
    e.profiling_name = w.charged_str(w.need(v, "profiling_name", p), p + ".profiling_name");
    w.charge(e.profiling_name.size(), p + ".profiling_name");  // its operation's copy
    parse_op(w, e, p + ".profiling_name");
    e.input_sizes = w.sizes(w.need(v, "input_sizes", p), p + ".input_sizes");
    e.output_sizes = w.sizes(w.need(v, "output_sizes", p), p + ".output_sizes");
    e.input_dtypes = w.strs(w.need(v, "input_dtypes", p), p + ".input_dtypes");
    e.output_dtypes = w.strs(w.need(v, "output_dtypes", p), p + ".output_dtypes");
    const std::string& st = w.str(w.need(v, "state", p), p + ".state");
    if (st == "scheduled") e.state = EntryState::kScheduled;
    else if (st == "started") e.state = EntryState::kStarted;
    else if (st == "completed") e.state = EntryState::kCompleted;
    else w.fail(p + ".state", "'" + st.substr(0, 40) + "' is not scheduled, started or completed");
    // c10d retires a record once its work is done; Gloo's records never leave "scheduled" (no
    // events to query), so a retired record counts as completed.
    if (auto rt = w.field(v, "retired")) {
      const auto& b = w.node(*rt);
      if (b.kind != K::kBool && b.kind != K::kInt) w.fail(p + ".retired", std::string("is a ") + kind_name(b.kind) + ", not a bool");
      if (b.i != 0) e.state = EntryState::kCompleted;
    }
    e.is_p2p = e.op == "send" || e.op == "recv";
    if (auto ip = w.field(v, "is_p2p")) {
      const auto& b = w.node(*ip);
      if (b.kind != K::kBool && b.kind != K::kInt) w.fail(p + ".is_p2p", std::string("is a ") + kind_name(b.kind) + ", not a bool");
      e.is_p2p = e.is_p2p || b.i != 0;
    }
    dump.entries.push_back(std::move(e));
  }
  return dump;
}

}  // namespace

Dump parse_dump(std::string_view bytes, int64_t rank, const std::string& path, const DumpLimits& limits) {
  const std::string what = "dump '" + path + "'";
  if (bytes.size() > limits.max_file_bytes) {
    throw ResourceExhausted(what + " is over " + std::to_string(limits.max_file_bytes) + " bytes");
  }
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80) {
    return decode(read_pickle(bytes, what), rank, path, "pickle", limits, bytes.size());
  }
  std::size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || bytes[first] != '{') {
    throw ParseError(what + " is neither a pickle (it does not start with the PROTO opcode 0x80) nor a JSON object");
  }
  // Refuse absurd nesting before the JSON parser sees it.
  const int best = json::max_nesting(bytes);
  if (best > kMaxJsonDepth) throw InvalidArgument(what + ": JSON nested " + std::to_string(best) + " deep, over " + std::to_string(kMaxJsonDepth));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw ParseError(what + " is not valid JSON: " + e.what());
  }
  PyData d;
  d.root = from_json(d, j, 0, what);
  d.index_dicts();
  return decode(d, rank, path, "json", limits, bytes.size());
}

DumpSet read_dump_dir(const std::string& dir, const std::optional<std::string>& prefix, const DumpLimits& limits) {
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
    static const std::regex exp(R"(^([\w\-]*?)(\d+)$)");
    std::map<std::string, int> prefixes;
    for (const auto& f : files) {
      std::smatch m;
      const std::string name = strip_ext(f.filename().string());
      if (std::regex_search(name, m, exp)) ++prefixes[m[1].str()];
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
      throw InvalidArgument("two dumps of rank " + std::to_string(rank) + ": '" + pos->second + "' and '" + f.string() + "'");
    }
    const std::string bytes = read_text_file(f.string(), limits.max_file_bytes, "dump");
    check_stop();
    set.dumps.push_back(parse_dump(bytes, rank, f.string(), limits));
  }
  if (set.dumps.empty()) {
    throw InvalidArgument("no dump in '" + dir + "' is named '" + set.prefix + "<rank>'");
  }
  std::sort(set.dumps.begin(), set.dumps.end(), [](const Dump& a, const Dump& b) { return a.rank < b.rank; });
  return set;
}

}  // namespace meshsim::trace
