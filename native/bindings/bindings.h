// One bind_* function per kernel family; module.cpp calls them all.
#pragma once

#include <pybind11/pybind11.h>

namespace opd::bindings {

void bind_layouts(pybind11::module_& m);
void bind_elementwise(pybind11::module_& m);
// conv bindings
void bind_conv(pybind11::module_& m);
// pool bindings
void bind_pool(pybind11::module_& m);
// norm bindings
void bind_norm(pybind11::module_& m);
void bind_concat(pybind11::module_& m);
// gemm bindings
void bind_gemm(pybind11::module_& m);

}  // namespace opd::bindings
