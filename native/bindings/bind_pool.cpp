// Bindings of the pooling kernels (opdispatch/pool.h): pool2d and global_pool, in the layouts
// "std" (nchw), "nhwc", "nchw8c" and "nchw16c".
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "opdispatch/pool.h"

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

PoolKind kind_of(const std::string& name) {
  if (name == "max") return PoolKind::max;
  if (name == "avg") return PoolKind::avg;
  throw py::value_error("unknown pooling kind '" + name + "'; known: max, avg");
}

void expect_len(const std::vector<std::int64_t>& v, std::size_t n, const char* what) {
  if (v.size() != n)
    throw py::value_error(std::string("pool2d: ") + what + " needs " + std::to_string(n) +
                          " values, received " + shape_str(v));
}

// Logical (N, C, H, W) of a rank-4 activation (or its blocked rank-5 form) in `code`'s layout;
// `channels` is the logical C (required for blocked layouts, -1 elsewhere or a check).
std::vector<std::int64_t> logical_nchw(const py::array& x, int code, std::int64_t channels,
                                       const char* what) {
  const int rank = code >= 8 ? 5 : 4;
  if (x.ndim() != rank)
    throw py::value_error(std::string(what) + ": expected a rank-" + std::to_string(rank) +
                          " array for this layout, received shape " + shape_str(x));
  std::vector<std::int64_t> s;
  if (code == 0) s = {x.shape(0), x.shape(1), x.shape(2), x.shape(3)};
  if (code == 1) s = {x.shape(0), x.shape(3), x.shape(1), x.shape(2)};
  if (code >= 8) {
    if (channels < 0)
      throw py::value_error(std::string(what) +
                            ": a blocked layout needs the logical channel count, received " +
                            std::to_string(channels));
    if (x.shape(4) != code || x.shape(1) != blocks(channels, code))
      throw py::value_error(std::string(what) + ": expected physical shape (N, " +
                            std::to_string(blocks(channels, code)) + ", H, W, " +
                            std::to_string(code) + ") for " + std::to_string(channels) +
                            " channels, received " + shape_str(x));
    return {x.shape(0), channels, x.shape(2), x.shape(3)};
  }
  if (channels >= 0 && channels != s[1])
    throw py::value_error(std::string(what) + ": expected " + std::to_string(channels) +
                          " channels, received shape " + shape_str(x));
  return s;
}

// Physical shape of a logical (N, C, H, W) tensor in `code`'s layout.
std::vector<std::int64_t> physical(const std::vector<std::int64_t>& s, int code) {
  if (code == 0) return s;
  if (code == 1) return {s[0], s[2], s[3], s[1]};
  return {s[0], blocks(s[1], code), s[2], s[3], code};
}

}  // namespace

void bind_pool(py::module_& m) {
  m.def("pool2d", [](const py::array& x, const std::string& layout, const std::string& kind,
                     const std::vector<std::int64_t>& kernel,
                     const std::vector<std::int64_t>& strides,
                     const std::vector<std::int64_t>& dilations,
                     const std::vector<std::int64_t>& pads, bool ceil_mode,
                     bool count_include_pad, std::int64_t channels) {
    const int code = layout_code(layout);
    Pool2dParams p;
    p.kind = kind_of(kind);
    expect_len(kernel, 2, "kernel");
    expect_len(strides, 2, "strides");
    expect_len(dilations, 2, "dilations");
    expect_len(pads, 4, "pads (top, left, bottom, right)");
    for (int i = 0; i < 2; ++i) {
      p.kernel[i] = kernel[i];
      p.stride[i] = strides[i];
      p.dilation[i] = dilations[i];
      p.pad_begin[i] = pads[i];
      p.pad_end[i] = pads[i + 2];
    }
    p.ceil_mode = ceil_mode;
    p.count_include_pad = count_include_pad;
    const auto s = logical_nchw(x, code, channels, "pool2d input");
    auto in = f32(x, "pool2d input");
    const std::int64_t oh = pool_output_size(p, 0, s[2]), ow = pool_output_size(p, 1, s[3]);
    auto out = empty(physical({s[0], s[1], oh, ow}, code));
    const float* src = in.data();
    float* dst = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      if (code == 0) pool2d_nchw(src, dst, s[0], s[1], s[2], s[3], p);
      if (code == 1) pool2d_nhwc(src, dst, s[0], s[1], s[2], s[3], p);
      if (code >= 8) pool2d_blocked(src, dst, s[0], s[1], s[2], s[3], p, code);
    }
    return out;
  }, py::arg("x"), py::arg("layout"), py::arg("kind"), py::arg("kernel"), py::arg("strides"),
     py::arg("dilations"), py::arg("pads"), py::arg("ceil_mode") = false,
     py::arg("count_include_pad") = false, py::arg("channels") = -1,
     "2-D max ('max') or average ('avg') pooling of a rank-4 activation in `layout` (std, nhwc, "
     "nchw8c, nchw16c; blocked layouts need the logical `channels`). pads = (top, left, bottom, "
     "right), explicit (resolve auto_pad first).");

  m.def("global_pool", [](const py::array& x, const std::string& layout, const std::string& kind,
                          std::int64_t channels) {
    const int code = layout_code(layout);
    const PoolKind k = kind_of(kind);
    std::vector<std::int64_t> out_shape;
    std::int64_t n = 0, c = 0, spatial = 1;
    if (code == 0) {  // any rank >= 3: (N, C, spatial...)
      if (x.ndim() < 3)
        throw py::value_error("global_pool input: expected rank >= 3 (N, C, spatial...), "
                              "received shape " + shape_str(x));
      n = x.shape(0);
      c = x.shape(1);
      if (channels >= 0 && channels != c)
        throw py::value_error("global_pool input: expected " + std::to_string(channels) +
                              " channels, received shape " + shape_str(x));
      out_shape = {n, c};
      for (py::ssize_t i = 2; i < x.ndim(); ++i) {
        spatial *= x.shape(i);
        out_shape.push_back(1);
      }
    } else {
      const auto s = logical_nchw(x, code, channels, "global_pool input");
      n = s[0];
      c = s[1];
      spatial = s[2] * s[3];
      out_shape = physical({n, c, 1, 1}, code);
    }
    auto in = f32(x, "global_pool input");
    if (spatial < 1)
      throw py::value_error("global_pool input: expected a non-empty spatial extent, received "
                            "shape " + shape_str(x));
    auto out = empty(out_shape);
    const float* src = in.data();
    float* dst = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      if (code == 0) global_pool_nchw(k, src, dst, n, c, spatial);
      if (code == 1) global_pool_nhwc(k, src, dst, n, c, spatial);
      if (code >= 8) global_pool_blocked(k, src, dst, n, c, spatial, code);
    }
    return out;
  }, py::arg("x"), py::arg("layout"), py::arg("kind"), py::arg("channels") = -1,
     "GlobalMaxPool ('max') / GlobalAveragePool ('avg') in `layout`; the output keeps the "
     "layout with every spatial extent 1 (std accepts any rank >= 3).");
}

}  // namespace opd::bindings
