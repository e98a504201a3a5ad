#include "meshsim/backend_config.hpp"

#include "meshsim/digest.hpp"

#include <cstdio>
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
  return f.value();
}

std::string BackendConfig::to_string() const {
  const bool plain = timeout.count() == 0 && options.index() == 0;
  std::string out = backend.empty() ? "default" : backend;
  if (plain) return out;
  out += "(";
  if (timeout.count() != 0) out += "timeout=" + std::to_string(timeout.count()) + "ms,";
  if (options.index() != 0) out += "options=" + hex(fingerprint()) + ",";
  out.back() = ')';
  return out;
}

}  // namespace meshsim
