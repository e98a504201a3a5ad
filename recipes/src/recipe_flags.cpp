// recipe_flags.cpp — a recipe from the command line's spelling (--mesh, --shape, --rank-map,
// --slice/--flatten/--unflatten), from a --recipe file, or from a --preset: the one place that
// reads both recipe.hpp and preset.hpp (presets build recipes; recipes do not know presets).
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshsim/error.hpp"
#include "meshsim/json_codec.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/recipe.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim {

namespace {

// ---- command-line spelling ----

using text::parse_int;
using text::split;

std::vector<int64_t> parse_ints(const std::string& s, const std::string& what) {
  std::vector<int64_t> out;
  for (const auto& p : split(s, ',')) out.push_back(parse_int(p, what));
  if (out.empty()) throw InvalidArgument(what + ": expected a comma-separated list");
  return out;
}

int64_t checked_product(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t count = 1;
  for (int64_t s : shape) {
    if (s < 1) throw InvalidArgument(what + ": mesh size " + std::to_string(s) + " is not >= 1");
    if (count > INT64_MAX / s) {
      throw OverflowError(what + ": the product of the mesh sizes does not fit in int64");
    }
    count *= s;
  }
  return count;
}

// parse_rank_map reads "lo..hi" (inclusive) or a list; a range is checked against `count` and
// the enumeration limit before anything is expanded.
std::vector<int64_t> parse_rank_map(const std::string& s, int64_t count) {
  const auto dots = s.find("..");
  std::vector<int64_t> out;
  if (dots == std::string::npos) {
    out = parse_ints(s, "--rank-map");
  } else {
    const int64_t lo = parse_int(s.substr(0, dots), "--rank-map");
    const int64_t hi = parse_int(s.substr(dots + 2), "--rank-map");
    if (lo < 0) throw InvalidArgument("--rank-map " + s + ": rank " + std::to_string(lo) + " is negative");
    // 0 <= lo <= hi, so hi - lo cannot overflow.
    if (hi < lo || hi - lo == INT64_MAX) {
      throw InvalidArgument("--rank-map " + s + " is not a range lo..hi with lo <= hi");
    }
    const int64_t span = hi - lo;
    if (span + 1 != count) {
      throw InvalidArgument("--rank-map " + s + " holds " + std::to_string(span + 1) +
                            " ranks but the mesh has " + std::to_string(count));
    }
    if (count > kMaxEnumeration) {
      throw ResourceExhausted("--rank-map " + s + ": " + std::to_string(count) +
                              " explicit ranks exceed the limit of " +
                              std::to_string(kMaxEnumeration));
    }
    out.resize(static_cast<std::size_t>(count));
    for (int64_t i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = lo + i;
  }
  if (static_cast<int64_t>(out.size()) != count) {
    throw InvalidArgument("--rank-map holds " + std::to_string(out.size()) +
                          " ranks but the mesh has " + std::to_string(count));
  }
  return out;
}

// valid_utf8 is whether `s` is well-formed UTF-8 (names are printed and written as JSON).
bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2
                            : (c >> 3) == 0x1E ? 3 : 4;
    if (extra == 4 || i + extra >= s.size()) return false;
    for (std::size_t k = 1; k <= extra; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += extra + 1;
  }
  return true;
}

void check_names_text(const std::vector<std::string>& names, const char* flag) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    if (n.empty()) {
      throw InvalidArgument(std::string(flag) + ": name " + std::to_string(i) + " of " + std::to_string(names.size()) +
                            " is empty; every named dim needs a non-empty name (for unnamed dims give --shape "
                            "without --names)");
    }
    if (!valid_utf8(n)) throw InvalidArgument(std::string(flag) + ": the name " + quote_input(n) + " is not valid UTF-8");
  }
}
// rethrow_in_file rethrows the decoder's error `e` with the file's name in front, as its type.
[[noreturn]] void rethrow_in_file(const Error& e, const std::string& where) {
  const std::string m = where + ": " + e.what();
  if (dynamic_cast<const ParseError*>(&e)) throw ParseError(m);
  if (dynamic_cast<const InvalidArgument*>(&e)) throw InvalidArgument(m);
  if (dynamic_cast<const OverflowError*>(&e)) throw OverflowError(m);
  if (dynamic_cast<const OutOfRange*>(&e)) throw OutOfRange(m);
  if (dynamic_cast<const ResourceExhausted*>(&e)) throw ResourceExhausted(m);
  if (dynamic_cast<const FailedPrecondition*>(&e)) throw FailedPrecondition(m);
  if (dynamic_cast<const NotFound*>(&e)) throw NotFound(m);
  throw InvalidArgument(m);
}

