// Bindings of the concatenation kernels (opdispatch/concat.h): concat (standard layout, any
// axis, any fixed-size dtype) and concat_channels (nhwc / nchw8c / nchw16c, axis C).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "opdispatch/concat.h"

namespace py = pybind11;
using namespace opd::py_arrays;

namespace opd::bindings {
namespace {

std::vector<std::int64_t> shape_of(const py::array& a) {
  return std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim());
}

void check_contiguous(const py::array& a, const char* what) {
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(std::string(what) +
                          ": expected a C-contiguous array, received a non-contiguous one "
                          "(use numpy.ascontiguousarray)");
}

}  // namespace

void bind_concat(py::module_& m) {
  m.def("concat", [](const std::vector<py::array>& xs, std::int64_t axis) {
    if (xs.empty()) throw py::value_error("concat: expected at least one array, received none");
    const py::dtype dt = xs[0].dtype();
    if (dt.kind() == 'O')
      throw py::value_error("concat: object arrays (e.g. strings) cannot be copied as bytes");
    const auto first = shape_of(xs[0]);
    const auto rank = static_cast<std::int64_t>(first.size());
    if (rank == 0) throw py::value_error("concat: expected arrays of rank >= 1, received a scalar");
    if (axis < -rank || axis >= rank)
      throw py::value_error("concat: axis " + std::to_string(axis) + " is out of range for rank " +
                            std::to_string(rank));
    const std::int64_t a = axis < 0 ? axis + rank : axis;
    std::int64_t outer = 1, inner = static_cast<std::int64_t>(dt.itemsize());
    for (std::int64_t d = 0; d < a; ++d) outer *= first[d];
    for (std::int64_t d = a + 1; d < rank; ++d) inner *= first[d];
    std::vector<const void*> ptrs;
    std::vector<std::int64_t> rows;
    auto out_shape = first;
    out_shape[a] = 0;
    for (const auto& x : xs) {
      if (!x.dtype().equal(dt))  // equal, not identical: dtypes such as '<U3' are not singletons
        throw py::value_error("concat: inputs must share one dtype, received " +
                              std::string(py::str(dt)) + " and " + std::string(py::str(x.dtype())));
      const auto s = shape_of(x);
      bool same = s.size() == first.size();
      for (std::int64_t d = 0; same && d < rank; ++d) same = d == a || s[d] == first[d];
      if (!same)
        throw py::value_error("concat: shapes must match except along axis " + std::to_string(a) +
                              ", received " + shape_str(first) + " and " + shape_str(s));
      check_contiguous(x, "concat input");
      ptrs.push_back(x.data());
      rows.push_back(s[a] * inner);
      out_shape[a] += s[a];
    }
    py::array out(dt, std::vector<py::ssize_t>(out_shape.begin(), out_shape.end()));
    void* dst = out.mutable_data();
    { py::gil_scoped_release nogil; concat_rows(ptrs, rows, dst, outer); }
    return out;
  }, py::arg("xs"), py::arg("axis"),
     "Concat of row-major arrays along `axis` (negative counts from the end), any fixed-size "
     "dtype: one memcpy per contiguous chunk.");

  m.def("concat_channels", [](const std::vector<py::array>& xs, const std::string& layout,
                              const std::vector<std::int64_t>& channels) {
    if (xs.empty())
      throw py::value_error("concat_channels: expected at least one array, received none");
    if (channels.size() != xs.size())
      throw py::value_error("concat_channels: expected one channel count per input, received " +
                            std::to_string(channels.size()) + " for " +
                            std::to_string(xs.size()) + " inputs");
    int block = 0;
    if (layout == "nchw8c") block = 8;
    else if (layout == "nchw16c") block = 16;
    else if (layout != "nhwc")
      throw py::value_error("concat_channels: unknown layout '" + layout +
                            "'; known: nhwc, nchw8c, nchw16c");
    std::vector<FloatArray> keep;
    std::int64_t n = 0, h = 0, w = 0, total = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      keep.push_back(f32(xs[i], "concat_channels input", block ? 5 : 4));
      const auto s = shape_of(keep.back());
      if (channels[i] < 0)
        throw py::value_error("concat_channels: negative channel count " +
                              std::to_string(channels[i]));
      if (i == 0) {
        n = s[0];
        h = block ? s[2] : s[1];
        w = block ? s[3] : s[2];
      }
      const std::vector<std::int64_t> expected =
          block ? std::vector<std::int64_t>{n, blocks(channels[i], block), h, w, block}
                : std::vector<std::int64_t>{n, h, w, channels[i]};
      if (s != expected)
        throw py::value_error("concat_channels: input " + std::to_string(i) +
                              " must have physical shape " + shape_str(expected) + ", received " +
                              shape_str(s));
      total += channels[i];
    }
    const auto out_shape = block ? std::vector<std::int64_t>{n, blocks(total, block), h, w, block}
                                 : std::vector<std::int64_t>{n, h, w, total};
    auto out = empty(out_shape);
    float* dst = out.mutable_data();
    std::vector<const float*> ptrs;
    for (const auto& k : keep) ptrs.push_back(k.data());
    {
      py::gil_scoped_release nogil;
      if (block) {
        concat_blocked_channels(ptrs, channels, dst, n, h * w, block);
      } else {
        std::vector<const void*> raw(ptrs.begin(), ptrs.end());
        std::vector<std::int64_t> rows;
        for (auto c : channels) rows.push_back(c * static_cast<std::int64_t>(sizeof(float)));
        concat_rows(raw, rows, dst, n * h * w);
      }
    }
    return out;
  }, py::arg("xs"), py::arg("layout"), py::arg("channels"),
     "Channel Concat of rank-4 activations in nhwc / nchw8c / nchw16c; `channels` are the "
     "inputs' logical channel counts. Blocked outputs keep zero padding channels.");
}

}  // namespace opd::bindings
