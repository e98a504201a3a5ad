#include "meshsim/backend_config.hpp"

#include "meshsim/digest.hpp"

#include <cstdio>
#include <cstring>
#include <string_view>

namespace meshsim {

namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

uint64_t BackendConfig::fingerprint() const {
  Fnv1a f;
  f.str(backend);
  f.u64(static_cast<uint64_t>(timeout.count()));
  f.u64(options.index());
  if (const auto* g = std::get_if<GlooOptions>(&options)) {
    f.u64(g->devices.size());
    for (const auto& d : g->devices) f.str(d);
    f.u64(static_cast<uint64_t>(g->threads));
  } else if (const auto* n = std::get_if<NcclOptions>(&options)) {
    f.u64(n->high_priority_stream ? 1 : 0);
    f.u64(n->split_color.has_value() ? 1 : 0);
    f.u64(static_cast<uint64_t>(n->split_color.value_or(0)));
    f.u64(n->split_from.has_value() ? 1 : 0);
    f.str(n->split_from.value_or(""));
    f.str(n->config_blob);
  }
  if (!extras.empty()) {  // configs without extras keep the fingerprints they always had
    f.u64(extras.size());
    for (const auto& [k, v] : extras) {
      f.str(k);
      f.u64(v.index());
      if (const auto* b = std::get_if<bool>(&v)) f.u64(*b ? 1 : 0);
      if (const auto* i = std::get_if<int64_t>(&v)) f.u64(static_cast<uint64_t>(*i));
      if (const auto* d = std::get_if<double>(&v)) {
        uint64_t bits = 0;
        static_assert(sizeof bits == sizeof *d);
        std::memcpy(&bits, d, sizeof bits);
        f.u64(bits);
      }
      if (const auto* str = std::get_if<std::string>(&v)) f.str(*str);
    }
  }
  return f.value();
}

std::string BackendConfig::to_string() const {
  const bool plain = timeout.count() == 0 && options.index() == 0 && extras.empty();
  std::string out = backend.empty() ? "default" : backend;
  if (plain) return out;
  out += "(";
  if (timeout.count() != 0) out += "timeout=" + std::to_string(timeout.count()) + "ms,";
  if (options.index() != 0) out += "options=" + hex(fingerprint()) + ",";
  for (const auto& [k, v] : extras) {
    out += k + "=";
    if (const auto* b = std::get_if<bool>(&v)) out += *b ? "true" : "false";
    if (const auto* i = std::get_if<int64_t>(&v)) out += std::to_string(*i);
    if (const auto* d = std::get_if<double>(&v)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", *d);
      out += buf;
    }
    if (const auto* str = std::get_if<std::string>(&v)) out += "'" + *str + "'";
    out += ",";
  }
  out.back() = ')';
  return out;
}

}  // namespace meshsim
