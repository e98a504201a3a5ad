// python/src/bind_layout.cpp — the layout algebra for Python (meshsim.Layout): each op the C++
// function itself; a layout is (shape, stride), each an int or nested lists of ints, and answers
// come back the same way.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "meshsim/layout.hpp"
#include "meshsim/mesh_layout.hpp"
#include "meshsim/query.hpp"
#include "module_parts.hpp"

namespace py = pybind11;

namespace meshsim_py {

namespace {

// build_tuple reads a Python int or a nested list/tuple of ints into `b`, bounded as the text and
// JSON readers are (kMaxDepth, kMaxNodes); None reads as 0 where `none_is_zero` (a coordinate's
// unknown mode, as the query reads null).
void build_tuple(const py::handle& o, const std::string& field, meshsim::IntTupleBuilder& b, int depth, int& nodes,
                 bool none_is_zero) {
  if (++nodes > meshsim::kMaxNodes) {
    throw meshsim::InvalidArgument("'" + field + "' has more than " + std::to_string(meshsim::kMaxNodes) + " nodes");
  }
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    if (depth >= meshsim::kMaxDepth) {
      throw meshsim::InvalidArgument("'" + field + "' is nested deeper than " + std::to_string(meshsim::kMaxDepth));
    }
    if (py::len(o) == 0) throw meshsim::InvalidArgument("'" + field + "': the empty tuple [] is not an IntTuple");
    b.open();
    for (const py::handle e : o) build_tuple(e, field, b, depth + 1, nodes, none_is_zero);
    b.close();
    return;
  }
  if (none_is_zero && o.is_none()) {
    b.leaf(0);
    return;
  }
  b.leaf(int64_of(o, field.c_str()));
}

meshsim::IntTuple tuple_of(const py::handle& o, const std::string& field, bool none_is_zero = false) {
  meshsim::IntTupleBuilder b;
  int nodes = 0;
  build_tuple(o, field, b, 0, nodes, none_is_zero);
  return b.take();
}

// py_of is an IntTuple as Python sees a layout's shape and stride: an int, or nested lists.
py::object py_of(const meshsim::IntTuple& t) {
  if (t.is_int()) return py::int_(t.value());
  py::list out;
  for (int i = 0; i < t.rank(); ++i) out.append(py_of(t[i]));
  return out;
}

meshsim::Layout layout_of(const py::handle& shape, const py::handle& stride) {
  meshsim::IntTuple s = tuple_of(shape, "shape");  // the shape's errors first, as the text reader's
  return meshsim::Layout(std::move(s), tuple_of(stride, "stride"));
}

py::tuple py_of(const meshsim::Layout& l) { return py::make_tuple(py_of(l.shape()), py_of(l.stride())); }

meshsim::Convention convention_of(const std::string& name) { return meshsim::parse_convention(name); }

}  // namespace

void bind_layout(py::module_& m) {
  // The layout algebra (meshsim.Layout), each op the C++ function itself: a layout is (shape,
  // stride), each an int or nested lists of ints; answers come back the same way.
  using meshsim::Layout;
  using LayoutArgs = std::pair<py::object, py::object>;
  auto L = [](const LayoutArgs& a) { return layout_of(a.first, a.second); };
  m.def("parse_layout", [](const std::string& text) { return py_of(meshsim::parse_layout(text)); });
  m.def("layout_size", [L](const LayoutArgs& a, const std::string& c) {
    convention_of(c);  // size has no convention, but a bad name is refused as everywhere
    return meshsim::size(L(a));
  });
  m.def("layout_cosize", [L](const LayoutArgs& a, const std::string& c) {
    convention_of(c);
    return meshsim::cosize(L(a));
  });
  m.def("mesh_check_orthogonal", [L](const LayoutArgs& a) { return meshsim::mesh_check_orthogonal(L(a)); });
  m.def("mesh_check_non_overlap", [L](const LayoutArgs& a) { return meshsim::mesh_check_non_overlap(L(a)); });
  m.def("coalesce", [L](const LayoutArgs& a, const std::string& c) { return py_of(meshsim::coalesce(L(a), convention_of(c))); });
  m.def("filter", [L](const LayoutArgs& a, const std::string& c) { return py_of(meshsim::filter(L(a), convention_of(c))); });
  m.def("complement", [L](const LayoutArgs& a, const py::object& bound, const std::string& c) {
    const int64_t b = bound.is_none() ? 1 : int64_of(bound, "bound");
    return py_of(meshsim::complement(L(a), b, convention_of(c)));
  });
  m.def("composition", [L](const LayoutArgs& a, const LayoutArgs& b, const std::string& c) {
    return py_of(meshsim::composition(L(a), L(b), convention_of(c)));
  });
  m.def("logical_divide", [L](const LayoutArgs& a, const LayoutArgs& b, const std::string& c) {
    return py_of(meshsim::logical_divide(L(a), L(b), convention_of(c)));
  });
  m.def("logical_product", [L](const LayoutArgs& a, const LayoutArgs& b, const std::string& c) {
    return py_of(meshsim::logical_product(L(a), L(b), convention_of(c)));
  });
  m.def("right_inverse", [L](const LayoutArgs& a, const std::string& c) { return py_of(meshsim::right_inverse(L(a), convention_of(c))); });
  m.def("left_inverse", [L](const LayoutArgs& a, const std::string& c) { return py_of(meshsim::left_inverse(L(a), convention_of(c))); });
  m.def("crd2idx", [L](const LayoutArgs& a, const py::sequence& coords, const std::string& c) {
    const Layout l = L(a);
    const meshsim::Convention conv = convention_of(c);
    std::vector<int64_t> out;
    out.reserve(py::len(coords));
    for (const py::handle coord : coords) out.push_back(meshsim::crd2idx(tuple_of(coord, "coords", true), l, conv));
    return out;
  });
  m.def("idx2crd", [](const LayoutArgs& a, const py::sequence& indices, const std::string& c) {
    const meshsim::IntTuple shape = tuple_of(a.first, "shape");
    const meshsim::Convention conv = convention_of(c);
    const meshsim::IntTuple stride = a.second.is_none() ? meshsim::compact_stride(shape, conv) : tuple_of(a.second, "stride");
    // The answer's element budget, as the query charges it: indices x (modes + 1).
    const auto n = static_cast<int64_t>(py::len(indices));
    const int64_t per = shape.leaf_count() + 1;
    if (n > meshsim::query::kDefaultMaxAnswerElements / per) {
      throw meshsim::ResourceExhausted("idx2crd of " + std::to_string(n) + " indices over " + std::to_string(per - 1) +
                                       " modes would hold " + std::to_string(n) + " x " + std::to_string(per) +
                                       " elements, over the answer's budget of " +
                                       std::to_string(meshsim::query::kDefaultMaxAnswerElements));
    }
    py::list out;
    for (const py::handle i : indices) out.append(py_of(meshsim::idx2crd(tuple_of(i, "indices", true), shape, stride)));
    return out;
  });
}

}  // namespace meshsim_py
