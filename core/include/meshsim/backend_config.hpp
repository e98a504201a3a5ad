// meshsim/backend_config.hpp — how a mesh dimension's communicator is configured: a value with
// equality and hashing, so the universe's group cache can key groups on it.
//
//   BackendConfig nccl{.backend = "nccl", .timeout = std::chrono::minutes(10),
//                      .options = NcclOptions{.high_priority_stream = true}};
//   BackendConfig same = nccl;
//   same == nccl && std::hash<BackendConfig>{}(same) == std::hash<BackendConfig>{}(nccl)
//
// Thread safety: a value type; const access from many threads is safe.
#pragma once

#include <chrono>
#include <map>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace meshsim {

// GlooOptions are Gloo's per-group settings: the transport devices (interface names or
// addresses; empty = the backend's default loopback device) and worker threads (0 = default).
struct GlooOptions {
  std::vector<std::string> devices;
  int threads = 0;
  friend bool operator==(const GlooOptions&, const GlooOptions&) = default;
};

// NcclOptions are NCCL's per-group settings. `split_from` names the group a split starts from
// by value: the parent's GroupRecord::name (`mesh.group_record(dim)->name`, e.g.
// "group[8:1]@nccl"), which is the same in every process and every run for the same parent, so
// configs that carry it can be keyed and sent between processes (an address could not).
// `config_blob` carries an opaque ncclConfig_t image compared byte for byte.
struct NcclOptions {
  bool high_priority_stream = false;
  std::optional<int64_t> split_color;
  std::optional<std::string> split_from;
  std::string config_blob;
  friend bool operator==(const NcclOptions&, const NcclOptions&) = default;
};

// OptionValue is one value of a backend's options object (a JSON scalar: PyTorch's Options
// attributes, e.g. `fake_option: 42`).
using OptionValue = std::variant<bool, int64_t, double, std::string>;

// BackendConfig selects and configures the backend of one group. An empty `backend` means the
// universe's default backend; a zero `timeout` means the backend's default timeout.
struct BackendConfig {
  std::string backend;
  std::chrono::milliseconds timeout{0};
  std::variant<std::monostate, GlooOptions, NcclOptions> options;
  // extras are the options object's other keys, kept as given (unknown keys are not rejected):
  // every backend receives them with the group and hands them back (Communicator::config).
  std::map<std::string, OptionValue> extras;

  friend bool operator==(const BackendConfig&, const BackendConfig&) = default;
  // hash is consistent with ==. fingerprint is a stable 64-bit FNV-1a digest of every field
  // (backend, timeout, which options, and each option's fields, strings length-prefixed):
  // equal configs have equal fingerprints in every process, run and platform, so it can key
  // groups across processes (Gloo and NCCL rendezvous).
  std::size_t hash() const { return static_cast<std::size_t>(fingerprint()); }
  uint64_t fingerprint() const;
  // to_string is a short readable form: "default", "nccl(timeout=600000ms,...)".
  std::string to_string() const;
};

}  // namespace meshsim

template <>
struct std::hash<meshsim::BackendConfig> {
  std::size_t operator()(const meshsim::BackendConfig& c) const noexcept { return c.hash(); }
};
