// show.hpp — `meshsim show`: a mesh, its per-dim groups and every rank's coordinate, as a
// readable table or JSON.
//
//   meshsim show --mesh dp=2,cp=2,tp=4 --rank-map 8..23 --slice dp,tp --rank 9
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/placement.hpp"
#include "meshsim/recipe.hpp"

namespace meshsim::show {

// Options are the recipe flags plus how to print.
struct Options {
  RecipeFlags recipe;
  std::string format = "text";
  int64_t max_rows = 256;  // rows per table (text); must be in [0, 2^31)
  placement::Flags placement;  // --gpus-per-host, --nvlink-domain, --require
  std::string svg_file;                  // --svg FILE: draw the result mesh (meshsim/svg.hpp)
  std::optional<std::string> color_dim;  // --color-dim: whose groups are the colours
  // --creation-plan: print the process-group calls PyTorch's DeviceMesh makes for the recipe
  // (creation_plan.hpp) instead of the mesh; the world's setup that decides them, each
  // overriding the recipe's when given.
  bool creation_plan = false;
  std::optional<bool> bound_device;               // --bound-device
  std::optional<bool> new_group_use_split_group;  // --new-group-use-split-group
  std::optional<bool> use_torchcomms;             // --use-torchcomms
  std::optional<std::string> default_backend;     // --default-backend
  std::optional<std::string> device_type;         // --device-type
  // --torch-version: the PyTorch release answered as (torch_version.hpp; default the newest).
  std::optional<std::string> torch_version;
  // --process-groups JSON or @FILE: the user's own new_group / split_group calls beside the
  // mesh's (recipe.hpp, process_groups_from_json); with --creation-plan only.
  std::string process_groups;
  // --max-elements: the element budget of the JSON answer (as meshsim query's), [1, 2^40].
  int64_t max_elements = 1 << 21;
};

// run prints the mesh (and, with --gpus-per-host, where its groups land); returns 0, or 1 when a
// --require is broken (each broken one printed as "FAILED placement: ...") or, with
// --creation-plan, when ranks disagree on a group's name ("FAILED group names: ..."). Throws meshsim::Error
// on bad options or recipes.
int run(const Options& o, std::ostream& out);

}  // namespace meshsim::show
