// Array checks shared by the bindings: dtype, contiguity and shape are validated here, before
// any kernel runs, and a bad argument raises ValueError naming what was received and expected.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace opd::py_arrays {

namespace py = pybind11;
using FloatArray = py::array_t<float, py::array::c_style>;

inline std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

inline std::string shape_str(const std::vector<std::int64_t>& v) {
  std::string s = "(";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

// The array as float32 C-contiguous, or ValueError. `ndim` < 0 accepts any rank.
inline FloatArray f32(const py::array& a, const char* what, int ndim = -1) {
  // equal, not identical: a dtype is not always numpy's singleton (an unpickled array's is a
  // copy), and identity refused such float32 arrays as "expected float32, received float32"
  if (!a.dtype().equal(py::dtype::of<float>()))
    throw py::value_error(std::string(what) + ": expected a float32 array, received dtype " +
                          std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(std::string(what) +
                          ": expected a C-contiguous array, received a non-contiguous one "
                          "(use numpy.ascontiguousarray)");
  if (ndim >= 0 && a.ndim() != ndim)
    throw py::value_error(std::string(what) + ": expected a rank-" + std::to_string(ndim) +
                          " array, received shape " + shape_str(a));
  return FloatArray(a);
}

// Like f32, and the shape must equal `expected`.
inline FloatArray f32_shape(const py::array& a, const char* what,
                            const std::vector<std::int64_t>& expected) {
  FloatArray out = f32(a, what, static_cast<int>(expected.size()));
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (out.shape(static_cast<py::ssize_t>(i)) != expected[i])
      throw py::value_error(std::string(what) + ": expected shape " + shape_str(expected) +
                            ", received " + shape_str(a));
  return out;
}

inline FloatArray empty(const std::vector<std::int64_t>& shape) {
  std::vector<py::ssize_t> s(shape.begin(), shape.end());
  return FloatArray(s);
}

inline std::int64_t blocks(std::int64_t c, std::int64_t block) { return (c + block - 1) / block; }

}  // namespace opd::py_arrays
