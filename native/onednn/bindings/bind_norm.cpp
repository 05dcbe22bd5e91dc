// Bindings of the oneDNN batch normalization (opdispatch_onednn/norm.h).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "opdispatch_onednn/norm.h"

namespace opd::onednn::bindings {

void bind_norm(py::module_& m) {
  py::class_<BatchNorm>(m, "BatchNorm", "A oneDNN batch normalization (inference), created once.")
      .def(py::init([](const std::vector<i64>& dims, const std::string& tag, float epsilon,
                       bool relu, const py::array& scale, const py::array& shift,
                       const py::array& mean, const py::array& var) {
             std::unique_ptr<BatchNorm> bn;
             {
               py::gil_scoped_release nogil;
               bn = std::make_unique<BatchNorm>(dims, tag, epsilon, relu);
             }
             const std::vector<i64> c{bn->channels()};
             auto s = exact(scale, "batch normalization scale", c);
             auto b = exact(shift, "batch normalization B", c);
             auto mu = exact(mean, "batch normalization mean", c);
             auto v = exact(var, "batch normalization var", c);
             bn->set_params(s.data(), b.data(), mu.data(), v.data());
             return bn.release();
           }),
           py::arg("dims"), py::arg("tag"), py::arg("epsilon"), py::arg("relu"), py::arg("scale"),
           py::arg("shift"), py::arg("mean"), py::arg("var"))
      .def("__call__", [](const BatchNorm& bn, const py::array& x) {
             auto xin = sized(x, "batch normalization input X", bn.shape());
             std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
             py_arrays::FloatArray out(shape);
             const float* xp = xin.data();
             float* yp = out.mutable_data();
             { py::gil_scoped_release nogil; bn.run(xp, yp); }
             return out;
           }, py::arg("x"), "y = batchnorm(x), of x's shape.")
      .def_property_readonly("impl", &BatchNorm::impl);
}

}  // namespace opd::onednn::bindings
