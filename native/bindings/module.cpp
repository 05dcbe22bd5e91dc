// The `_opdispatch_native` extension module: build information, CPU features, threads, and
// the kernel families bound in bind_*.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "opdispatch/cpu.h"
#include "opdispatch/parallel.h"

namespace py = pybind11;

PYBIND11_MODULE(_opdispatch_native, m) {
  m.doc() = "opdispatch native kernels: layout converters and CPU kernels (float32).";
  m.attr("build_id") = OPD_BUILD_ID;
  m.attr("compiler") = OPD_COMPILER;
  m.attr("openmp") = opd::have_openmp();

  m.def("cpu_flags", &opd::cpu_flags, "CPU feature flags detected at run time.");
  m.def("supported_isas", [] {
    std::vector<std::string> out;
    for (auto i : opd::supported_isas()) out.emplace_back(opd::isa_name(i));
    return out;
  }, "Instruction-set levels this CPU and build can run, lowest first.");
  m.def("isa", [] { return std::string(opd::isa_name(opd::active_isa())); },
        "The instruction-set level the kernels use now.");
  m.def("set_isa", [](const std::string& name) { opd::set_isa(opd::isa_from_name(name)); },
        py::arg("name"), "Force an instruction-set level ('generic', 'avx2', 'avx512').");
  m.def("num_threads", &opd::num_threads, "Threads the kernels use.");
  m.def("set_num_threads", &opd::set_num_threads, py::arg("n"),
        "Set the kernels' thread count (>= 1).");

  opd::bindings::bind_layouts(m);
  opd::bindings::bind_elementwise(m);
  // conv bind call
  opd::bindings::bind_conv(m);
  // pool bind call
  opd::bindings::bind_pool(m);
  // norm bind call
  opd::bindings::bind_norm(m);
  opd::bindings::bind_concat(m);
  // gemm bind call
  opd::bindings::bind_gemm(m);
}
