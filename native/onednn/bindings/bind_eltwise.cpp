// Bindings of the oneDNN eltwise and binary primitives (opdispatch_onednn/eltwise.h).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "opdispatch_onednn/eltwise.h"

namespace opd::onednn::bindings {

void bind_eltwise(py::module_& m) {
  m.def("eltwise_kinds", &eltwise_kinds, "Names of the unary eltwise algorithms.");
  m.def("binary_kinds", &binary_kinds, "Names of the binary algorithms.");

  py::class_<Eltwise>(m, "Eltwise", "A oneDNN eltwise primitive, created once per plan.")
      .def(py::init([](const std::string& kind, float alpha, float beta,
                       const std::vector<i64>& dims, const std::string& tag) {
             py::gil_scoped_release nogil;
             return new Eltwise(kind, alpha, beta, dims, tag);
           }),
           py::arg("kind"), py::arg("alpha"), py::arg("beta"), py::arg("dims"), py::arg("tag"))
      .def("__call__", [](const Eltwise& e, const py::array& x) {
             auto xin = sized(x, "eltwise input X", e.shape());
             std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
             py_arrays::FloatArray out(shape);
             const float* xp = xin.data();
             float* yp = out.mutable_data();
             { py::gil_scoped_release nogil; e.run(xp, yp); }
             return out;
           }, py::arg("x"), "y = f(x), of x's shape.")
      .def_property_readonly("impl", &Eltwise::impl);

  py::class_<Binary>(m, "Binary", "A oneDNN binary primitive, created once per plan.")
      .def(py::init([](const std::string& kind, const std::vector<i64>& dims, const std::string& tag,
                       const std::vector<i64>& b_dims, const std::string& b_tag,
                       const std::string& eltwise) {
             py::gil_scoped_release nogil;
             return new Binary(kind, dims, tag, b_dims, b_tag, eltwise);
           }),
           py::arg("kind"), py::arg("dims"), py::arg("tag"), py::arg("b_dims"), py::arg("b_tag"),
           py::arg("eltwise") = "")
      .def("__call__", [](const Binary& op, const py::array& a, const py::array& b) {
             auto ain = sized(a, "binary input A", op.shape());
             auto bin = sized(b, "binary input B", op.b_shape());
             std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
             py_arrays::FloatArray out(shape);
             const float* ap = ain.data();
             const float* bp = bin.data();
             float* yp = out.mutable_data();
             { py::gil_scoped_release nogil; op.run(ap, bp, yp); }
             return out;
           }, py::arg("a"), py::arg("b"), "y = post(a op b), of a's shape.")
      .def_property_readonly("impl", &Binary::impl);
}

}  // namespace opd::onednn::bindings
