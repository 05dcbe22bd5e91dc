// Bindings of the blocked-layout convolutions and their weight packing (opdispatch/conv.h).
//
// Geometry is passed as `params` = [C, M, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR, group]
// (logical channel counts, explicit pads); N, H, W come from the input's physical shape.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "opdispatch/conv.h"

namespace py = pybind11;
using namespace opd::py_arrays;

namespace opd::bindings {
namespace {

using i64 = std::int64_t;
constexpr float kInf = std::numeric_limits<float>::infinity();

void check_block(int block) {
  if (block != 8 && block != 16)
    throw py::value_error("block must be 8 or 16, received " + std::to_string(block));
}

// The geometry from `params` and the input's physical shape; validated in C++.
Conv2dShape geometry(const std::vector<i64>& p, i64 n, i64 h, i64 w) {
  if (p.size() != 13)
    throw py::value_error("conv params must be [C, M, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR, "
                          "group] (13 ints), received " + std::to_string(p.size()) + " values");
  Conv2dShape s;
  s.n = n;
  s.h = h;
  s.w = w;
  s.c = p[0];
  s.m = p[1];
  s.kh = p[2];
  s.kw = p[3];
  s.sh = p[4];
  s.sw = p[5];
  s.dh = p[6];
  s.dw = p[7];
  s.pt = p[8];
  s.pl = p[9];
  s.pb = p[10];
  s.pr = p[11];
  s.group = p[12];
  validate_conv(s);
  return s;
}

// The blocked input (N, ceil(C/B), H, W, B) and its geometry.
FloatArray blocked_input(const py::array& x, const std::vector<i64>& params, int block,
                         Conv2dShape& s) {
  check_block(block);
  auto in = f32(x, "conv input X (blocked)", 5);
  s = geometry(params, in.shape(0), in.shape(2), in.shape(3));
  const std::vector<i64> want{s.n, blocks(s.c, block), s.h, s.w, block};
  return f32_shape(x, "conv input X (blocked)", want);
}

std::vector<i64> output_shape(const Conv2dShape& s, int block) {
  return {s.n, blocks(s.m, block), s.oh(), s.ow(), block};
}

// Bias, residual and clamp of the fused epilogue; `keep` owns the validated arrays.
ConvEpilogue epilogue(const Conv2dShape& s, int block, const py::object& bias,
                      const py::object& residual, float lo, float hi,
                      std::vector<FloatArray>& keep) {
  ConvEpilogue ep;
  if (!bias.is_none()) {
    keep.push_back(f32_shape(bias.cast<py::array>(), "conv bias B", {s.m}));
    ep.bias = keep.back().data();
  }
  if (!residual.is_none()) {
    keep.push_back(f32_shape(residual.cast<py::array>(), "conv residual (fused Add input)",
                             output_shape(s, block)));
    ep.residual = keep.back().data();
  }
  if (std::isnan(lo) || std::isnan(hi) || lo > hi)
    throw py::value_error("conv clamp bounds must satisfy lo <= hi, received lo=" +
                          std::to_string(lo) + " hi=" + std::to_string(hi));
  ep.lo = lo;
  ep.hi = hi;
  return ep;
}

std::vector<i64> shape_of(const py::array& a) {
  return std::vector<i64>(a.shape(), a.shape() + a.ndim());
}

std::vector<i64> logical_weight_shape(const std::vector<i64>& shape) {
  if (shape.size() != 4)
    throw py::value_error("conv weight shape must be (M, C/group, KH, KW), received " +
                          shape_str(shape));
  for (auto d : shape)
    if (d < 1) throw py::value_error("conv weight shape has a dimension < 1: " + shape_str(shape));
  return shape;
}

}  // namespace

void bind_conv(py::module_& m) {
  m.def("conv2d_blocked", [](const py::array& x, const py::array& w, const py::object& bias,
                             const py::object& residual, const std::vector<i64>& params,
                             int block, float lo, float hi, const py::object& ib_start) {
    Conv2dShape s;
    auto xin = blocked_input(x, params, block, s);
    std::vector<FloatArray> keep;
    ConvEpilogue ep = epilogue(s, block, bias, residual, lo, hi, keep);
    const i64 ob = blocks(s.m, block);
    FloatArray win;
    py::array_t<i64, py::array::c_style> starts;
    i64 nib;
    if (ib_start.is_none()) {
      nib = blocks(s.c / s.group, block);
      win = f32_shape(w, "conv weight (OIhw{B}i{B}o)", {ob, nib, s.kh, s.kw, block, block});
    } else {
      auto st = ib_start.cast<py::array>();
      if (!st.dtype().equal(py::dtype::of<i64>()) || st.ndim() != 1 || st.shape(0) != ob ||
          !(st.flags() & py::array::c_style))
        throw py::value_error("conv ib_start: expected a contiguous int64 array of shape (" +
                              std::to_string(ob) + ",), received dtype " +
                              std::string(py::str(st.dtype())) + " shape " + shape_str(st));
      starts = st.cast<py::array_t<i64, py::array::c_style>>();
      auto wa = f32(w, "conv weight (grouped packing)", 6);
      nib = wa.shape(1);
      win = f32_shape(w, "conv weight (grouped packing)", {ob, nib, s.kh, s.kw, block, block});
    }
    auto out = empty(output_shape(s, block));
    const float* xp = xin.data();
    const float* wp = win.data();
    const i64* sp = ib_start.is_none() ? nullptr : starts.data();
    float* yp = out.mutable_data();
    { py::gil_scoped_release nogil; conv2d_blocked(s, block, xp, wp, sp, nib, ep, yp); }
    return out;
  }, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("residual"), py::arg("params"),
     py::arg("block"), py::arg("lo") = -kInf, py::arg("hi") = kInf, py::arg("ib_start") = py::none(),
     "Direct/1x1/grouped conv nchw{B}c -> nchw{B}c; y = clamp(conv + bias [+ residual], lo, hi).");

  m.def("conv2d_depthwise_blocked", [](const py::array& x, const py::array& w,
                                       const py::object& bias, const py::object& residual,
                                       const std::vector<i64>& params, int block, float lo,
                                       float hi) {
    Conv2dShape s;
    auto xin = blocked_input(x, params, block, s);
    std::vector<FloatArray> keep;
    ConvEpilogue ep = epilogue(s, block, bias, residual, lo, hi, keep);
    auto win = f32_shape(w, "conv weight (Goihw{B}g)", {blocks(s.m, block), s.kh, s.kw, block});
    auto out = empty(output_shape(s, block));
    const float* xp = xin.data();
    const float* wp = win.data();
    float* yp = out.mutable_data();
    { py::gil_scoped_release nogil; conv2d_depthwise_blocked(s, block, xp, wp, ep, yp); }
    return out;
  }, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("residual"), py::arg("params"),
     py::arg("block"), py::arg("lo") = -kInf, py::arg("hi") = kInf,
     "Depthwise conv (group == C == M) nchw{B}c -> nchw{B}c with the fused epilogue.");

  m.def("conv2d_first_blocked", [](const py::array& x, const py::array& w,
                                   const py::object& bias, const py::object& residual,
                                   const std::vector<i64>& params, int block, float lo,
                                   float hi) {
    check_block(block);
    auto xa = f32(x, "conv input X (nchw)", 4);
    Conv2dShape s = geometry(params, xa.shape(0), xa.shape(2), xa.shape(3));
    auto xin = f32_shape(x, "conv input X (nchw)", {s.n, s.c, s.h, s.w});
    std::vector<FloatArray> keep;
    ConvEpilogue ep = epilogue(s, block, bias, residual, lo, hi, keep);
    auto win = f32_shape(w, "conv weight (Oihw{B}o)", {blocks(s.m, block), s.c, s.kh, s.kw, block});
    auto out = empty(output_shape(s, block));
    const float* xp = xin.data();
    const float* wp = win.data();
    float* yp = out.mutable_data();
    { py::gil_scoped_release nogil; conv2d_first_blocked(s, block, xp, wp, ep, yp); }
    return out;
  }, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("residual"), py::arg("params"),
     py::arg("block"), py::arg("lo") = -kInf, py::arg("hi") = kInf,
     "First-layer conv: standard nchw input (few channels) -> nchw{B}c, fused epilogue.");

  m.def("pack_conv_weight", [](const py::array& w, const std::string& format, int block) {
    check_block(block);
    const WeightFormat f = weight_format_from_name(format.c_str());
    auto win = f32(w, "conv weight", 4);
    const auto shape = logical_weight_shape(shape_of(win));
    auto out = empty(packed_weight_shape(f, shape.data(), block));
    const float* src = win.data();
    float* dst = out.mutable_data();
    { py::gil_scoped_release nogil; pack_weight(f, src, shape.data(), block, dst); }
    return out;
  }, py::arg("w"), py::arg("format"), py::arg("block"),
     "Pack a (M, C/group, KH, KW) weight: format 'blocked' (OIhw{B}i{B}o), 'depthwise' "
     "(Goihw{B}g) or 'first' (Oihw{B}o).");

  m.def("unpack_conv_weight", [](const py::array& packed, const std::vector<i64>& shape,
                                 const std::string& format, int block) {
    check_block(block);
    const WeightFormat f = weight_format_from_name(format.c_str());
    const auto logical = logical_weight_shape(shape);
    auto pin = f32_shape(packed, "packed conv weight", packed_weight_shape(f, logical.data(), block));
    auto out = empty(logical);
    const float* src = pin.data();
    float* dst = out.mutable_data();
    { py::gil_scoped_release nogil; unpack_weight(f, src, logical.data(), block, dst); }
    return out;
  }, py::arg("packed"), py::arg("shape"), py::arg("format"), py::arg("block"),
     "Inverse of pack_conv_weight: the (M, C/group, KH, KW) weight.");

  m.def("pack_conv_weight_grouped", [](const py::array& w, i64 c, i64 group, int block) {
    check_block(block);
    auto win = f32(w, "conv weight", 4);
    const auto shape = logical_weight_shape(shape_of(win));
    if (group < 1 || shape[1] * group != c || shape[0] % group)
      throw py::value_error("grouped conv weight " + shape_str(shape) + " does not match C=" +
                            std::to_string(c) + " and group=" + std::to_string(group));
    const i64 nib = grouped_input_blocks(c, shape[0], group, block);
    const i64 ob = blocks(shape[0], block);
    auto out = empty({ob, nib, shape[2], shape[3], block, block});
    py::array_t<i64, py::array::c_style> starts(ob);
    const float* src = win.data();
    float* dst = out.mutable_data();
    i64* sp = starts.mutable_data();
    {
      py::gil_scoped_release nogil;
      pack_grouped_weight(src, shape.data(), c, group, block, dst, sp);
    }
    return py::make_tuple(out, starts);
  }, py::arg("w"), py::arg("c"), py::arg("group"), py::arg("block"),
     "Pack a grouped conv weight for conv2d_blocked: (packed, ib_start per output block).");
}

}  // namespace opd::bindings
