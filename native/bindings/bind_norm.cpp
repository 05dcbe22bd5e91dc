// Bindings of the per-channel affine kernels (opdispatch/norm.h): channel_affine and
// fold_batchnorm.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "opdispatch/norm.h"

namespace py = pybind11;
using namespace opd::py_arrays;

namespace opd::bindings {
namespace {

// 0: nchw, 1: nhwc, 8 / 16: blocked.
int layout_code(const std::string& name) {
  if (name == "std" || name == "nchw") return 0;
  if (name == "nhwc") return 1;
  if (name == "nchw8c") return 8;
  if (name == "nchw16c") return 16;
  throw py::value_error("unknown layout '" + name + "'; known: std, nhwc, nchw8c, nchw16c");
}

std::vector<std::int64_t> shape_of(const py::array& a) {
  return std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim());
}

// (N, C, spatial) of x in `code`'s layout.
void dims_of(const py::array& x, int code, std::int64_t channels, std::int64_t& n,
             std::int64_t& c, std::int64_t& spatial) {
  const char* what = "channel_affine input";
  if (code == 0) {
    if (x.ndim() < 2)
      throw py::value_error(std::string(what) + ": expected rank >= 2 (N, C, ...), received "
                            "shape " + shape_str(x));
    n = x.shape(0);
    c = x.shape(1);
    spatial = 1;
    for (py::ssize_t i = 2; i < x.ndim(); ++i) spatial *= x.shape(i);
  } else if (code == 1) {
    if (x.ndim() != 4)
      throw py::value_error(std::string(what) + ": expected a rank-4 (N, H, W, C) array, "
                            "received shape " + shape_str(x));
    n = x.shape(0);
    c = x.shape(3);
    spatial = x.shape(1) * x.shape(2);
  } else {
    if (channels < 0)
      throw py::value_error(std::string(what) + ": a blocked layout needs the logical channel "
                            "count, received " + std::to_string(channels));
    if (x.ndim() != 5 || x.shape(4) != code || x.shape(1) != blocks(channels, code))
      throw py::value_error(std::string(what) + ": expected physical shape (N, " +
                            std::to_string(blocks(channels, code)) + ", H, W, " +
                            std::to_string(code) + ") for " + std::to_string(channels) +
                            " channels, received " + shape_str(x));
    n = x.shape(0);
    c = channels;
    spatial = x.shape(2) * x.shape(3);
    return;
  }
  if (channels >= 0 && channels != c)
    throw py::value_error(std::string(what) + ": expected " + std::to_string(channels) +
                          " channels, received shape " + shape_str(x));
}

}  // namespace

void bind_norm(py::module_& m) {
  m.def("channel_affine", [](const py::array& x, const std::string& layout,
                             const std::optional<py::array>& scale,
                             const std::optional<py::array>& bias, std::int64_t channels) {
    const int code = layout_code(layout);
    std::int64_t n = 0, c = 0, spatial = 0;
    dims_of(x, code, channels, n, c, spatial);
    auto in = f32(x, "channel_affine input");
    std::optional<FloatArray> sa, ba;
    if (scale) sa = f32_shape(*scale, "channel_affine scale", {c});
    if (bias) ba = f32_shape(*bias, "channel_affine bias", {c});
    auto out = empty(shape_of(in));
    const float* src = in.data();
    const float* ps = sa ? sa->data() : nullptr;
    const float* pb = ba ? ba->data() : nullptr;
    float* dst = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      if (code == 0) channel_affine_nchw(src, dst, ps, pb, n, c, spatial);
      if (code == 1) channel_affine_nhwc(src, dst, ps, pb, n, c, spatial);
      if (code >= 8) channel_affine_blocked(src, dst, ps, pb, n, c, spatial, code);
    }
    return out;
  }, py::arg("x"), py::arg("layout"), py::arg("scale") = py::none(),
     py::arg("bias") = py::none(), py::arg("channels") = -1,
     "x * scale[c] + bias[c] per channel in `layout` (std: any rank >= 2; blocked layouts need "
     "the logical `channels` and get zero padding channels). scale / bias: (C,) or None.");

  m.def("fold_batchnorm", [](const py::array& scale, const py::array& bias,
                             const py::array& mean, const py::array& var, double epsilon) {
    auto s = f32(scale, "fold_batchnorm scale", 1);
    const std::int64_t c = s.shape(0);
    auto b = f32_shape(bias, "fold_batchnorm B", {c});
    auto mu = f32_shape(mean, "fold_batchnorm mean", {c});
    auto v = f32_shape(var, "fold_batchnorm var", {c});
    auto a_out = empty({c});
    auto b_out = empty({c});
    fold_batchnorm(s.data(), b.data(), mu.data(), v.data(), c, epsilon, a_out.mutable_data(),
                   b_out.mutable_data());
    return py::make_tuple(a_out, b_out);
  }, py::arg("scale"), py::arg("bias"), py::arg("mean"), py::arg("var"), py::arg("epsilon"),
     "(a, b) with a = scale / sqrt(var + epsilon), b = bias - mean * a (computed in double).");
}

}  // namespace opd::bindings