MeshRecipe recipe_from_file(const RecipeFlags& f) {
  const std::string where = "--recipe " + quote_input(f.recipe_file);
  if (!f.mesh.empty() || !f.shape.empty() || !f.names.empty() || !f.rank_map.empty() || f.world_size ||
      !f.steps.empty()) {
    throw InvalidArgument(where + " is the whole recipe: give no --mesh, --shape, --names, --rank-map, "
                          "--world-size or transformations with it");
  }
  const std::string text = read_text_file(f.recipe_file, kMaxRecipeFileBytes, "--recipe");
  if (json::max_nesting(text) > 64) throw ParseError(where + ": the JSON nests deeper than 64 levels");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ParseError(where + " is not valid JSON");
  if (!j.is_object()) throw ParseError(where + " must hold a JSON object (a mesh.program request)");
  MeshRecipe r;
  try {
    r = recipe_from_json(j);
  } catch (const Error& e) {
    rethrow_in_file(e, where);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(where + ": " + e.what());
  }
  if (f.rank) r.rank = f.rank;
  return r;
}

}  // namespace

MeshRecipe recipe_from_preset(const RecipeFlags& f) {
  if (!f.mesh.empty() || !f.shape.empty() || !f.names.empty() || !f.rank_map.empty() || !f.recipe_file.empty() ||
      !f.steps.empty()) {
    throw InvalidArgument("--preset " + quote_input(f.preset) + " is the whole recipe: give no --mesh, --shape, "
                          "--names, --rank-map, --recipe or transformations with it");
  }
  MeshRecipe r = preset::recipe(f.preset, f.world_size);
  if (f.rank) {
    if (*f.rank < 0 || *f.rank >= r.world_size) {
      throw OutOfRange("--rank " + std::to_string(*f.rank) + " is out of range [0, " + std::to_string(r.world_size) + ")");
    }
    r.rank = f.rank;
  }
  return r;
}

