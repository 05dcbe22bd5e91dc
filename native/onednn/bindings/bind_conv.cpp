// Bindings of the oneDNN convolution (opdispatch_onednn/conv.h).
//
// Geometry is `params` = [N, C, H, W, M, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR, group]
// (logical sizes, ONNX dilations, explicit pads), validated in C++.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <limits>

#include "bindings.h"
#include "opdispatch_onednn/conv.h"
#include "opdispatch_onednn/layouts.h"

namespace opd::onednn::bindings {
namespace {

ConvSpec spec_of(const std::vector<i64>& p, bool bias, bool sum, const std::string& eltwise,
                 float alpha, float beta) {
  if (p.size() != 16)
    throw py::value_error("conv params must be [N, C, H, W, M, KH, KW, SH, SW, DH, DW, PT, PL, "
                          "PB, PR, group] (16 ints), received " + std::to_string(p.size()) +
                          " values");
  ConvSpec s;
  s.n = p[0]; s.c = p[1]; s.h = p[2]; s.w = p[3]; s.m = p[4]; s.kh = p[5]; s.kw = p[6];
  s.sh = p[7]; s.sw = p[8]; s.dh = p[9]; s.dw = p[10];
  s.pt = p[11]; s.pl = p[12]; s.pb = p[13]; s.pr = p[14]; s.group = p[15];
  s.bias = bias;
  s.post.sum = sum;
  s.post.eltwise = eltwise;
  s.post.alpha = alpha;
  s.post.beta = beta;
  validate(s);
  return s;
}

}  // namespace

void bind_conv(py::module_& m) {
  m.def("conv_formats", [](const std::vector<i64>& params, bool bias, const std::string& src,
                           const std::string& dst, bool sum, const std::string& eltwise,
                           float alpha, float beta) {
    const ConvSpec s = spec_of(params, bias, sum, eltwise, alpha, beta);
    ConvFormats f;
    { py::gil_scoped_release nogil; f = conv_formats(s, src, dst); }
    py::dict d;
    d["src"] = f.src; d["weights"] = f.weights; d["dst"] = f.dst;
    d["src_desc"] = f.src_desc; d["weights_desc"] = f.weights_desc; d["dst_desc"] = f.dst_desc;
    d["impl"] = f.impl;
    return d;
  }, py::arg("params"), py::arg("bias"), py::arg("src") = "any", py::arg("dst") = "any",
     py::arg("sum") = false, py::arg("eltwise") = "", py::arg("alpha") = 0.f,
     py::arg("beta") = 0.f,
     "The formats oneDNN picks for this convolution (src/dst: a tag or 'any'; weights: any): "
     "{'src', 'weights', 'dst': tag or '' when unnamed, '*_desc': descriptions, 'impl'}.");

  py::class_<Conv>(m, "Conv", "A oneDNN convolution primitive, created once per plan.")
      .def(py::init([](const std::vector<i64>& params, bool bias, const std::string& src,
                       const std::string& dst, const std::string& weights, bool sum,
                       const std::string& eltwise, float alpha, float beta) {
             const ConvSpec s = spec_of(params, bias, sum, eltwise, alpha, beta);
             py::gil_scoped_release nogil;
             return new Conv(s, src, dst, weights);
           }),
           py::arg("params"), py::arg("bias"), py::arg("src"), py::arg("dst"),
           py::arg("weights"), py::arg("sum") = false, py::arg("eltwise") = "",
           py::arg("alpha") = 0.f, py::arg("beta") = 0.f)
      .def("set_weights", [](Conv& c, const py::array& w, const std::string& tag) {
             auto win = sized(w, "conv weights", tag_physical_shape(conv_weight_dims(c.spec()), tag));
             const float* wp = win.data();
             py::gil_scoped_release nogil;
             c.set_weights(wp, tag);
           }, py::arg("w"), py::arg("tag"),
           "Reorder constant weights given in format `tag` into the primitive's format, once "
           "(calls then ignore their `w`).")
      .def("__call__", [](const Conv& c, const py::array& x, const py::object& w,
                          const py::object& b, const py::object& residual) {
             std::vector<py_arrays::FloatArray> keep;
             auto xin = exact(x, "conv input X", c.src_shape());
             const float* wp = nullptr;
             if (!w.is_none() && !c.has_weights()) {
               keep.push_back(sized(w.cast<py::array>(), "conv weights W", c.weights_shape()));
               wp = keep.back().data();
             } else if (!c.has_weights()) {
               throw py::value_error("conv: weights W are required (none were set at build)");
             }
             const float* bp = optional_data(b, "conv bias B", {c.spec().m}, keep);
             if (c.spec().bias && bp == nullptr)
               throw py::value_error("conv: this primitive was created with a bias; received None");
             const float* rp = optional_data(residual, "conv residual (sum input)", c.dst_shape(), keep);
             if (c.spec().post.sum && rp == nullptr)
               throw py::value_error("conv: this primitive adds a residual; received None");
             auto out = py_arrays::empty(c.dst_shape());
             const float* xp = xin.data();
             float* yp = out.mutable_data();
             { py::gil_scoped_release nogil; c.run(xp, wp, bp, rp, yp); }
             return out;
           }, py::arg("x"), py::arg("w") = py::none(), py::arg("b") = py::none(),
           py::arg("residual") = py::none(),
           "y = post(conv(x, w) + b [+ residual]) in the primitive's formats.")
      .def_property_readonly("src_shape", &Conv::src_shape)
      .def_property_readonly("dst_shape", &Conv::dst_shape)
      .def_property_readonly("weights_shape", &Conv::weights_shape)
      .def_property_readonly("weights_format", &Conv::weights_format)
      .def_property_readonly("weights_in_place", &Conv::weights_in_place)
      .def_property_readonly("residual_in_place", &Conv::residual_in_place)
      .def_property_readonly("impl", &Conv::impl);
}

}  // namespace opd::onednn::bindings
