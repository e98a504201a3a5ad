#include "meshsim/json_codec.hpp"
#include "meshsim/json_tape.hpp"

#include <cmath>
#include <string>

#include "json_depth.hpp"
#include "meshsim/error.hpp"

namespace meshsim::json {

namespace {
std::string name(std::string_view field) { return "'" + std::string(field) + "'"; }

// The readers below are written once for both value types, nlohmann's Json and the fast reader's
// TapeValue (json_tape.hpp), through these accessors.
const Json* member_of(const Json& j, std::string_view key) { return find(j, key); }
std::optional<TapeValue> member_of(const TapeValue& j, std::string_view key) {
  return j.member(key);
}
std::string_view text_of(const Json& j) { return j.get_ref<const std::string&>(); }
std::string_view text_of(const TapeValue& j) { return j.string_value(); }
// shown is a value for an error message, cut to ~200 characters (short_dump's rule).
std::string shown(const Json& j) { return short_dump(j); }
std::string shown(const TapeValue& j) {
  std::string s = j.dump();
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s;
}

template <typename V>
int64_t int_of(const V& j, std::string_view field) {
  if (j.is_number_unsigned()) {
    auto v = j.template get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) {
      throw OverflowError(name(field) + ": " + std::to_string(v) +
                          " does not fit in a 64-bit signed integer");
    }
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) return j.template get<int64_t>();
  if (j.is_number_float()) {
    // Integers beyond uint64 reach us as doubles: an overflow, not a type error.
    const double d = j.template get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) >= 9.2233720368547758e18) {
      throw OverflowError(name(field) + ": " + shown(j) + " does not fit in a 64-bit signed integer");
    }
  }
  throw InvalidArgument(name(field) + ": expected an integer, got " + shown(j));
}

template <typename V>
void build(const V& j, std::string_view field, NullAs nulls, IntTupleBuilder& b, int depth,
           int& nodes) {
  if (++nodes > kMaxNodes) {
    throw InvalidArgument(name(field) + " has more than " + std::to_string(kMaxNodes) + " nodes");
  }
  if (j.is_array()) {
    if (depth >= kMaxDepth) {
      throw InvalidArgument(name(field) + " is nested deeper than " + std::to_string(kMaxDepth));
    }
    if (j.empty()) throw InvalidArgument(name(field) + ": the empty tuple [] is not an IntTuple");
    b.open();
    for (const auto& e : j) build(e, field, nulls, b, depth + 1, nodes);
    b.close();
    return;
  }
  if (j.is_null() && nulls == NullAs::kZero) {
    b.leaf(0);
    return;
  }
  b.leaf(int_of(j, field));
}

// kPlainNodes bounds the tuples read from the tape in one pass (larger ones take the builder).
constexpr std::size_t kPlainNodes = 256;

template <typename V>
IntTuple int_tuple_of(const V& j, std::string_view field, NullAs nulls) {
  if constexpr (std::is_same_v<V, TapeValue>) {
    IntTuple::Node nodes[kPlainNodes];
    if (j.int_nodes(nodes, kPlainNodes, nulls == NullAs::kZero)) return IntTuple::from_nodes(nodes);
  }
  IntTupleBuilder b;
  int nodes = 0;
  build(j, field, nulls, b, 0, nodes);
  return b.take();
}

template <typename V>
Layout layout_of(const V& j, std::string_view field) {
  if (j.is_string()) return parse_layout(text_of(j));
  if (!j.is_object()) {
    throw InvalidArgument(name(field) +
                          ": a layout is {\"shape\": S, \"stride\": D} or \"S:D\", got " +
                          j.dump());
  }
  auto shape = member_of(j, "shape");
  if (!shape) shape = member_of(j, "sizes");
  auto stride = member_of(j, "stride");
  if (!stride) stride = member_of(j, "strides");
  if (!shape || !stride) {
    throw InvalidArgument(name(field) + ": a layout needs both \"shape\" and \"stride\"");
  }
  if constexpr (std::is_same_v<V, TapeValue>) {
    // Plain trees go straight off the tape; the field names below are only for errors.
    IntTuple::Node s[kPlainNodes];
    IntTuple::Node d[kPlainNodes];
    if (shape->int_nodes(s, kPlainNodes, false) && stride->int_nodes(d, kPlainNodes, false)) {
      return Layout(IntTuple::from_nodes(s), IntTuple::from_nodes(d));
    }
  }
  return Layout(int_tuple_of(*shape, std::string(field) + ".shape", NullAs::kError),
                int_tuple_of(*stride, std::string(field) + ".stride", NullAs::kError));
}

