#include "meshsim/torch_version.hpp"

#include <array>

#include "meshsim/error.hpp"

namespace meshsim {

namespace {

struct Known {
  TorchVersion version;
  std::string_view name;
  std::string_view release;
};

constexpr std::array<Known, 2> kKnown{{{TorchVersion::k2_13, "2.13", "2.13.0"}, {TorchVersion::k2_14, "2.14", "2.14.1"}}};

}  // namespace

TorchVersion parse_torch_version(std::string_view text) {
  std::string_view v = text.substr(0, text.find('+'));
  for (const Known& k : kKnown) {
    if (v == k.name || v == k.release) return k.version;
  }
  throw InvalidArgument("torch version " + quote_input(text) + " is not modelled: meshsim answers as " +
                        modelled_torch_versions() + " (the default is " + std::string(torch_version_name(kNewestTorch)) +
                        ")");
}

std::string_view torch_version_name(TorchVersion v) {
  for (const Known& k : kKnown) {
    if (k.version == v) return k.name;
  }
  return "?";
}

std::string_view torch_release_read(TorchVersion v) {
  for (const Known& k : kKnown) {
    if (k.version == v) return k.release;
  }
  return "?";
}

std::string modelled_torch_versions() {
  std::string out;
  for (const Known& k : kKnown) {
    if (!out.empty()) out += ", ";
    out += std::string(k.name) + " (read from " + std::string(k.release) + ")";
  }
  return out;
}

}  // namespace meshsim
