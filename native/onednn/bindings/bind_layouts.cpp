// Bindings of the reorders between named formats (opdispatch_onednn/layouts.h).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "opdispatch_onednn/layouts.h"

namespace opd::onednn::bindings {

void bind_layouts(py::module_& m) {
  m.def("physical_shape", [](const std::vector<i64>& dims, const std::string& tag) {
    return tag_physical_shape(dims, tag);
  }, py::arg("dims"), py::arg("tag"),
     "Shape of the array holding a tensor of logical `dims` in format `tag`.");

  m.def("reorder", [](const py::array& x, const std::vector<i64>& dims, const std::string& src,
                      const std::string& dst) {
    const Dims in_shape = tag_physical_shape(dims, src);
    const Dims out_shape = tag_physical_shape(dims, dst);
    auto xin = sized(x, ("reorder input (" + src + ")").c_str(), in_shape);
    auto out = py_arrays::empty(out_shape);
    const float* xp = xin.data();
    float* yp = out.mutable_data();
    { py::gil_scoped_release nogil; reorder(dims, src, dst, xp, yp); }
    return out;
  }, py::arg("x"), py::arg("dims"), py::arg("src"), py::arg("dst"),
     "Reorder a tensor of logical `dims` from format `src` to format `dst` (tags); the result "
     "has dst's physical shape, padding zero-filled.");
}

}  // namespace opd::onednn::bindings