template <typename V>
Tiler tiler_of(const V& j, std::string_view field) {
  if (!j.is_array() || j.empty()) {
    throw InvalidArgument(name(field) + ": a tiler is a non-empty array of null, int or layout");
  }
  Tiler t;
  for (const auto& e : j) {
    if (e.is_null()) {
      t.emplace_back(std::nullopt);
    } else if (e.is_number()) {
      t.emplace_back(Layout(int_of(e, field), 1));
    } else {
      t.emplace_back(layout_of(e, field));
    }
  }
  return t;
}

// int_list_of reads an array of integers into `out` (cleared first): a std::vector, or a
// ShortIntList kept off the heap.
template <typename V, typename List>
void int_list_of(const V& j, std::string_view field, List& out) {
  if (!j.is_array()) throw InvalidArgument(name(field) + ": expected an array of integers");
  out.clear();
  for (const auto& e : j) out.push_back(int_of(e, field));
}
template <typename V>
std::vector<int64_t> int_list_of(const V& j, std::string_view field) {
  std::vector<int64_t> out;
  if (j.is_array()) out.reserve(j.size());
  int_list_of(j, field, out);
  return out;
}
}  // namespace

int64_t to_int(const Json& j, std::string_view field) { return int_of(j, field); }
int64_t to_int(const TapeValue& j, std::string_view field) { return int_of(j, field); }
IntTuple to_int_tuple(const Json& j, std::string_view field, NullAs nulls) {
  return int_tuple_of(j, field, nulls);
}
IntTuple to_int_tuple(const TapeValue& j, std::string_view field, NullAs nulls) {
  return int_tuple_of(j, field, nulls);
}
Layout to_layout(const Json& j, std::string_view field) { return layout_of(j, field); }
Layout to_layout(const TapeValue& j, std::string_view field) { return layout_of(j, field); }
Tiler to_tiler(const Json& j, std::string_view field) { return tiler_of(j, field); }
Tiler to_tiler(const TapeValue& j, std::string_view field) { return tiler_of(j, field); }
std::vector<int64_t> to_int_list(const Json& j, std::string_view field) {
  return int_list_of(j, field);
}
std::vector<int64_t> to_int_list(const TapeValue& j, std::string_view field) {
  return int_list_of(j, field);
}
ShortIntList to_short_int_list(const Json& j, std::string_view field) {
  ShortIntList out;
  int_list_of(j, field, out);
  return out;
}
ShortIntList to_short_int_list(const TapeValue& j, std::string_view field) {
  ShortIntList out;
  int_list_of(j, field, out);
  return out;
}

const Json* find(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

const Json& need(const Json& obj, std::string_view key, std::string_view where) {
  const Json* j = find(obj, key);
  if (!j) throw InvalidArgument(std::string(where) + ": missing field '" + std::string(key) + "'");
  return *j;
}

const Json& need_object(const Json& j, std::string_view where) {
  if (!j.is_object()) {
    throw InvalidArgument(std::string(where) + " must be an object, got " + short_dump(j));
  }
  return j;
}

std::string output_text(const Json& j, int indent) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

std::string to_str(const Json& j, std::string_view field) {
  if (!j.is_string()) throw InvalidArgument(name(field) + " must be a string, got " + short_dump(j));
  return j.get<std::string>();
}

std::vector<std::string> to_names(const Json& j, std::string_view field) {
  if (!j.is_array()) {
    throw InvalidArgument(name(field) + " must be a list of strings, got " + short_dump(j));
  }
  std::vector<std::string> out;
  out.reserve(j.size());
  for (const Json& e : j) out.push_back(to_str(e, field));
  return out;
}

void check_keys(const Json& obj, std::initializer_list<std::string_view> allowed,
                std::string_view where) {
  for (const auto& [k, _] : obj.items()) {
    bool known = false;
    for (std::string_view a : allowed) known = known || k == a;
    if (!known) throw InvalidArgument(std::string(where) + ": unknown field " + quote_input(k));
  }
}

std::string short_dump(const Json& j, std::size_t limit) {
  std::string s = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > limit) s = s.substr(0, limit) + "...";
  return s;
}





namespace {
// from_nodes walks the preorder nodes once (indexing children one by one is quadratic).
Json from_nodes(const IntTuple::Node* n) {
  if (n->arity == IntTuple::kLeaf) return n->value;
  Json a = Json::array();
  const IntTuple::Node* c = n + 1;
  for (int k = 0; k < n->arity; ++k, c += c->span) a.push_back(from_nodes(c));
  return a;
}
}  // namespace

Json from_int_tuple(const IntTuple& t) { return from_nodes(t.nodes()); }

Json from_layout(const Layout& l) {
  return Json{{"shape", from_int_tuple(l.shape())}, {"stride", from_int_tuple(l.stride())}};
}

int max_nesting(std::string_view text) { return detail::json_depth(text); }

}  // namespace meshsim::json
