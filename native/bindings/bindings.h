// One bind_* function per kernel family; module.cpp calls them all.
#pragma once

#include <pybind11/pybind11.h>

namespace opd::bindings {

void bind_layouts(pybind11::module_& m);
void bind_elementwise(pybind11::module_& m);
// conv bindings
// pool bindings
// norm bindings
// gemm bindings

}  // namespace opd::bindings
