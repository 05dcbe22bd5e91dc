// One bind_* function per family of the oneDNN module; module.cpp calls them all.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "arrays.h"  // native/bindings/arrays.h: float32 array checks shared with the native module

namespace opd::onednn::bindings {

namespace py = pybind11;

void bind_layouts(py::module_& m);
void bind_conv(py::module_& m);
void bind_matmul(py::module_& m);
void bind_pool(py::module_& m);
void bind_eltwise(py::module_& m);
void bind_norm(py::module_& m);

// `a` as a float32 C-contiguous array of exactly `shape` (ValueError naming `what`).
inline py_arrays::FloatArray exact(const py::array& a, const char* what,
                                   const std::vector<std::int64_t>& shape) {
  return py_arrays::f32_shape(a, what, shape);
}

// `a` as a float32 C-contiguous array of `count` elements, any shape (weights whose logical
// and physical shapes differ; `shape` is named in the error).
inline py_arrays::FloatArray sized(const py::array& a, const char* what,
                                   const std::vector<std::int64_t>& shape) {
  auto out = py_arrays::f32(a, what);
  std::int64_t count = 1;
  for (auto d : shape) count *= d;
  if (out.size() != count)
    throw py::value_error(std::string(what) + ": expected " + std::to_string(count) +
                          " elements (physical shape " + py_arrays::shape_str(shape) +
                          "), received shape " + py_arrays::shape_str(a));
  return out;
}

// A float32 array of `shape`, or None for a None argument.
inline const float* optional_data(const py::object& o, const char* what,
                                  const std::vector<std::int64_t>& shape,
                                  std::vector<py_arrays::FloatArray>& keep) {
  if (o.is_none()) return nullptr;
  keep.push_back(exact(o.cast<py::array>(), what, shape));
  return keep.back().data();
}

}  // namespace opd::onednn::bindings
