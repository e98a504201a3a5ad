#include "meshsim/device_mesh.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "checked_math.hpp"
#include "device_mesh_parts.hpp"
#include "flat_modes.hpp"
#include "rank_map.hpp"
#include "universe.hpp"

namespace meshsim {

using namespace mesh_detail;

namespace mesh_detail {

std::size_t mix(std::size_t seed, std::size_t v) {
  return seed ^ (v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

std::string join(const std::vector<std::string>& v, std::string_view sep, bool quote) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += quote ? "'" + v[i] + "'" : v[i];
  }
  return out;
}

std::string py_tuple(const std::vector<std::string>& v) {
  return "(" + join(v, ", ", true) + (v.size() == 1 ? ",)" : ")");
}

std::string py_list(const std::vector<std::string>& v) { return "[" + join(v, ", ", true) + "]"; }

std::string int_list(std::span<const int64_t> v) {
  std::string out = "(";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (v.size() == 1 ? ",)" : ")");  // Python's tuple repr
}

void check_dims(std::size_t ndim, std::string_view what) {
  if (ndim > static_cast<std::size_t>(kMaxMeshDims)) {
    throw InvalidArgument(std::string(what) + ": " + std::to_string(ndim) +
                          " mesh dims exceed the limit of " + std::to_string(kMaxMeshDims));
  }
}

// check_utf8 refuses a name that is not UTF-8 text: every report, repr and saved file carries
// names as text (a Python bytes name would otherwise pass and break them later).
void check_utf8(std::string_view name, std::string_view what) {
  std::size_t i = 0;
  while (i < name.size()) {
    const auto c = static_cast<unsigned char>(name[i]);
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len != 0 && i + len <= name.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(name[i + k]) >> 6) == 0x2;
    if (ok && len > 1) {
      // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8 either.
      uint32_t cp = c & (0x7F >> len);
      for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(name[i + k]) & 0x3F);
      ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (!ok) {
      // The message itself must be text: bytes past ASCII are written as \xNN.
      std::string shown;
      for (const char b : name.substr(0, 64)) {
        const auto u = static_cast<unsigned char>(b);
        if (u >= 0x20 && u < 0x7F) {
          shown += b;
        } else {
          const char* hex = "0123456789abcdef";
          shown += std::string("\\x") + hex[u >> 4] + hex[u & 0xF];
        }
      }
      throw InvalidArgument(std::string(what) + " '" + shown + (name.size() > 64 ? "...'" : "'") +
                            " is not UTF-8 text (at byte " + std::to_string(i) + ")");
    }
    i += len;
  }
}

void check_unique_names(const std::vector<std::string>& names, std::string_view where) {
  check_dims(names.size(), "mesh_dim_names");
  for (const std::string& n : names) check_utf8(n, "mesh_dim_name");
  const auto twice = [&](std::string_view dup) {
    throw InvalidArgument("Each mesh_dim_name must be unique. " + quote_input(dup) +
                          " appears twice in " + py_list(names) + std::string(where));
  };
  // A mesh's few names: every pair (string == tests the lengths first, so most pairs cost one
  // comparison); a sort beyond, where the pairs would be many. Either way the message names the
  // smallest repeated name.
  if (names.size() <= 16) {
    const std::string* dup = nullptr;
    for (std::size_t i = 1; i < names.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (names[i] == names[j] && (!dup || names[i] < *dup)) dup = &names[i];
      }
    }
    if (dup) twice(*dup);
    return;
  }
  boost::container::small_vector<std::string_view, 16> sorted(names.begin(), names.end());
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) twice(*dup);
}

void check_device_type(const std::string& device_type) {
  const bool letters =
      !device_type.empty() && std::all_of(device_type.begin(), device_type.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      });
  if (!letters) {
    throw InvalidArgument("Device type with index is not supported but got '" + device_type +
                          "': the device type must be letters only (e.g. 'cuda', not 'cuda:0')");
  }
}

const BackendConfig& default_config() {
  static const BackendConfig c;
  return c;
}

std::vector<BackendConfig> checked_configs(std::vector<BackendConfig> configs, int ndim) {
  if (!configs.empty() && static_cast<int>(configs.size()) != ndim) {
    throw InvalidArgument("backend_override should have the same length as the number of mesh "
                          "dimensions, but got " + std::to_string(configs.size()) + " and " +
                          std::to_string(ndim) + ".");
  }
  return configs;
}

Layout row_major(std::span<const int64_t> shape, const char* what) {
  if (shape.empty()) throw InvalidArgument(std::string(what) + ": the mesh shape must not be empty");
  check_dims(shape.size(), what);
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 1) {
      throw InvalidArgument(std::string(what) + ": mesh size " + std::to_string(s) + " in " +
                            int_list(shape) + " is not >= 1");
    }
    n = checked_mul(n, s, "mesh size");
  }
  // (shape):(suffix products), written once: sizes >= 1 and a checked product make it valid
  // by construction (its cosize is its size), and every suffix product is at most n.
  detail::InlineVector<int64_t, 16> stride(shape.size(), 0);
  int64_t suffix = 1;
  for (std::size_t k = shape.size(); k-- > 0;) {
    stride[k] = suffix;
    suffix *= shape[k];
  }
  Layout out = detail::NodeAccess::blank();
  detail::LayoutBuilder b(out);
  b.open();
  for (std::size_t k = 0; k < shape.size(); ++k) b.leaf(shape[k], stride[k]);
  b.close();
  return out;
}

void check_root_names(const MeshNames& names, std::size_t ndim) {
  if (!names) return;
  check_unique_names(*names, "");
  if (names->size() != ndim) {
    throw InvalidArgument("mesh_shape and mesh_dim_names should have same length! Got " +
                          std::to_string(ndim) + " sizes and names " + py_list(*names));
  }
}

void check_world(std::optional<int64_t> world, int64_t n) {
  if (!world) return;
  if (*world < 1) throw InvalidArgument("world size " + std::to_string(*world) + " is not >= 1");
  if (n > *world) {
    throw InvalidArgument("Mesh should not be bigger than default world size " +
                          std::to_string(*world) + ", but found " + std::to_string(n) + " ranks!");
  }
}

}  // namespace mesh_detail

}  // namespace meshsim
