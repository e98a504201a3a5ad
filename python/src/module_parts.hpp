// python/src/module_parts.hpp — what the binding's files share: the Python int reader and each
// part's bind function beyond module.cpp (one file per part of the library).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace meshsim_py {

// int64_of reads a Python int as int64: OverflowError naming it beyond int64, ArgumentTypeError
// (meshsim.errors; also a TypeError) for anything but an int.
int64_t int64_of(const pybind11::handle& o, const char* what);

// bind_layout: the layout algebra, typed (bind_layout.cpp).
void bind_layout(pybind11::module_& m);

}  // namespace meshsim_py
