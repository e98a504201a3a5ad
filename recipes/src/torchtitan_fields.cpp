#include "torchtitan_fields.hpp"

#include <algorithm>
#include <cmath>
#include <array>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/text_fields.hpp"

namespace meshsim::torchtitan::detail {

namespace {

enum class Kind { kInt, kFloat, kNumber, kBool, kStr, kChoice, kList, kDict };

// A Literal's choices, the unused ones empty (held by value: an initializer_list member would
// point at an array that ends with the table's initializer).
constexpr std::size_t kMaxChoices = 8;
struct Field {
  std::string_view section, name;
  Kind kind;
  bool optional;
  std::array<std::string_view, kMaxChoices> choices;
};

bool is_choice(const Field& f, std::string_view v) {
  for (std::string_view c : f.choices) {
    if (c.empty()) break;
    if (c == v) return true;
  }
  return false;
}

const std::vector<Field>& fields() {
  static const std::vector<Field> f{
#include "torchtitan_fields.inc"
  };
  return f;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInt: return "an integer";
    case Kind::kFloat: return "a float";
    case Kind::kNumber: return "a number";
    case Kind::kBool: return "a boolean";
    case Kind::kStr: return "a string";
    case Kind::kChoice: return "one of its choices";
    case Kind::kList: return "an array";
    case Kind::kDict: return "a table";
  }
  return "?";
}

bool fits(const Field& f, const nlohmann::json& v) {
  switch (f.kind) {
    case Kind::kInt: return v.is_number_integer();
    case Kind::kFloat:
    case Kind::kNumber: return v.is_number();
    case Kind::kBool: return v.is_boolean();
    case Kind::kStr: return v.is_string();
    case Kind::kChoice:
      return v.is_string() && is_choice(f, v.get_ref<const std::string&>());
    case Kind::kList: return v.is_array();
    case Kind::kDict: return v.is_object();
  }
  return false;
}

}  // namespace

const char* json_kind(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a float";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "a table";
}

void check_saved_fields(const nlohmann::json& doc, const std::string& where) {
  if (!doc.is_object()) return;
  std::vector<std::string_view> sections;
  for (const Field& f : fields()) {
    if (std::find(sections.begin(), sections.end(), f.section) == sections.end()) sections.push_back(f.section);
  }
  for (std::string_view section : sections) {
    const auto it = doc.find(std::string(section));
    if (it == doc.end() || !it->is_object()) continue;  // a section that is not a table: job_file.cpp names it
    // training's and parallelism's keys of other torchtitan generations, and the keys of the
    // checkpointing policy and the loss (their classes differ between configs), job_file.cpp
    // checks; here only their types.
    const bool own_keys = section != "training" && section != "parallelism" && section != "activation_checkpoint" &&
                          section != "loss";
    std::vector<std::string> known;
    for (const Field& f : fields()) {
      if (f.section == section) known.emplace_back(f.name);
    }
    for (const auto& [key, value] : it->items()) {
      const std::string at = std::string(section) + "." + key;
      const Field* f = nullptr;
      for (const Field& x : fields()) {
        if (x.section == section && x.name == key) f = &x;
      }
      if (!f) {
        if (own_keys) {
          throw InvalidArgument(where + ": unknown key " + std::string(section) + "." + quote_input(key) +
                                ": torchtitan 0.3.0's config has no such key" + preset::did_you_mean(key, known));
        }
        continue;
      }
      if (value.is_null()) {
        if (f->optional) continue;
        throw InvalidArgument(where + ": " + at + " is null, and torchtitan's " + at +
                              " is not optional: give a value or leave the key out");
      }
      if (fits(*f, value)) continue;
      if (f->kind == Kind::kInt && value.is_number_float() && std::abs(value.get<double>()) >= 9223372036854775808.0 &&
          value.get<double>() == std::floor(value.get<double>())) {
        // JSON's reader keeps an integer past 2^64 as a float: it is an integer too large.
        throw OutOfRange(where + ": " + at + " = " + value.dump() + " does not fit in 64 bits");
      }
      std::string why = where + ": " + at + " is " + json_kind(value) + ", not " + kind_name(f->kind);
      if (f->kind == Kind::kChoice) {
        std::string list;
        for (std::string_view c : f->choices) {
          if (!c.empty()) list += (list.empty() ? "" : ", ") + std::string(c);
        }
        why = where + ": " + at + " = " + quote_input(value.is_string() ? value.get<std::string>() : value.dump()) +
              " is not one of torchtitan's choices (" + list + ")";
      }
      throw InvalidArgument(why + " (torchtitan 0.3.0's " + at + ")");
    }
  }
}

}  // namespace meshsim::torchtitan::detail
