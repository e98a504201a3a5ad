// torchtitan_fields.hpp — the fields of the config torchtitan 0.3.0 saves, section by section
// (listed from its own dataclasses by scripts/list_torchtitan_fields.py): what a saved config's
// sections may hold, of which kind, and where null is None.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace meshsim::torchtitan::detail {

// check_saved_fields holds every listed section the saved config `doc` has to torchtitan's
// fields: a value of another kind, null where the field is not Optional, a Literal's value outside
// its choices, and (outside training, parallelism, activation_checkpoint and loss, whose keys
// torchtitan_job.cpp checks) a key the section does not have are refused, naming the key
// (InvalidArgument). `where` names the file.
void check_saved_fields(const nlohmann::json& doc, const std::string& where);

// json_kind: how a message names a JSON value's kind ("an integer", "a table", "null", ...).
const char* json_kind(const nlohmann::json& v);

}  // namespace meshsim::torchtitan::detail
