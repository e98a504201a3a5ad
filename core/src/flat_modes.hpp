// meshsim/detail/flat_modes.hpp — the flat views of a Layout that the algebra, the
// _MeshLayout helpers and DeviceMesh walk: its leaves in preorder, and joining layouts as the
// top-level modes of one layout.
#pragma once

#include <cstdint>
#include <span>

#include <boost/container/small_vector.hpp>

#include "meshsim/layout.hpp"

namespace meshsim::detail {

// Leaf is one (size, stride) pair of a layout.
struct Leaf {
  int64_t s;
  int64_t d;
};
using Leaves = boost::container::small_vector<Leaf, 16>;

// leaves lists L's leaves left to right (preorder).
Leaves leaves(const Layout& l);

// join_unchecked makes `modes` the top-level modes of one layout without validating it (for
// callers whose modes are valid by construction; make_layout validates).
Layout join_unchecked(std::span<const Layout> modes);

}  // namespace meshsim::detail
