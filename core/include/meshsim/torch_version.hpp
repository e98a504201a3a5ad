// meshsim/torch_version.hpp — which PyTorch release meshsim answers as.
//
//   TorchVersion v = parse_torch_version("2.14");   // also "2.14.1", "2.14.1+cu130"
//   torch_version_name(v) == "2.14"
//
// Where PyTorch's releases differ in what a DeviceMesh user can see (docs/device-mesh.md, the
// "by version" column), meshsim answers as the release a mesh's root names (RootOptions,
// `torch_version` in the JSON protocol and in Python, `--torch-version` in the tool). Each
// modelled minor version was read from one release's wheel: 2.13 from 2.13.0, 2.14 from 2.14.1.
// The differences modelled:
//   - group names (creation_plan.hpp, group_names.hpp): 2.13 advances the process-group counter
//     only for sequential names and salts a hashed name with the rank's own count of registered
//     groups; 2.14 advances the counter on every name and salts hashed names with it;
//   - a rank outside a split_group or a use_local_synchronization new_group gets None on 2.13,
//     GroupMember.NON_GROUP_MEMBER (-100) on 2.14;
//   - new_group refuses non-integer ranks on 2.14 ("ranks must be a sequence of integers");
//   - concatenate's refusal reads "different device meshs" on 2.13, "... meshes" on 2.14.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <string>
#include <string_view>

namespace meshsim {

enum class TorchVersion { k2_13, k2_14 };

// kNewestTorch is the default: the newest release meshsim models.
inline constexpr TorchVersion kNewestTorch = TorchVersion::k2_14;

// parse_torch_version reads "2.13" or "2.14", with or without a patch level of the release read
// ("2.13.0", "2.14.1") and a local suffix ("+cpu", "+cu130", as torch.__version__ prints it).
// Anything else is InvalidArgument naming the text and the versions modelled.
TorchVersion parse_torch_version(std::string_view text);

// torch_version_name: "2.13", "2.14". torch_release_read: the release each was read from.
std::string_view torch_version_name(TorchVersion v);
std::string_view torch_release_read(TorchVersion v);

// modelled_torch_versions lists the versions for a message: "2.13 (read from 2.13.0), 2.14 (...)".
std::string modelled_torch_versions();

}  // namespace meshsim
