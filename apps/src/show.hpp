// show.hpp — `meshsim show`: a mesh, its per-dim groups and every rank's coordinate, as a
// readable table or JSON.
//
//   meshsim show --mesh dp=2,cp=2,tp=4 --rank-map 8..23 --slice dp,tp --rank 9
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace meshsim::show {

// Step is one transformation, applied in command-line order: kind is "slice", "flatten" or
// "unflatten"; arg is its text ("dp,tp"; a name or empty; "dim:2,2:a,b").
struct Step {
  std::string kind;
  std::string arg;
};

struct Options {
  std::string mesh;      // "dp=2,cp=2,tp=4"
  std::string shape;     // "2,2,4" (with `names`)
  std::string names;     // "dp,cp,tp"
  std::string rank_map;  // "8..23" or "8,9,10,..."
  std::optional<int64_t> world_size;
  std::optional<int64_t> rank;
  std::vector<Step> steps;
  std::string format = "text";
  int64_t max_rows = 256;
};

// program turns the options into a mesh.program request (InvalidArgument on bad text).
std::string program(const Options& o);
// run prints the mesh; throws meshsim::Error on bad options or programs.
void run(const Options& o, std::ostream& out);

}  // namespace meshsim::show
