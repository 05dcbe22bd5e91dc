// The `_opdispatch_onednn` extension module: oneDNN's version, instruction set and threads,
// and the primitive families bound in bind_*.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "opdispatch_onednn/common.h"

namespace py = pybind11;
namespace od = opd::onednn;

PYBIND11_MODULE(_opdispatch_onednn, m) {
  m.doc() = "opdispatch's oneDNN backend: oneDNN primitives (float32, CPU) created once per plan.";
  m.attr("build_id") = OPD_ONEDNN_BUILD_ID;
  m.attr("compiler") = OPD_COMPILER;
  m.attr("header_version") = py::make_tuple(DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, DNNL_VERSION_PATCH);

  m.def("dnnl_version", [] {
    auto v = od::library_version();
    return py::make_tuple(v[0], v[1], v[2], od::library_hash());
  }, "(major, minor, patch, commit hash) of the oneDNN library loaded at run time.");
  m.def("cpu_isa", &od::effective_isa, "oneDNN's effective instruction set on this CPU.");
  m.def("cpu_runtime", &od::cpu_runtime, "The CPU threading runtime oneDNN was built with.");
  m.def("num_threads", &od::num_threads, "Threads oneDNN's primitives use.");
  m.def("set_num_threads", &od::set_num_threads, py::arg("n"),
        "Threads for oneDNN's primitives (OpenMP: applied per executing thread); 0 = default.");
  m.def("known_tags", &od::known_tags, py::arg("rank") = 0,
        "Names of the format tags this module knows (of one rank, or all for 0).");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dnnl::error& e) {
      PyErr_SetString(PyExc_RuntimeError, (std::string("oneDNN error: ") + e.what()).c_str());
    }
  });

  od::bindings::bind_layouts(m);
  od::bindings::bind_conv(m);
  od::bindings::bind_matmul(m);
  od::bindings::bind_pool(m);
  od::bindings::bind_eltwise(m);
  od::bindings::bind_norm(m);
}
