// Bindings of the activation layout converters.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "arrays.h"
#include "bindings.h"
#include "opdispatch/layouts.h"

namespace py = pybind11;
using namespace opd::py_arrays;

namespace opd::bindings {
namespace {

std::vector<std::int64_t> nchw_of(const py::array& a, const char* what) {
  if (a.ndim() != 4)
    throw py::value_error(std::string(what) + ": expected a rank-4 array, received shape " +
                          shape_str(a));
  return {a.shape(0), a.shape(1), a.shape(2), a.shape(3)};
}

void check_block(int block) {
  if (block != 8 && block != 16)
    throw py::value_error("block must be 8 or 16, received " + std::to_string(block));
}

void check_logical(const std::vector<std::int64_t>& s) {
  if (s.size() != 4)
    throw py::value_error("logical shape must be (N, C, H, W), received " + shape_str(s));
  for (auto d : s)
    if (d < 0) throw py::value_error("logical shape has a negative dimension: " + shape_str(s));
}

}  // namespace

void bind_layouts(py::module_& m) {
  m.def("nchw_to_nhwc", [](const py::array& x) {
    auto s = nchw_of(x, "nchw_to_nhwc input");
    auto in = f32(x, "nchw_to_nhwc input", 4);
    auto out = empty({s[0], s[2], s[3], s[1]});
    const float* src = in.data();
    float* dst = out.mutable_data();
    { py::gil_scoped_release nogil; nchw_to_nhwc(src, dst, s[0], s[1], s[2], s[3]); }
    return out;
  }, py::arg("x"), "(N, C, H, W) -> (N, H, W, C)");

  m.def("nhwc_to_nchw", [](const py::array& x) {
    auto p = nchw_of(x, "nhwc_to_nchw input");  // physical (N, H, W, C)
    auto in = f32(x, "nhwc_to_nchw input", 4);
    auto out = empty({p[0], p[3], p[1], p[2]});
    const float* src = in.data();
    float* dst = out.mutable_data();
    { py::gil_scoped_release nogil; nhwc_to_nchw(src, dst, p[0], p[3], p[1], p[2]); }
    return out;
  }, py::arg("x"), "(N, H, W, C) -> (N, C, H, W)");

  m.def("nchw_to_blocked", [](const py::array& x, int block) {
    check_block(block);
    auto s = nchw_of(x, "nchw_to_blocked input");
    auto in = f32(x, "nchw_to_blocked input", 4);
    auto out = empty({s[0], blocks(s[1], block), s[2], s[3], block});
    const float* src = in.data();
    float* dst = out.mutable_data();
    { py::gil_scoped_release nogil; nchw_to_blocked(src, dst, s[0], s[1], s[2], s[3], block); }
    return out;
  }, py::arg("x"), py::arg("block"),
     "(N, C, H, W) -> (N, ceil(C/block), H, W, block), zero-padded");

  m.def("blocked_to_nchw", [](const py::array& x, const std::vector<std::int64_t>& shape,
                              int block) {
    check_block(block);
    check_logical(shape);
    auto in = f32_shape(x, "blocked_to_nchw input",
                        {shape[0], blocks(shape[1], block), shape[2], shape[3], block});
    auto out = empty(shape);
    const float* src = in.data();
    float* dst = out.mutable_data();
    { py::gil_scoped_release nogil; blocked_to_nchw(src, dst, shape[0], shape[1], shape[2], shape[3], block); }
    return out;
  }, py::arg("x"), py::arg("shape"), py::arg("block"),
     "(N, ceil(C/block), H, W, block) -> (N, C, H, W) for the logical shape given");

  m.def("nhwc_to_blocked", [](const py::array& x, int block) {
    check_block(block);
    auto p = nchw_of(x, "nhwc_to_blocked input");  // (N, H, W, C)
    auto in = f32(x, "nhwc_to_blocked input", 4);
    auto out = empty({p[0], blocks(p[3], block), p[1], p[2], block});
    const float* src = in.data();
    float* dst = out.mutable_data();
    { py::gil_scoped_release nogil; nhwc_to_blocked(src, dst, p[0], p[3], p[1], p[2], block); }
    return out;
  }, py::arg("x"), py::arg("block"), "(N, H, W, C) -> (N, ceil(C/block), H, W, block)");

  m.def("blocked_to_nhwc", [](const py::array& x, const std::vector<std::int64_t>& shape,
                              int block) {
    check_block(block);
    check_logical(shape);
    auto in = f32_shape(x, "blocked_to_nhwc input",
                        {shape[0], blocks(shape[1], block), shape[2], shape[3], block});
    auto out = empty({shape[0], shape[2], shape[3], shape[1]});
    const float* src = in.data();
    float* dst = out.mutable_data();
    { py::gil_scoped_release nogil; blocked_to_nhwc(src, dst, shape[0], shape[1], shape[2], shape[3], block); }
    return out;
  }, py::arg("x"), py::arg("shape"), py::arg("block"),
     "(N, ceil(C/block), H, W, block) -> (N, H, W, C) for the logical (N, C, H, W) given");

  m.def("zero_block_tail", [](py::array& x, const std::vector<std::int64_t>& shape, int block) {
    check_block(block);
    check_logical(shape);
    auto a = f32_shape(x, "zero_block_tail input",
                       {shape[0], blocks(shape[1], block), shape[2], shape[3], block});
    float* d = a.mutable_data();
    { py::gil_scoped_release nogil; zero_block_tail(d, shape[0], shape[1], shape[2], shape[3], block); }
  }, py::arg("x"), py::arg("shape"), py::arg("block"),
     "Zero, in place, the padding channels of the last block.");

  m.def("copy", [](const py::array& x) {
    auto in = f32(x, "copy input");
    std::vector<std::int64_t> shape(in.shape(), in.shape() + in.ndim());
    auto out = empty(shape);
    const float* src = in.data();
    float* dst = out.mutable_data();
    const std::int64_t n = in.size();
    { py::gil_scoped_release nogil; copy_floats(src, dst, n); }
    return out;
  }, py::arg("x"), "A parallel copy (the bandwidth baseline of the converters).");
}

}  // namespace opd::bindings
