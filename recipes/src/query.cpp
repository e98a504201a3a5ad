#include "meshsim/query.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <istream>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <type_traits>
#include <unordered_map>

#include "meshsim/json_codec.hpp"
#include "meshsim/json_tape.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "meshsim/inline_vector.hpp"
#include "meshsim/mesh_layout.hpp"

namespace meshsim::query {

namespace {

using json::Json;
using json::NullAs;
using json::TapeValue;

static_assert(json::kMaxTapeDepth <= 2 * kMaxDepth,
              "the fast reader must refuse whatever nesting the engine refuses");

// Args gives typed access to a request's arguments, with errors that name the field. V is the
// request's value type: nlohmann's Json, or the fast reader's TapeValue (see answer_line).
// missing is the error of a request without a field its op reads (out of line: the readers
// below stay small).
[[noreturn, gnu::cold, gnu::noinline]] void missing(std::string_view field, std::string_view op) {
  throw InvalidArgument("missing argument '" + std::string(field) + "' for op " +
                        quote_input(op));
}
[[noreturn, gnu::cold, gnu::noinline]] void not_array(std::string_view field) {
  throw InvalidArgument("'" + std::string(field) + "' must be an array");
}

template <typename V>
struct Args {
  // Value is what a field reads as: a reference into nlohmann's tree, or a tape view.
  using Value = std::conditional_t<std::is_same_v<V, Json>, const Json&, TapeValue>;
  const V& req;
  Convention conv;
  std::string_view op;
  int64_t budget = kDefaultMaxAnswerElements;  // the answer's element budget

  // Fields are string_views: their lengths are known where the literals are written.
  Value at(std::string_view field) const {
    return read([&]() -> Value {
      auto it = member(field);
      if (!it) missing(field, op);
      return *it;
    });
  }
  bool has(std::string_view field) const {
    auto it = member(field);
    return it && !it->is_null();
  }
  Layout layout(std::string_view field) const {
    return read([&] { return json::to_layout(at(field), field); });
  }
  IntTuple tuple(std::string_view field, NullAs nulls = NullAs::kError) const {
    return read([&] { return json::to_int_tuple(at(field), field, nulls); });
  }
  int64_t integer(std::string_view field) const {
    return read([&] { return json::to_int(at(field), field); });
  }
  Value list(std::string_view field) const {
    return read([&]() -> Value {
      Value j = at(field);
      if (!j.is_array()) not_array(field);
      return j;
    });
  }

  // read runs one read of the request's values (every reader above is one; a handler wraps its
  // own). `reading` stays above 0 when a read threw: that error's words may depend on the
  // reader (a value's dump), while an error thrown outside every read comes from the op on
  // values both readers read alike, and is worded alike (see fast_answer_into).
  template <typename F>
  decltype(auto) read(F&& f) const {
    ++reading;
    decltype(auto) v = f();
    --reading;
    return v;
  }
  mutable int reading = 0;

 private:
  auto member(std::string_view field) const {
    if constexpr (std::is_same_v<V, Json>) {
      return json::find(req, field);
    } else {
      return req.member(field);
    }
  }
};

// Out writes a result as compact JSON, as nlohmann's dump() would (answers are written directly:
// building a Json only to print it was most of a request's cost).
class Out {
 public:
  // The answer is written through a cursor into one buffer and copied into the string once
  // (str()). Each writer makes room for what it may write first (room), so the bytes themselves
  // are stored with no per-byte size checks; a tuple makes room for all of its nodes at once.
  Out() {
    buf_.resize_uninit(buf_.capacity());
    cur_ = buf_.data();
    end_ = cur_ + buf_.size();
  }
  template <std::size_t N>
  void lit(const char (&text)[N]) {
    put(text, N - 1);
  }
  void put(const char* p, std::size_t n) {
    room(n);
    if (n) std::memcpy(cur_, p, n);
    cur_ += n;
  }
  void put(std::string_view text) { put(text.data(), text.size()); }
  void put(char c) {
    room(1);
    *cur_++ = c;
  }
  void integer(int64_t v) {
    room(kMaxDigits);
    digits(v);
  }
  void boolean(bool b) {
    if (b) {
      lit("true");
    } else {
      lit("false");
    }
  }
  void tuple(const IntTuple& t) {
    room(tuple_bytes(t));
    nodes(t.nodes());
  }
  void layout(const Layout& l) {
    room(tuple_bytes(l.shape()) + tuple_bytes(l.stride()) + 32);
    copy("{\"shape\":");
    nodes(l.shape().nodes());
    copy(",\"stride\":");
    nodes(l.stride().nodes());
    *cur_++ = '}';
  }
  void ints(const meshsim::detail::InlineVector<int64_t, 16>& v) {
    ints(std::span<const int64_t>(v.data(), v.size()));
  }
  void ints(std::span<const int64_t> v) {
    put('[');
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) put(',');
      integer(v[i]);
    }
    put(']');
  }
  // list writes n elements, each by `element(i)`.
  template <typename F>
  void list(std::size_t n, F element) {
    put('[');
    for (std::size_t i = 0; i < n; ++i) {
      if (i) put(',');
      element(i);
    }
    put(']');
  }
  void json(const Json& j);
  std::string str() const { return std::string(buf_.data(), used()); }
  void str_into(std::string& out) const { out.assign(buf_.data(), used()); }

