// meshsim/svg.hpp — a picture of a mesh (`meshsim show --svg FILE`): each rank a cell labelled
// with its global rank, the groups of one dim as colours, host boundaries as thick lines.
//
//   1-D: one row; 2-D: dim 0 rows, dim 1 columns; 3-D: one panel per index of dim 0, dims 1
//   and 2 as rows and columns; more dims: as 3-D with the columns running over dims 2.. flattened
//   (the last fastest), each column labelled with its coordinates, so every rank is drawn.
//   At most 64 rows, 64 columns and 16 panels are drawn; the caption says what was left out.
//
//   std::string text = svg::draw(mesh, {.color_dim = "tp", .hosts = hosts, .rank = 0});
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "meshsim/device_mesh.hpp"
#include "meshsim/placement.hpp"

namespace meshsim::svg {

inline constexpr int64_t kMaxRows = 64, kMaxCols = 64, kMaxPanels = 16;

struct Options {
  std::optional<std::string> color_dim;     // default: the last dim
  std::optional<placement::Hosts> hosts;    // draws host boundaries
  int64_t rank = 0;                         // whose copy is drawn (a mesh with several copies)
};

// draw returns a standalone SVG document. InvalidArgument when color_dim is not a dim of `m`,
// or when `rank` is in no copy of a mesh with several.
std::string draw(const DeviceMesh& m, const Options& o);

}  // namespace meshsim::svg
