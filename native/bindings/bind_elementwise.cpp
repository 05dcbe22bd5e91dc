// Bindings of the elementwise kernels.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "opdispatch/elementwise.h"

namespace py = pybind11;
using namespace opd::py_arrays;

namespace opd::bindings {
namespace {

BinaryOp op_of(const std::string& name) {
  if (name == "add") return BinaryOp::add;
  if (name == "sub") return BinaryOp::sub;
  if (name == "mul") return BinaryOp::mul;
  if (name == "div") return BinaryOp::div;
  if (name == "max") return BinaryOp::max;
  if (name == "min") return BinaryOp::min;
  throw py::value_error("unknown binary op '" + name + "'; known: add, sub, mul, div, max, min");
}

std::vector<std::int64_t> shape_of(const py::array& a) {
  return std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim());
}

}  // namespace

void bind_elementwise(py::module_& m) {
  m.def("relu", [](const py::array& x) {
    auto in = f32(x, "relu input");
    auto out = empty(shape_of(in));
    const float* s = in.data();
    float* d = out.mutable_data();
    const std::int64_t n = in.size();
    { py::gil_scoped_release nogil; relu(s, d, n); }
    return out;
  }, py::arg("x"), "max(x, 0)");

  m.def("clip", [](const py::array& x, float lo, float hi) {
    auto in = f32(x, "clip input");
    auto out = empty(shape_of(in));
    const float* s = in.data();
    float* d = out.mutable_data();
    const std::int64_t n = in.size();
    { py::gil_scoped_release nogil; clip(s, d, n, lo, hi); }
    return out;
  }, py::arg("x"), py::arg("lo"), py::arg("hi"), "min(max(x, lo), hi)");

  m.def("binary_same", [](const std::string& name, const py::array& a, const py::array& b,
                          bool fuse_relu) {
    BinaryOp op = op_of(name);
    auto pa = f32(a, "binary input A");
    auto pb = f32(b, "binary input B");
    if (shape_of(pa) != shape_of(pb))
      throw py::value_error("binary_same: inputs must have the same shape, received " +
                            shape_str(pa) + " and " + shape_str(pb));
    auto out = empty(shape_of(pa));
    const float* x = pa.data();
    const float* y = pb.data();
    float* d = out.mutable_data();
    const std::int64_t n = pa.size();
    { py::gil_scoped_release nogil; binary_same(op, x, y, d, n, fuse_relu); }
    return out;
  }, py::arg("op"), py::arg("a"), py::arg("b"), py::arg("relu") = false,
     "a op b for arrays of one shape (any layout), optionally followed by Relu.");

  m.def("binary_broadcast", [](const std::string& name, const py::array& a, const py::array& b) {
    BinaryOp op = op_of(name);
    auto pa = f32(a, "binary input A");
    auto pb = f32(b, "binary input B");
    const auto sa = shape_of(pa), sb = shape_of(pb);
    const std::size_t rank = std::max(sa.size(), sb.size());
    std::vector<std::int64_t> out_shape(rank), as(rank, 0), bs(rank, 0);
    std::int64_t stride_a = 1, stride_b = 1;
    for (std::size_t k = 0; k < rank; ++k) {
      const std::size_t d = rank - 1 - k;
      const std::int64_t da = k < sa.size() ? sa[sa.size() - 1 - k] : 1;
      const std::int64_t db = k < sb.size() ? sb[sb.size() - 1 - k] : 1;
      if (da != db && da != 1 && db != 1)
        throw py::value_error("binary_broadcast: shapes " + shape_str(sa) + " and " +
                              shape_str(sb) + " do not broadcast");
      out_shape[d] = da == 1 ? db : da;
      as[d] = da == 1 ? 0 : stride_a;
      bs[d] = db == 1 ? 0 : stride_b;
      stride_a *= da;
      stride_b *= db;
    }
    auto out = empty(out_shape);
    const float* x = pa.data();
    const float* y = pb.data();
    float* d = out.mutable_data();
    { py::gil_scoped_release nogil; binary_broadcast(op, x, as, y, bs, d, out_shape); }
    return out;
  }, py::arg("op"), py::arg("a"), py::arg("b"),
     "a op b with numpy broadcasting (standard layout).");

  m.def("sum_n", [](const std::vector<py::array>& xs) {
    if (xs.empty()) throw py::value_error("sum_n: expected at least one array, received none");
    std::vector<FloatArray> keep;
    std::vector<const float*> ptrs;
    for (const auto& x : xs) {
      keep.push_back(f32(x, "sum_n input"));
      if (shape_of(keep.back()) != shape_of(keep.front()))
        throw py::value_error("sum_n: inputs must have one shape, received " +
                              shape_str(keep.front()) + " and " + shape_str(keep.back()));
      ptrs.push_back(keep.back().data());
    }
    auto out = empty(shape_of(keep.front()));
    float* d = out.mutable_data();
    const std::int64_t n = keep.front().size();
    { py::gil_scoped_release nogil; sum_n(ptrs, d, n); }
    return out;
  }, py::arg("xs"), "Sum of arrays of one shape (any layout).");
}

}  // namespace opd::bindings
