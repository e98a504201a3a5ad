#include "meshsim/query.hpp"

#include <algorithm>
#include <functional>
#include <istream>
#include <optional>
#include <ostream>
#include <unordered_map>

#include "meshsim/json_codec.hpp"
#include "meshsim/mesh_program.hpp"
#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "meshsim/mesh_layout.hpp"

namespace meshsim::query {

namespace {

using json::Json;
using json::NullAs;

// Args gives typed access to a request's arguments, with errors that name the field.
struct Args {
  const Json& req;
  Convention conv;

  const Json& at(const char* field) const {
    auto it = req.find(field);
    if (it == req.end()) {
      throw InvalidArgument("missing argument '" + std::string(field) + "' for op '" +
                            req.at("op").get<std::string>() + "'");
    }
    return *it;
  }
  bool has(const char* field) const { return req.contains(field) && !req[field].is_null(); }
  Layout layout(const char* field) const { return json::to_layout(at(field), field); }
  IntTuple tuple(const char* field, NullAs nulls = NullAs::kError) const {
    return json::to_int_tuple(at(field), field, nulls);
  }
  int64_t integer(const char* field) const { return json::to_int(at(field), field); }
  const Json& list(const char* field) const {
    const Json& j = at(field);
    if (!j.is_array()) throw InvalidArgument("'" + std::string(field) + "' must be an array");
    return j;
  }
};

using Handler = std::function<Json(const Args&)>;

// charge refuses, before anything is built, an answer that would hold more than the one element
// budget every answer has (mesh.program charges field by field; see mesh_program.hpp).
void refuse(const std::string& size, const std::string& what) {
  throw ResourceExhausted(what + " would hold " + size + " elements, over the answer's budget of " +
                          std::to_string(max_answer_elements()) + " (raise it with --max-elements)");
}
void charge(int64_t elements, const std::string& what) {
  if (elements > max_answer_elements()) refuse(std::to_string(elements), what);
}
// charge_product charges a * b (a, b >= 0) without forming a product that may overflow.
void charge_product(int64_t a, int64_t b, const std::string& what) {
  if (b > 0 && a > max_answer_elements() / b) {
    refuse(std::to_string(a) + " x " + std::to_string(b), what);
  }
}

Json rank_list(const std::vector<int64_t>& v) { return Json(v); }

const std::unordered_map<std::string, Handler>& handlers() {
  static const std::unordered_map<std::string, Handler> table = [] {
    std::unordered_map<std::string, Handler> t;
    auto L = [](const Layout& l) { return json::from_layout(l); };
    t["size"] = [](const Args& a) { return Json(size(a.layout("layout"))); };
    t["cosize"] = [](const Args& a) { return Json(cosize(a.layout("layout"))); };
    t["rank"] = [](const Args& a) { return Json(a.layout("layout").rank()); };
    t["depth"] = [](const Args& a) { return Json(a.layout("layout").depth()); };
    t["compact_stride"] = [](const Args& a) {
      return json::from_int_tuple(compact_stride(a.tuple("shape"), a.conv));
    };
    t["shape_div"] = [](const Args& a) {
      return json::from_int_tuple(shape_div(a.tuple("a"), a.tuple("b")));
    };
    t["crd2idx"] = [](const Args& a) {
      Layout l = a.layout("layout");
      Json out = Json::array();
      for (const Json& c : a.list("coords")) {
        out.push_back(crd2idx(json::to_int_tuple(c, "coords", NullAs::kZero), l, a.conv));
      }
      return out;
    };
    t["idx2crd"] = [](const Args& a) {
      IntTuple shape = a.tuple("shape");
      charge_product(static_cast<int64_t>(a.list("indices").size()), shape.leaf_count() + 1,
                     "idx2crd of " + std::to_string(a.list("indices").size()) + " indices over " +
                         std::to_string(shape.leaf_count()) + " modes");
      Json out = Json::array();
      if (a.has("stride")) {
        IntTuple stride = a.tuple("stride");
        for (const Json& i : a.list("indices")) {
          out.push_back(json::from_int_tuple(
              idx2crd(json::to_int_tuple(i, "indices", NullAs::kZero), shape, stride)));
        }
      } else {
        IntTuple stride = compact_stride(shape, a.conv);
        for (const Json& i : a.list("indices")) {
          out.push_back(json::from_int_tuple(
              idx2crd(json::to_int_tuple(i, "indices", NullAs::kZero), shape, stride)));
        }
      }
      return out;
    };
    t["coalesce"] = [L](const Args& a) { return L(coalesce(a.layout("layout"), a.conv)); };
    t["coalesce_profile"] = [L](const Args& a) {
      return L(coalesce(a.layout("layout"), a.tuple("profile", NullAs::kZero), a.conv));
    };
    t["filter"] = [L](const Args& a) { return L(filter(a.layout("layout"), a.conv)); };
    t["filter_profile"] = [L](const Args& a) {
      return L(filter(a.layout("layout"), a.tuple("profile", NullAs::kZero), a.conv));
    };
    t["complement"] = [L](const Args& a) { return L(complement(a.layout("layout"), 1, a.conv)); };
    t["complement_bound"] = [L](const Args& a) {
      return L(complement(a.layout("layout"), a.integer("bound"), a.conv));
    };
    t["composition"] = [L](const Args& a) {
      return L(composition(a.layout("a"), a.layout("b"), a.conv));
    };
    t["logical_divide"] = [L](const Args& a) {
      return L(logical_divide(a.layout("a"), a.layout("b"), a.conv));
    };
    t["logical_product"] = [L](const Args& a) {
      return L(logical_product(a.layout("a"), a.layout("b"), a.conv));
    };
    t["composition_tiler"] = [L](const Args& a) {
      return L(composition(a.layout("a"), json::to_tiler(a.at("tiler"), "tiler"), a.conv));
    };
    t["logical_divide_tiler"] = [L](const Args& a) {
      return L(logical_divide(a.layout("a"), json::to_tiler(a.at("tiler"), "tiler"), a.conv));
    };
    t["logical_product_tiler"] = [L](const Args& a) {
      return L(logical_product(a.layout("a"), json::to_tiler(a.at("tiler"), "tiler"), a.conv));
    };
    t["right_inverse"] = [L](const Args& a) { return L(right_inverse(a.layout("layout"), a.conv)); };
    t["left_inverse"] = [L](const Args& a) { return L(left_inverse(a.layout("layout"), a.conv)); };
    // _MeshLayout helpers: torch convention only.
    t["mesh_construct"] = [L](const Args& a) {
      return L(Layout(a.tuple("shape"), a.tuple("stride")));
    };
    t["mesh_check_non_overlap"] = [](const Args& a) {
      return Json(mesh_check_non_overlap(a.layout("layout")));
    };
    t["mesh_all_ranks_from_zero"] = [](const Args& a) {
      const Layout l = a.layout("layout");
      charge(size(l), "the ranks of " + to_string(l));
      return rank_list(mesh_all_ranks_from_zero(l));
    };
    t["mesh_top_level_sizes"] = [](const Args& a) {
      return rank_list(mesh_top_level_sizes(a.layout("layout")));
    };
    t["mesh_nest"] = [L](const Args& a) { return L(mesh_nest(a.layout("layout"))); };
    t["mesh_coalesce"] = [L](const Args& a) { return L(mesh_coalesce(a.layout("layout"))); };
    t["mesh_flatten"] = [L](const Args& a) { return L(mesh_flatten(a.layout("layout"))); };
    t["mesh_getitem"] = [L](const Args& a) {
      return L(mesh_getitem(a.layout("layout"), a.integer("index")));
    };
    t["mesh_splice"] = [L](const Args& a) {
      return L(mesh_splice(a.layout("layout"), a.integer("start"), a.integer("end"),
                           a.layout("insert")));
    };
    t["mesh_unflatten"] = [L](const Args& a) {
      std::vector<int64_t> sizes = json::to_int_list(a.at("sizes"), "sizes");
      return L(mesh_unflatten(a.layout("layout"), a.integer("dim"), sizes));
    };
    t["mesh_global_ranks"] = [](const Args& a) {
      const Layout l = a.layout("layout");
      const int64_t world = a.integer("world_size");
      // PyTorch answers layouts that reach past the world (the reference vectors pin it), so
      // only the size of the answer is bounded here.
      charge_product(size(complement(l, world, Convention::kTorch)), size(l),
                     "the groups of " + to_string(l) + " in a world of " + std::to_string(world));
      return Json(mesh_global_ranks(l, world));
    };
    t["mesh_remap_to_tensor"] = [](const Args& a) {
      std::vector<int64_t> map = json::to_int_list(a.at("rank_map"), "rank_map");
      const Layout l = a.layout("layout");
      if (cosize(l) <= static_cast<int64_t>(map.size())) {
        charge_product(size(complement(l, static_cast<int64_t>(map.size()), Convention::kTorch)),
                       size(l), "the remapped tensor of " + to_string(l));
      }
      RemappedTensor t = mesh_remap_to_tensor(l, map);
      // Nest the row-major values into lists along t.shape.
      std::function<Json(std::size_t, std::size_t&)> nest = [&](std::size_t dim,
                                                                 std::size_t& pos) -> Json {
        Json arr = Json::array();
        for (int64_t i = 0; i < t.shape[dim]; ++i) {
          if (dim + 1 == t.shape.size()) {
            arr.push_back(t.values[pos++]);
          } else {
            arr.push_back(nest(dim + 1, pos));
          }
        }
        return arr;
      };
      std::size_t pos = 0;
      return nest(0, pos);
    };
    t["mesh_disjoint"] = [](const Args& a) {
      std::vector<Layout> ls;
      for (const Json& j : a.list("layouts")) ls.push_back(json::to_layout(j, "layouts"));
      return Json(mesh_disjoint(ls));
    };
    // DeviceMesh programs.
    t["mesh.program"] = [](const Args& a) { return run_mesh_program(a.req); };
    t["mesh.equal"] = [](const Args& a) { return run_mesh_equal(a.req); };
    return t;
  }();
  return table;
}

Json error_answer(const Json& id, std::string_view type, std::string_view message) {
  return Json{{"id", id}, {"ok", false}, {"error", {{"type", type}, {"message", message}}}};
}

// dump never throws on invalid UTF-8 echoed from input: it is replaced.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

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

std::vector<std::string> ops() {
  std::vector<std::string> out;
  for (const auto& [name, _] : handlers()) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string answer_line(std::string_view line) {
  Json id = nullptr;
  std::optional<std::string> raw;
  try {
    if (const auto nul = line.find('\0'); nul != std::string_view::npos) {
      throw ParseError("request holds a NUL byte at offset " + std::to_string(nul));
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
    if (!req.is_object()) throw ParseError("request must be a JSON object, got " + req.dump());
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
    if (h == handlers().end()) throw NotFound("unknown op '" + op + "'");
    if (op.rfind("mesh_", 0) == 0 && conv != Convention::kTorch) {
      throw InvalidArgument("op '" + op + "' exists only in the torch convention");
    }
    const Json result = h->second(Args{req, conv});
    // Written directly (the answer object's keys in the order nlohmann's sorted map prints
    // them): building a 3-key object only to print it cost a tenth of a request.
    std::string out = "{\"id\":";
    out += raw ? *raw : dump(id);
    out += ",\"ok\":true,\"result\":";
    out += dump(result);
    out += '}';
    return out;
  } catch (const Error& e) {
    return finish(error_answer(id, e.type_name(), e.what()), raw);
  } catch (const Json::exception& e) {
    return finish(error_answer(id, "InvalidArgument", e.what()), raw);
  } catch (const std::bad_alloc&) {
    return finish(error_answer(id, "ResourceExhausted", "out of memory answering the request"), raw);
  } catch (const std::exception& e) {
    return finish(error_answer(id, "Internal", e.what()), raw);
  }
}

RunResult run_lines(std::istream& in, std::ostream& out, bool flush) {
  RunResult r;
  std::string line;
  std::streambuf* sb = in.rdbuf();
  auto emit = [&](const std::string& answer) {
    out << answer << '\n';
    if (flush) out.flush();
    ++r.answers;
  };
  for (;;) {
    line.clear();
    int c = 0;
    bool too_long = false;
    try {
      while ((c = sb->sbumpc()) != std::char_traits<char>::eof() && c != '\n') {
        if (line.size() >= kMaxLineBytes) {
          too_long = true;
          break;
        }
        line.push_back(static_cast<char>(c));
      }
    } catch (const std::exception& e) {
      // A stream that fails to read (a directory, an I/O error) is an answer, not silence.
      emit(dump(error_answer(nullptr, "Unavailable", std::string("reading the input failed: ") + e.what())));
      r.input_ok = false;
      break;
    }
    if (too_long) {
      emit(dump(error_answer(nullptr, "ResourceExhausted",
                             "request line " + std::to_string(r.answers + 1) +
                                 " is longer than " + std::to_string(kMaxLineBytes) +
                                 " bytes; the rest of the input is not read")));
      r.input_ok = false;
      break;
    }
    if (line.find_first_not_of(" \t\r") != std::string::npos) emit(answer_line(line));
    if (c == std::char_traits<char>::eof()) break;
  }
  out.flush();
  return r;
}

std::size_t run(std::istream& in, std::ostream& out, bool flush) {
  return run_lines(in, out, flush).answers;
}

}  // namespace meshsim::query