 private:
  static constexpr std::size_t kMaxDigits = 20;  // "-9223372036854775808"
  // A tuple's text is at most its nodes' digits and one bracket or comma per node, and two.
  static std::size_t tuple_bytes(const IntTuple& t) {
    return static_cast<std::size_t>(t.node_count()) * (kMaxDigits + 2) + 2;
  }
  std::size_t used() const { return static_cast<std::size_t>(cur_ - buf_.data()); }
  // room makes at least n bytes writable at the cursor.
  void room(std::size_t n) {
    if (static_cast<std::size_t>(end_ - cur_) >= n) return;
    const std::size_t at = used();
    buf_.resize_uninit(2 * buf_.size() + n);
    cur_ = buf_.data() + at;
    end_ = buf_.data() + buf_.size();
  }
  // The writers below store without checks: their caller made room.
  template <std::size_t N>
  void copy(const char (&text)[N]) {
    std::memcpy(cur_, text, N - 1);
    cur_ += N - 1;
  }
  void digits(int64_t v) {
    if (v >= 0 && v < 10) {  // most of a layout's integers
      *cur_++ = static_cast<char>('0' + v);
      return;
    }
    cur_ = std::to_chars(cur_, cur_ + kMaxDigits, v).ptr;
  }
  // nodes walks the preorder nodes once (indexing children one by one is quadratic).
  void nodes(const IntTuple::Node* n) {
    if (n->arity == IntTuple::kLeaf) {
      digits(n->value);
      return;
    }
    *cur_++ = '[';
    const IntTuple::Node* c = n + 1;
    for (int k = 0; k < n->arity; ++k, c += c->span) {
      if (k) *cur_++ = ',';
      nodes(c);
    }
    *cur_++ = ']';
  }
  // The buffer's size is its capacity; the answer is [data, cur_).
  meshsim::detail::InlineVector<char, 512> buf_;
  char* cur_;
  char* end_;
};

// A handler reads its arguments and writes its result. Most are written once, as generic lambdas
// instantiated for both request types; mesh.program and mesh.equal read nlohmann's tree only.
using JsonHandler = void (*)(const Args<Json>&, Out&);
using TapeHandler = void (*)(const Args<TapeValue>&, Out&);
struct Handler {
  JsonHandler json;
  TapeHandler tape;  // null: the op is answered from nlohmann's tree only
};
template <typename F>
Handler both(F f) {
  return Handler{f, f};
}

// charge refuses, before anything is built, an answer that would hold more than the one element
// budget every answer has (mesh.program charges field by field; see mesh_program.hpp).
void refuse(const std::string& size, const std::string& what, int64_t budget) {
  throw ResourceExhausted(what + " would hold " + size + " elements, over the answer's budget of " +
                          std::to_string(budget) + " (raise it with --max-elements)");
}
void charge(int64_t elements, const std::string& what, int64_t budget) {
  if (elements > budget) refuse(std::to_string(elements), what, budget);
}
// charge_product charges a * b (a, b >= 0) without forming a product that may overflow.
void charge_product(int64_t a, int64_t b, const std::string& what, int64_t budget) {
  if (b > 0 && a > budget / b) refuse(std::to_string(a) + " x " + std::to_string(b), what, budget);
}

// IntList holds a request's short integer lists without touching the heap.
using IntList = json::ShortIntList;

