// Bindings of the oneDNN pooling (opdispatch_onednn/pool.h).
//
// Geometry is `params` = [N, C, H, W, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR].
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "opdispatch_onednn/pool.h"

namespace opd::onednn::bindings {

void bind_pool(py::module_& m) {
  py::class_<Pool>(m, "Pool", "A oneDNN 2-D pooling primitive, created once per plan.")
      .def(py::init([](const std::vector<i64>& p, const std::string& kind, const std::string& tag) {
             if (p.size() != 14)
               throw py::value_error("pool params must be [N, C, H, W, KH, KW, SH, SW, DH, DW, PT, "
                                     "PL, PB, PR] (14 ints), received " + std::to_string(p.size()) +
                                     " values");
             PoolSpec s;
             s.n = p[0]; s.c = p[1]; s.h = p[2]; s.w = p[3]; s.kh = p[4]; s.kw = p[5];
             s.sh = p[6]; s.sw = p[7]; s.dh = p[8]; s.dw = p[9];
             s.pt = p[10]; s.pl = p[11]; s.pb = p[12]; s.pr = p[13]; s.kind = kind;
             py::gil_scoped_release nogil;
             return new Pool(s, tag);
           }),
           py::arg("params"), py::arg("kind"), py::arg("tag"))
      .def("__call__", [](const Pool& pool, const py::array& x) {
             auto xin = exact(x, "pool input X", pool.src_shape());
             auto out = py_arrays::empty(pool.dst_shape());
             const float* xp = xin.data();
             float* yp = out.mutable_data();
             { py::gil_scoped_release nogil; pool.run(xp, yp); }
             return out;
           }, py::arg("x"))
      .def_property_readonly("src_shape", &Pool::src_shape)
      .def_property_readonly("dst_shape", &Pool::dst_shape)
      .def_property_readonly("impl", &Pool::impl);
}

}  // namespace opd::onednn::bindings