MeshRecipe recipe_from_flags(const RecipeFlags& f) {
  if (!f.preset.empty()) return recipe_from_preset(f);
  if (!f.recipe_file.empty()) return recipe_from_file(f);
  MeshRecipe r;
  RootSpec& root = r.root;
  if (!f.mesh.empty()) {
    if (!f.shape.empty() || !f.names.empty()) {
      throw InvalidArgument("give either --mesh or --shape/--names, not both");
    }
    std::vector<std::string> names;
    for (const auto& kv : split(f.mesh, ',')) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) throw InvalidArgument("--mesh: " + quote_input(kv) + " is not name=size");
      names.push_back(kv.substr(0, eq));
      root.shape.push_back(parse_int(kv.substr(eq + 1), "--mesh " + kv));
    }
    check_names_text(names, "--mesh");
    root.names = std::move(names);
  } else if (!f.shape.empty()) {
    root.shape = parse_ints(f.shape, "--shape");
    if (!f.names.empty()) root.names = split(f.names, ',');
    if (root.names) check_names_text(*root.names, "--names");
  } else {
    throw InvalidArgument("give the mesh with --mesh dp=2,tp=4 or --shape 2,4 [--names dp,tp]");
  }
  if (root.shape.size() > static_cast<std::size_t>(kMaxMeshDims)) {
    throw InvalidArgument("the mesh has " + std::to_string(root.shape.size()) +
                          " dims, over the limit of " + std::to_string(kMaxMeshDims));
  }
  const int64_t count = checked_product(root.shape, f.mesh.empty() ? "--shape" : "--mesh");
  if (f.world_size && *f.world_size < 1) {
    throw InvalidArgument("--world-size " + std::to_string(*f.world_size) + " is not >= 1");
  }
  if (f.rank_map.empty()) {
    root.kind = RootSpec::Kind::kInit;
    r.world_size = f.world_size.value_or(count);
  } else {
    root.kind = RootSpec::Kind::kRanks;
    root.ranks = parse_rank_map(f.rank_map, count);
    int64_t max_rank = 0;
    for (int64_t v : root.ranks) {
      if (v < 0) throw InvalidArgument("--rank-map: rank " + std::to_string(v) + " is negative");
      max_rank = std::max(max_rank, v);
    }
    if (!f.world_size && max_rank == INT64_MAX) {
      throw OverflowError("--rank-map: rank " + std::to_string(max_rank) +
                          " leaves no room for a world size in int64");
    }
    r.world_size = f.world_size.value_or(max_rank + 1);
  }
  if (f.rank) {
    if (*f.rank < 0 || *f.rank >= r.world_size) {
      throw OutOfRange("--rank " + std::to_string(*f.rank) + " is out of range [0, " +
                       std::to_string(r.world_size) + ")");
    }
    r.rank = f.rank;
  }
  if (f.steps.size() > static_cast<std::size_t>(kMaxRecipeSteps)) {
    throw ResourceExhausted(std::to_string(f.steps.size()) + " transformations exceed the limit of " +
                            std::to_string(kMaxRecipeSteps));
  }
  for (const RecipeFlags::Step& s : f.steps) {
    StepSpec st;
    st.on = "_last";
    if (s.kind == "slice") {
      st.kind = StepSpec::Kind::kSlice;
      st.names = split(s.arg, ',');
      check_names_text(st.names, "--slice");
    } else if (s.kind == "flatten") {
      st.kind = StepSpec::Kind::kFlatten;
      if (!s.arg.empty()) {
        st.flatten_name = s.arg;
        check_names_text({s.arg}, "--flatten");
      }
    } else if (s.kind == "unflatten") {
      st.kind = StepSpec::Kind::kUnflatten;
      auto parts = split(s.arg, ':');
      if (parts.size() != 3) {
        throw InvalidArgument("--unflatten " + quote_input(s.arg) + ": expected dim:sizes:names, e.g. tp:2,2:a,b");
      }
      if (!parts[0].empty() && std::all_of(parts[0].begin(), parts[0].end(), ::isdigit)) {
        st.dim_index = parse_int(parts[0], "--unflatten dim");
      } else {
        st.dim_name = parts[0];
      }
      st.sizes = parse_ints(parts[1], "--unflatten sizes");
      checked_product(st.sizes, "--unflatten sizes");
      st.names = split(parts[2], ',');
      check_names_text(st.names, "--unflatten");
      check_names_text({parts[0]}, "--unflatten");
    } else {
      throw InvalidArgument("unknown transformation " + quote_input(s.kind));
    }
    r.steps.push_back(std::move(st));
  }
  return r;
}

std::string recipe_origin(const RecipeFlags& flags) {
  if (!flags.recipe_file.empty()) return "--recipe " + quote_input(flags.recipe_file);
  if (!flags.preset.empty()) return "--preset " + quote_input(flags.preset);
  return "";
}

BuiltMeshes apply_in(const MeshRecipe& recipe, const std::string& origin) {
  if (origin.empty()) return apply(recipe);
  try {
    return apply(recipe);
  } catch (const Error& e) {
    rethrow_in_file(e, origin);
  }
}

BuiltMeshes apply_flags(const MeshRecipe& recipe, const RecipeFlags& flags) { return apply_in(recipe, recipe_origin(flags)); }

}  // namespace meshsim