// A layout result; a handler in one line.
#define MESHSIM_LAYOUT_OP(expr) both([](const auto& a, Out& o) { o.layout(expr); })

struct NameHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using HandlerTable = std::unordered_map<std::string, Handler, NameHash, std::equal_to<>>;

const HandlerTable& handlers() {
  static const HandlerTable table = [] {
    HandlerTable t;
    t["size"] = both([](const auto& a, Out& o) { o.integer(size(a.layout("layout"))); });
    t["cosize"] = both([](const auto& a, Out& o) { o.integer(cosize(a.layout("layout"))); });
    t["rank"] = both([](const auto& a, Out& o) { o.integer(a.layout("layout").rank()); });
    t["depth"] = both([](const auto& a, Out& o) { o.integer(a.layout("layout").depth()); });
    t["compact_stride"] = both([](const auto& a, Out& o) {
      o.tuple(compact_stride(a.tuple("shape"), a.conv));
    });
    t["shape_div"] = both([](const auto& a, Out& o) {
      o.tuple(shape_div(a.tuple("a"), a.tuple("b")));
    });
    t["crd2idx"] = both([](const auto& a, Out& o) {
      Layout l = a.layout("layout");
      IntList out;
      for (const auto& c : a.list("coords")) {
        const IntTuple coord = a.read([&] { return json::to_int_tuple(c, "coords", NullAs::kZero); });
        out.push_back(crd2idx(coord, l, a.conv));
      }
      o.ints(out);
    });
    t["idx2crd"] = both([](const auto& a, Out& o) {
      IntTuple shape = a.tuple("shape");
      charge_product(static_cast<int64_t>(a.list("indices").size()), shape.leaf_count() + 1,
                     "idx2crd of " + std::to_string(a.list("indices").size()) + " indices over " +
                         std::to_string(shape.leaf_count()) + " modes",
                     a.budget);
      const IntTuple stride = a.has("stride") ? a.tuple("stride") : compact_stride(shape, a.conv);
      std::vector<IntTuple> out;
      for (const auto& i : a.list("indices")) {
        const IntTuple index = a.read([&] { return json::to_int_tuple(i, "indices", NullAs::kZero); });
        out.push_back(idx2crd(index, shape, stride));
      }
      o.list(out.size(), [&](std::size_t k) { o.tuple(out[k]); });
    });
    t["coalesce"] = MESHSIM_LAYOUT_OP(coalesce(a.layout("layout"), a.conv));
    t["coalesce_profile"] =
        MESHSIM_LAYOUT_OP(coalesce(a.layout("layout"), a.tuple("profile", NullAs::kZero), a.conv));
    t["filter"] = MESHSIM_LAYOUT_OP(filter(a.layout("layout"), a.conv));
    t["filter_profile"] =
        MESHSIM_LAYOUT_OP(filter(a.layout("layout"), a.tuple("profile", NullAs::kZero), a.conv));
    t["complement"] = MESHSIM_LAYOUT_OP(complement(a.layout("layout"), 1, a.conv));
    t["complement_bound"] =
        MESHSIM_LAYOUT_OP(complement(a.layout("layout"), a.integer("bound"), a.conv));
    t["composition"] = MESHSIM_LAYOUT_OP(composition(a.layout("a"), a.layout("b"), a.conv));
    t["logical_divide"] = MESHSIM_LAYOUT_OP(logical_divide(a.layout("a"), a.layout("b"), a.conv));
    t["logical_product"] =
        MESHSIM_LAYOUT_OP(logical_product(a.layout("a"), a.layout("b"), a.conv));
    t["composition_tiler"] = MESHSIM_LAYOUT_OP(
        composition(a.layout("a"), a.read([&] { return json::to_tiler(a.at("tiler"), "tiler"); }), a.conv));
    t["logical_divide_tiler"] = MESHSIM_LAYOUT_OP(
        logical_divide(a.layout("a"), a.read([&] { return json::to_tiler(a.at("tiler"), "tiler"); }), a.conv));
    t["logical_product_tiler"] = MESHSIM_LAYOUT_OP(
        logical_product(a.layout("a"), a.read([&] { return json::to_tiler(a.at("tiler"), "tiler"); }), a.conv));
    t["right_inverse"] = MESHSIM_LAYOUT_OP(right_inverse(a.layout("layout"), a.conv));
    t["left_inverse"] = MESHSIM_LAYOUT_OP(left_inverse(a.layout("layout"), a.conv));
    // _MeshLayout helpers: torch convention only.
    t["mesh_construct"] = MESHSIM_LAYOUT_OP(Layout(a.tuple("shape"), a.tuple("stride")));
    t["mesh_check_non_overlap"] = both([](const auto& a, Out& o) {
      o.boolean(mesh_check_non_overlap(a.layout("layout")));
    });
    t["mesh_check_orthogonal"] = both([](const auto& a, Out& o) {
      o.boolean(mesh_check_orthogonal(a.layout("layout")));
    });
    t["mesh_all_ranks_from_zero"] = both([](const auto& a, Out& o) {
      const Layout l = a.layout("layout");
      charge(size(l), "the ranks of " + to_string(l), a.budget);
      o.ints(mesh_all_ranks_from_zero(l));
    });
    t["mesh_top_level_sizes"] = both([](const auto& a, Out& o) {
      o.ints(mesh_top_level_sizes(a.layout("layout")));
    });
    t["mesh_nest"] = MESHSIM_LAYOUT_OP(mesh_nest(a.layout("layout")));
    t["mesh_coalesce"] = MESHSIM_LAYOUT_OP(mesh_coalesce(a.layout("layout")));
    t["mesh_flatten"] = MESHSIM_LAYOUT_OP(mesh_flatten(a.layout("layout")));
    t["mesh_getitem"] = MESHSIM_LAYOUT_OP(mesh_getitem(a.layout("layout"), a.integer("index")));
    t["mesh_splice"] = MESHSIM_LAYOUT_OP(mesh_splice(a.layout("layout"), a.integer("start"),
                                                     a.integer("end"), a.layout("insert")));
    t["mesh_unflatten"] = both([](const auto& a, Out& o) {
      const IntList sizes = a.read([&] { return json::to_short_int_list(a.at("sizes"), "sizes"); });
      o.layout(mesh_unflatten(a.layout("layout"), a.integer("dim"), sizes));
    });
    t["mesh_global_ranks"] = both([](const auto& a, Out& o) {
      const Layout l = a.layout("layout");
      const int64_t world = a.integer("world_size");
      // PyTorch answers layouts that reach past the world (the reference vectors pin it), so
      // only the size of the answer is bounded here.
      charge_product(size(complement(l, world, Convention::kTorch)), size(l),
                     "the groups of " + to_string(l) + " in a world of " + std::to_string(world), a.budget);
      const GroupTable groups = mesh_group_table(l, world);
      o.list(static_cast<std::size_t>(groups.count),
             [&](std::size_t g) { o.ints(groups.row(static_cast<int64_t>(g))); });
    });
    t["mesh_remap_to_tensor"] = both([](const auto& a, Out& o) {
      std::vector<int64_t> map = a.read([&] { return json::to_int_list(a.at("rank_map"), "rank_map"); });
      const Layout l = a.layout("layout");
      if (cosize(l) <= static_cast<int64_t>(map.size())) {
        charge_product(size(complement(l, static_cast<int64_t>(map.size()), Convention::kTorch)),
                       size(l), "the remapped tensor of " + to_string(l), a.budget);
      }
      const RemappedTensor t = mesh_remap_to_tensor(l, map);
      // Nest the row-major values into lists along t.shape.
      std::size_t pos = 0;
      auto nest = [&](auto& self, std::size_t dim) -> void {
        o.list(static_cast<std::size_t>(t.shape[dim]), [&](std::size_t) {
          if (dim + 1 == t.shape.size()) {
            o.integer(t.values[pos++]);
          } else {
            self(self, dim + 1);
          }
        });
      };
      nest(nest, 0);
    });
    t["mesh_disjoint"] = both([](const auto& a, Out& o) {
      std::vector<Layout> ls;
      for (const auto& j : a.list("layouts")) {
        ls.push_back(a.read([&] { return json::to_layout(j, "layouts"); }));
      }
      o.boolean(mesh_disjoint(ls));
    });
    // DeviceMesh programs.
    t["mesh.program"] = Handler{[](const Args<Json>& a, Out& o) { o.json(run_mesh_program(a.req, a.budget)); },
                                nullptr};
    t["mesh.equal"] =
        Handler{[](const Args<Json>& a, Out& o) { o.json(run_mesh_equal(a.req)); }, nullptr};
    return t;
  }();
  return table;
}

