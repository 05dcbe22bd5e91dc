// Bindings of the oneDNN matmul (opdispatch_onednn/matmul.h).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "opdispatch_onednn/layouts.h"
#include "opdispatch_onednn/matmul.h"

namespace opd::onednn::bindings {
namespace {

MatMulSpec spec_of(const std::vector<i64>& src, const std::vector<i64>& weights, bool bias,
                   bool sum, const std::string& eltwise, float alpha, float beta) {
  MatMulSpec s;
  s.src = src;
  s.weights = weights;
  s.bias = bias;
  s.post.sum = sum;
  s.post.eltwise = eltwise;
  s.post.alpha = alpha;
  s.post.beta = beta;
  validate(s);
  return s;
}

}  // namespace

void bind_matmul(py::module_& m) {
  m.def("matmul_formats", [](const std::vector<i64>& src, const std::vector<i64>& weights,
                             bool bias, const std::string& src_tag, const std::string& eltwise) {
    const MatMulSpec s = spec_of(src, weights, bias, false, eltwise, 0.f, 0.f);
    MatMulFormats f;
    { py::gil_scoped_release nogil; f = matmul_formats(s, src_tag); }
    py::dict d;
    d["weights"] = f.weights;
    d["weights_desc"] = f.weights_desc;
    d["impl"] = f.impl;
    return d;
  }, py::arg("src"), py::arg("weights"), py::arg("bias"), py::arg("src_tag"),
     py::arg("eltwise") = "",
     "The weights format oneDNN picks for this matmul (weights 'any'): {'weights': tag or '', "
     "'weights_desc', 'impl'}.");

  py::class_<MatMul>(m, "MatMul", "A oneDNN matmul primitive, created once per plan.")
      .def(py::init([](const std::vector<i64>& src, const std::vector<i64>& weights, bool bias,
                       const std::string& src_tag, const std::string& weights_tag, bool sum,
                       const std::string& eltwise, float alpha, float beta) {
             const MatMulSpec s = spec_of(src, weights, bias, sum, eltwise, alpha, beta);
             py::gil_scoped_release nogil;
             return new MatMul(s, src_tag, weights_tag);
           }),
           py::arg("src"), py::arg("weights"), py::arg("bias"), py::arg("src_tag"),
           py::arg("weights_tag"), py::arg("sum") = false, py::arg("eltwise") = "",
           py::arg("alpha") = 0.f, py::arg("beta") = 0.f)
      .def("set_weights", [](MatMul& mm, const py::array& w, const std::string& tag) {
             auto win = sized(w, "matmul weights", tag_physical_shape(mm.spec().weights, tag));
             const float* wp = win.data();
             py::gil_scoped_release nogil;
             mm.set_weights(wp, tag);
           }, py::arg("w"), py::arg("tag"),
           "Reorder constant weights given in format `tag` into the primitive's format, once.")
      .def("__call__", [](const MatMul& mm, const py::array& a, const py::object& w,
                          const py::object& b, const py::object& residual) {
             std::vector<py_arrays::FloatArray> keep;
             auto ain = sized(a, "matmul input A", mm.src_shape());
             const float* wp = nullptr;
             if (!mm.has_weights()) {
               if (w.is_none()) throw py::value_error("matmul: weights B are required (none were set at build)");
               keep.push_back(sized(w.cast<py::array>(), "matmul weights B", mm.weights_shape()));
               wp = keep.back().data();
             }
             const float* bp = nullptr;
             if (!b.is_none()) {
               keep.push_back(sized(b.cast<py::array>(), "matmul bias", {mm.spec().weights.back()}));
               bp = keep.back().data();
             }
             if (mm.spec().bias && bp == nullptr)
               throw py::value_error("matmul: this primitive was created with a bias; received None");
             const float* rp = nullptr;
             if (!residual.is_none()) {
               keep.push_back(sized(residual.cast<py::array>(), "matmul residual", mm.dst_shape()));
               rp = keep.back().data();
             }
             if (mm.spec().post.sum && rp == nullptr)
               throw py::value_error("matmul: this primitive adds a residual; received None");
             auto out = py_arrays::empty(mm.dst_shape());
             const float* ap = ain.data();
             float* yp = out.mutable_data();
             { py::gil_scoped_release nogil; mm.run(ap, wp, bp, rp, yp); }
             return out;
           }, py::arg("a"), py::arg("w") = py::none(), py::arg("b") = py::none(),
           py::arg("residual") = py::none(),
           "y = post(a x w + b [+ residual]); y has the plain dst shape.")
      .def_property_readonly("src_shape", &MatMul::src_shape)
      .def_property_readonly("dst_shape", &MatMul::dst_shape)
      .def_property_readonly("weights_shape", &MatMul::weights_shape)
      .def_property_readonly("weights_format", &MatMul::weights_format)
      .def_property_readonly("weights_in_place", &MatMul::weights_in_place)
      .def_property_readonly("impl", &MatMul::impl);
}

}  // namespace opd::onednn::bindings