#undef MESHSIM_LAYOUT_OP

Json error_answer(const Json& id, std::string_view type, std::string_view message) {
  return Json{{"id", id}, {"ok", false}, {"error", {{"type", type}, {"message", message}}}};
}

// dump never throws on invalid UTF-8 echoed from input: it is replaced.
std::string dump(const Json& j) { return json::output_text(j); }

void Out::json(const Json& j) { put(dump(j)); }

// RawId reads the text of a request's top-level "id" number, for ids that JSON's reader keeps
// only as a double (past int64/uint64, or with a fraction or exponent): they are echoed as sent;
// and for a request that is not valid JSON, the id it held before the error.
struct RawId final : nlohmann::json_sax<Json> {
  int depth = 0;
  bool at_id = false;
  std::optional<std::string> raw;

  bool scalar() {
    if (depth == 1 && at_id) raw.reset();
    at_id = false;
    return true;
  }
  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t v) override { return integer(std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override { return integer(std::to_string(v)); }
  bool integer(std::string text) {
    const bool mine = depth == 1 && at_id;
    scalar();
    if (mine) raw = std::move(text);
    return true;
  }
  bool number_float(number_float_t, const string_t& text) override {
    const bool mine = depth == 1 && at_id;
    scalar();
    if (mine) raw = text;
    return true;
  }
  bool string(string_t&) override { return scalar(); }
  bool binary(binary_t&) override { return scalar(); }
  bool start_object(std::size_t) override { return open(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    at_id = depth == 1 && k == "id";
    return true;
  }
  // A number past double's range is an error of JSON's reader; when it is the id, its text is
  // still echoed with the ParseError.
  bool parse_error(std::size_t, const std::string& token, const Json::exception& e) override {
    if (depth == 1 && at_id && e.id == 406) raw = token;
    error = e.what();
    return false;
  }
  std::string error;

 private:
  bool open() {
    if (depth == 1 && at_id) raw.reset();
    at_id = false;
    ++depth;
    return true;
  }
  bool close() {
    --depth;
    return true;
  }
};

RawId raw_id(std::string_view line) {
  RawId sax;
  Json::sax_parse(line.begin(), line.end(), &sax);
  return sax;
}

// finish writes an answer object, with the request's id as sent when `raw` holds its text.
std::string finish(const Json& answer, const std::optional<std::string>& raw) {
  if (!raw) return dump(answer);
  std::string out = "{";
  for (const auto& [k, v] : answer.items()) {
    if (out.size() > 1) out += ',';
    out += dump(Json(k));
    out += ':';
    out += k == "id" ? *raw : dump(v);
  }
  return out + "}";
}

}  // namespace

namespace detail {
// fast_answer answers a request from the fast reader's tape (json_tape.hpp) when the request is
// in its subset and its arguments read without error (the op may still refuse them);
// otherwise nullopt, and answer_line reads it again with nlohmann, which decides every error of
// reading and every unusual input. So the tape never words an answer that nlohmann's path would
// word differently: both run the same handlers on the same values, an op's own error is thrown
// alike by both, and the fast path only adds what it can write exactly (ids that are null,
// absent, integers or plain strings).
// fast_answer_into is fast_answer writing into `out` (kept by a caller that answers many lines,
// so its storage is reused): false, with `out` unchanged, where fast_answer is nullopt.
bool fast_answer_into(std::string_view line, std::string& out, int64_t max_elements) {
  json::JsonTape tape;
  if (!tape.read(line)) return false;
  const TapeValue req = tape.root();
  if (!req.is_object()) return false;
  // One pass over the members finds the three the engine reads itself (no key repeats here).
  std::optional<TapeValue> id, op, convention;
  for (auto m = req.begin(); m != req.end(); ++m) {
    const std::string_view key = m.key();
    if (key == "id") {
      id = *m;
    } else if (key == "op") {
      op = *m;
    } else if (key == "convention") {
      convention = *m;
    }
  }
  Out o;
  o.lit("{\"id\":");
  if (!id || id->is_null()) {
    o.lit("null");
  } else if (id->is_number_integer()) {
    o.integer(id->int_value());
  } else if (id->is_string()) {
    o.put('"');  // no escapes on the tape, and printable ASCII prints as itself
    o.put(id->string_value());
    o.put('"');
  } else {
    return false;
  }
  if (!op || !op->is_string()) return false;
  Convention conv = Convention::kTorch;
  if (convention && !convention->is_null()) {
    if (!convention->is_string()) return false;
    if (convention->string_value() == "cute") {
      conv = Convention::kCute;
    } else if (convention->string_value() != "torch") {
      return false;
    }
  }
  const std::string_view name = op->string_value();
  const auto h = handlers().find(name);
  if (h == handlers().end() || !h->second.tape) return false;
  if (name.starts_with("mesh_") && conv != Convention::kTorch) return false;
  o.lit(",\"ok\":true,\"result\":");
  const Args<TapeValue> args{req, conv, name, max_elements};
  try {
    h->second.tape(args, o);
  } catch (const Error& e) {
    // An error of the op itself (thrown outside every read: see Args::read) is what nlohmann's
    // path would throw at the same point on the same values: it is answered here, without
    // reading the request again. An error while reading is worded by nlohmann's path.
    if (args.reading != 0) return false;
    Json answer_id = nullptr;
    if (id && id->is_number_integer()) answer_id = id->int_value();
    if (id && id->is_string()) answer_id = std::string(id->string_value());
    out = finish(error_answer(answer_id, e.type_name(), e.what()), std::nullopt);
    return true;
  } catch (...) {
    return false;  // worded by nlohmann's path
  }
  o.put('}');
  o.str_into(out);
  return true;
}

std::optional<std::string> fast_answer(std::string_view line, int64_t max_elements) {
  std::string out;
  if (!fast_answer_into(line, out, max_elements)) return std::nullopt;
  return out;
}

}  // namespace detail

namespace {
// answer is answer_line, with or without the fast reader, written into `out`.
void answer(std::string_view line, bool fast, std::string& out, int64_t max_elements) {
  Json id = nullptr;
  std::optional<std::string> raw;
  try {
    if (const auto nul = line.find('\0'); nul != std::string_view::npos) {
      throw ParseError("request holds a NUL byte at offset " + std::to_string(nul));
    }
    if (max_elements < 1) throw InvalidArgument("the answer budget " + std::to_string(max_elements) + " is not >= 1");
    if (fast) {
      if (detail::fast_answer_into(line, out, max_elements)) return;
    }
    if (json::max_nesting(line) > 2 * kMaxDepth) {
      throw ParseError("request nests brackets deeper than " + std::to_string(2 * kMaxDepth));
    }
    Json req = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (req.is_discarded()) {
      RawId r = raw_id(line);
      raw = r.raw;
      const std::string why = r.error.substr(r.error.find(' ') + 1);  // past "[json.exception.x]"
      throw ParseError("request is not valid JSON" + (why.empty() ? std::string() : ": " + why));
    }
    if (!req.is_object()) throw ParseError("request must be a JSON object, got " + json::short_dump(req));
    if (req.contains("id")) id = req["id"];
    if (id.is_number_float()) raw = raw_id(line).raw;
    auto op_it = req.find("op");
    if (op_it == req.end() || !op_it->is_string()) {
      throw InvalidArgument("request needs a string field 'op'");
    }
    Convention conv = Convention::kTorch;
    if (req.contains("convention") && !req["convention"].is_null()) {
      if (!req["convention"].is_string()) {
        throw InvalidArgument("'convention' must be \"torch\" or \"cute\"");
      }
      conv = parse_convention(req["convention"].get<std::string>());
    }
    const std::string& op = op_it->get_ref<const std::string&>();
    auto h = handlers().find(op);
    if (h == handlers().end()) throw NotFound("unknown op " + quote_input(op));
    if (op.rfind("mesh_", 0) == 0 && conv != Convention::kTorch) {
      throw InvalidArgument("op " + quote_input(op) + " exists only in the torch convention");
    }
    // The answer object's keys in the order nlohmann's sorted map prints them.
    Out o;
    o.lit("{\"id\":");
    o.put(raw ? *raw : dump(id));
    o.lit(",\"ok\":true,\"result\":");
    h->second.json(Args<Json>{req, conv, op, max_elements}, o);
    o.put('}');
    o.str_into(out);
  } catch (const Error& e) {
    out = finish(error_answer(id, e.type_name(), e.what()), raw);
  } catch (const Json::exception& e) {
    out = finish(error_answer(id, "InvalidArgument", e.what()), raw);
  } catch (const std::bad_alloc&) {
    out = finish(error_answer(id, "ResourceExhausted", "out of memory answering the request"), raw);
  } catch (const std::exception& e) {
    out = finish(error_answer(id, "Internal", e.what()), raw);
  }
}
}  // namespace

std::vector<std::string> ops() {
  std::vector<std::string> out;
  for (const auto& [name, _] : handlers()) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string answer_line(std::string_view line, int64_t max_elements) {
  std::string out;
  answer(line, true, out, max_elements);
  return out;
}
std::string answer_line_nlohmann(std::string_view line, int64_t max_elements) {
  std::string out;
  answer(line, false, out, max_elements);
  return out;
}

RunResult run_lines(std::istream& in, std::ostream& out, bool flush, int64_t max_elements) {
  RunResult r;
  // emit writes an answer and its newline in one write (one sentry, one buffer copy).
  auto emit = [&](std::string& answer) {
    answer += '\n';
    out.write(answer.data(), static_cast<std::streamsize>(answer.size()));
    if (flush) out.flush();
    ++r.answers;
  };
  // Lines are read in chunks by the stream's own scan for '\n' (a search over its buffer): a
  // byte at a time was a third of a small request's cost. A read error surfaces as the
  // exception the stream buffer threw, so the answer can name it.
  constexpr std::streamsize kChunk = std::streamsize{1} << 16;
  const auto chunk = std::make_unique<char[]>(static_cast<std::size_t>(kChunk));
  const std::ios::iostate saved = in.exceptions();
  if (!in.bad()) in.exceptions(std::ios::badbit);
  // Answers go out in batches, yet never wait on the next request: the input is untied from the
  // output (a tied stream flushes its output before every read, a write(2) per answer), and the
  // output is flushed whenever no more input is waiting, before a read may block. A caller that
  // sends one request and waits for its answer gets it; a pipe of requests gets one write per
  // buffer of answers.
  std::ostream* const tied = in.tie(nullptr);
  std::string line;
  std::string reply;
  for (bool more = true; more;) {
    line.clear();
    bool too_long = false;
    try {
      if (!flush && in.rdbuf() != nullptr && in.rdbuf()->in_avail() <= 0) out.flush();
      for (;;) {
        in.getline(chunk.get(), kChunk);
        const std::streamsize got = in.gcount();  // the '\n' included, when one was read
        const bool at_end = in.eof() || (in.fail() && got != kChunk - 1);
        const bool full = !at_end && in.fail();  // kChunk - 1 bytes and no '\n' yet
        const std::size_t stored = static_cast<std::size_t>(at_end || full ? got : got - 1);
        if (stored > kMaxLineBytes - line.size()) {
          too_long = true;
          break;
        }
        line.append(chunk.get(), stored);
        if (at_end) more = false;
        if (!full) break;
        in.clear(in.rdstate() & ~std::ios::failbit);
      }
    } catch (const std::exception& e) {
      // A stream that fails to read (a directory, an I/O error) is an answer, not silence.
      reply = dump(error_answer(nullptr, "Unavailable", std::string("reading the input failed: ") + e.what()));
      emit(reply);
      r.input_ok = false;
      break;
    }
    if (too_long) {
      reply = dump(error_answer(nullptr, "ResourceExhausted",
                                "request line " + std::to_string(r.answers + 1) +
                                    " is longer than " + std::to_string(kMaxLineBytes) +
                                    " bytes; the rest of the input is not read"));
      emit(reply);
      r.input_ok = false;
      break;
    }
    if (line.find_first_not_of(" \t\r") != std::string::npos) {
      answer(line, true, reply, max_elements);  // one string for every answer: its storage is reused
      emit(reply);
    }
  }
  // The stream is left as reading it to the end leaves it (eofbit; badbit after a read error),
  // with the caller's exception mask back (which throws if the caller asked for that).
  in.tie(tied);
  in.exceptions(saved);
  in.clear(in.rdstate() & ~std::ios::failbit);
  out.flush();
  return r;
}

std::size_t run(std::istream& in, std::ostream& out, bool flush, int64_t max_elements) {
  return run_lines(in, out, flush, max_elements).answers;
}

}  // namespace meshsim::query
