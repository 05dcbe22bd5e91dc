// Bindings of the packed GEMM, MatMul and the channels-last convolutions (opdispatch/gemm.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "opdispatch/gemm.h"
#include "opdispatch/parallel.h"

namespace py = pybind11;
using namespace opd::py_arrays;

namespace opd::bindings {
namespace {

using Shape = std::vector<std::int64_t>;

Shape shape_of(const py::array& a) { return Shape(a.shape(), a.shape() + a.ndim()); }

std::string str(std::int64_t v) { return std::to_string(v); }

Activation activation_of(const std::string& name) {
  if (name == "none") return Activation::none;
  if (name == "relu") return Activation::relu;
  if (name == "clip") return Activation::clip;
  throw py::value_error("unknown activation '" + name + "'; known: none, relu, clip");
}

// A packed B (panels, k, 16) for n columns.
FloatArray packed_arg(const py::array& b, std::int64_t n, const char* what) {
  auto p = f32(b, what, 3);
  if (p.shape(2) != kGemmNR || p.shape(0) != gemm_panels(n))
    throw py::value_error(std::string(what) + ": expected a packed B of shape (" +
                          str(gemm_panels(n)) + ", K, 16) for N=" + str(n) + ", received " +
                          shape_str(p));
  return p;
}

// Strides that broadcast `c` (rank <= 2) to (m, n), as Gemm's C; ValueError otherwise.
void broadcast_2d(const FloatArray& c, std::int64_t m, std::int64_t n, std::int64_t* rs,
                  std::int64_t* cs, const char* what) {
  const Shape s = shape_of(c);
  if (s.size() > 2)
    throw py::value_error(std::string(what) + ": expected rank <= 2, received " + shape_str(s));
  const std::int64_t d0 = s.size() == 2 ? s[0] : 1;
  const std::int64_t d1 = s.empty() ? 1 : s.back();
  if ((d0 != 1 && d0 != m) || (d1 != 1 && d1 != n))
    throw py::value_error(std::string(what) + ": shape " + shape_str(s) +
                          " does not broadcast to (" + str(m) + ", " + str(n) + ")");
  *rs = d0 == 1 ? 0 : d1;
  *cs = d1 == 1 ? 0 : 1;
}

// Fills the epilogue's bias / residual / activation from Python arguments; `keep` holds the
// validated arrays alive.
GemmEpilogue make_epilogue(std::int64_t m, std::int64_t n, float alpha, const py::object& bias,
                           float beta, const py::object& residual, const std::string& act,
                           float lo, float hi, std::vector<FloatArray>& keep) {
  GemmEpilogue ep;
  ep.alpha = alpha;
  ep.beta = beta;
  if (!bias.is_none()) {
    keep.push_back(f32(bias.cast<py::array>(), "gemm bias"));
    broadcast_2d(keep.back(), m, n, &ep.bias_rs, &ep.bias_cs, "gemm bias");
    ep.bias = keep.back().data();
  }
  if (!residual.is_none()) {
    keep.push_back(f32_shape(residual.cast<py::array>(), "gemm residual", {m, n}));
    ep.residual = keep.back().data();
    ep.residual_ld = n;
  }
  ep.act = activation_of(act);
  ep.lo = lo;
  ep.hi = hi;
  return ep;
}

// Batch dimensions of `a` and `b` broadcast numpy-style; per output batch, the offsets (in
// matrices) of the a and b operands.
Shape broadcast_batch(const Shape& ba, const Shape& bb, std::vector<std::int64_t>& ia,
                      std::vector<std::int64_t>& ib) {
  const std::size_t rank = std::max(ba.size(), bb.size());
  Shape out(rank);
  std::vector<std::int64_t> sa(rank, 0), sb(rank, 0);
  std::int64_t stride_a = 1, stride_b = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    const std::size_t d = rank - 1 - k;
    const std::int64_t da = k < ba.size() ? ba[ba.size() - 1 - k] : 1;
    const std::int64_t db = k < bb.size() ? bb[bb.size() - 1 - k] : 1;
    if (da != db && da != 1 && db != 1)
      throw py::value_error("matmul: batch dimensions " + shape_str(ba) + " and " +
                            shape_str(bb) + " do not broadcast");
    out[d] = da == 1 ? db : da;
    sa[d] = da == 1 ? 0 : stride_a;
    sb[d] = db == 1 ? 0 : stride_b;
    stride_a *= da;
    stride_b *= db;
  }
  std::int64_t total = 1;
  for (auto d : out) total *= d;
  ia.assign(static_cast<std::size_t>(total), 0);
  ib.assign(static_cast<std::size_t>(total), 0);
  for (std::int64_t t = 0; t < total; ++t) {
    std::int64_t rem = t, oa = 0, ob = 0;
    for (std::size_t k = 0; k < rank; ++k) {
      const std::size_t d = rank - 1 - k;
      const std::int64_t idx = rem % out[d];
      rem /= out[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    ia[static_cast<std::size_t>(t)] = oa;
    ib[static_cast<std::size_t>(t)] = ob;
  }
  return out;
}

struct ConvArgs {
  ConvGeom g;
  std::int64_t pb = 0, pr = 0;
};

// Geometry from the nhwc input, the kernel attributes and pads (top, left, bottom, right).
ConvArgs conv_args(const FloatArray& x, std::int64_t m, const Shape& kernel, const Shape& strides,
                   const Shape& dilations, const Shape& pads, std::int64_t group) {
  if (kernel.size() != 2 || strides.size() != 2 || dilations.size() != 2 || pads.size() != 4)
    throw py::value_error("conv: expected kernel, strides, dilations of 2 values and pads of 4 "
                          "(top, left, bottom, right), received " + str(kernel.size()) + ", " +
                          str(strides.size()) + ", " + str(dilations.size()) + ", " +
                          str(pads.size()));
  ConvArgs c;
  ConvGeom& g = c.g;
  g.n = x.shape(0);
  g.h = x.shape(1);
  g.w = x.shape(2);
  g.c = x.shape(3);
  g.m = m;
  g.kh = kernel[0];
  g.kw = kernel[1];
  g.sh = strides[0];
  g.sw = strides[1];
  g.dh = dilations[0];
  g.dw = dilations[1];
  g.pt = pads[0];
  g.pl = pads[1];
  c.pb = pads[2];
  c.pr = pads[3];
  g.group = group;
  const std::int64_t eh = (g.kh - 1) * g.dh + 1, ew = (g.kw - 1) * g.dw + 1;
  const std::int64_t sh = std::max<std::int64_t>(g.sh, 1), sw = std::max<std::int64_t>(g.sw, 1);
  g.oh = g.h + g.pt + c.pb >= eh ? (g.h + g.pt + c.pb - eh) / sh + 1 : 0;
  g.ow = g.w + g.pl + c.pr >= ew ? (g.w + g.pl + c.pr - ew) / sw + 1 : 0;
  check_conv_geom(g, c.pb, c.pr);
  return c;
}

const float* optional_vec(const py::object& o, std::int64_t len, const char* what,
                          std::vector<FloatArray>& keep) {
  if (o.is_none()) return nullptr;
  keep.push_back(f32_shape(o.cast<py::array>(), what, {len}));
  return keep.back().data();
}

const float* optional_like(const py::object& o, const Shape& shape, const char* what,
                           std::vector<FloatArray>& keep) {
  if (o.is_none()) return nullptr;
  keep.push_back(f32_shape(o.cast<py::array>(), what, shape));
  return keep.back().data();
}

}  // namespace

void bind_gemm(py::module_& m) {
  m.attr("gemm_nr") = kGemmNR;

  m.def("gemm_pack_b", [](const py::array& b, bool trans) {
    auto in = f32(b, "gemm_pack_b input", 2);
    const std::int64_t r = in.shape(0), c = in.shape(1);
    const std::int64_t k = trans ? c : r, n = trans ? r : c;
    auto out = empty({gemm_panels(n), k, kGemmNR});
    const float* s = in.data();
    float* d = out.mutable_data();
    { py::gil_scoped_release nogil; pack_b(s, k, n, trans ? 1 : n, trans ? k : 1, d); }
    return out;
  }, py::arg("b"), py::arg("trans") = false,
     "Pack B (K, N) — or (N, K) when trans — into (ceil(N/16), K, 16) column panels.");

  m.def("gemm_unpack_b", [](const py::array& packed, std::int64_t n, bool trans) {
    if (n < 0) throw py::value_error("gemm_unpack_b: n must be >= 0, received " + str(n));
    auto p = packed_arg(packed, n, "gemm_unpack_b input");
    const std::int64_t k = p.shape(1);
    auto out = trans ? empty({n, k}) : empty({k, n});
    const float* s = p.data();
    float* d = out.mutable_data();
    { py::gil_scoped_release nogil; unpack_b(s, k, n, trans ? 1 : n, trans ? k : 1, d); }
    return out;
  }, py::arg("packed"), py::arg("n"), py::arg("trans") = false,
     "Inverse of gemm_pack_b: (K, N), or (N, K) when trans.");

  m.def("gemm_packed", [](const py::array& a, const py::array& b_packed, std::int64_t n,
                          bool trans_a, float alpha, const py::object& bias, float beta,
                          const py::object& residual, const std::string& act, float lo,
                          float hi) {
    if (n < 0) throw py::value_error("gemm_packed: n must be >= 0, received " + str(n));
    auto pa = f32(a, "gemm_packed A", 2);
    auto pb = packed_arg(b_packed, n, "gemm_packed B");
    const std::int64_t mm = trans_a ? pa.shape(1) : pa.shape(0);
    const std::int64_t k = trans_a ? pa.shape(0) : pa.shape(1);
    if (pb.shape(1) != k)
      throw py::value_error("gemm_packed: A has K=" + str(k) + " but packed B has K=" +
                            str(pb.shape(1)));
    std::vector<FloatArray> keep;
    GemmEpilogue ep = make_epilogue(mm, n, alpha, bias, beta, residual, act, lo, hi, keep);
    auto out = empty({mm, n});
    GemmA ga;
    ga.dense = DenseA{pa.data(), trans_a ? 1 : k, trans_a ? mm : 1};
    const float* bp = pb.data();
    float* c = out.mutable_data();
    { py::gil_scoped_release nogil; gemm_packed(mm, n, k, ga, bp, c, n, ep); }
    return out;
  }, py::arg("a"), py::arg("b_packed"), py::arg("n"), py::arg("trans_a") = false,
     py::arg("alpha") = 1.0f, py::arg("bias") = py::none(), py::arg("beta") = 1.0f,
     py::arg("residual") = py::none(), py::arg("act") = "none", py::arg("lo") = 0.0f,
     py::arg("hi") = 0.0f,
     "act(alpha * A'.B + beta * bias + residual) with B packed by gemm_pack_b; A' = A.T when "
     "trans_a; bias broadcasts to (M, N) (rank <= 2); residual is (M, N).");

  m.def("gemm", [](const py::array& a, const py::array& b, bool trans_a, bool trans_b,
                   float alpha, const py::object& bias, float beta, const std::string& act,
                   float lo, float hi) {
    auto pa = f32(a, "gemm A", 2);
    auto pb = f32(b, "gemm B", 2);
    const std::int64_t mm = trans_a ? pa.shape(1) : pa.shape(0);
    const std::int64_t k = trans_a ? pa.shape(0) : pa.shape(1);
    const std::int64_t kb = trans_b ? pb.shape(1) : pb.shape(0);
    const std::int64_t n = trans_b ? pb.shape(0) : pb.shape(1);
    if (k != kb)
      throw py::value_error("gemm: inner dimensions differ, A' has K=" + str(k) + ", B' has K=" +
                            str(kb));
    std::vector<FloatArray> keep;
    GemmEpilogue ep = make_epilogue(mm, n, alpha, bias, beta, py::none(), act, lo, hi, keep);
    auto out = empty({mm, n});
    const DenseA da{pa.data(), trans_a ? 1 : k, trans_a ? mm : 1};
    const float* bp = pb.data();
    float* c = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      gemm(mm, n, k, da, bp, trans_b ? 1 : n, trans_b ? k : 1, c, n, ep);
    }
    return out;
  }, py::arg("a"), py::arg("b"), py::arg("trans_a") = false, py::arg("trans_b") = false,
     py::arg("alpha") = 1.0f, py::arg("bias") = py::none(), py::arg("beta") = 1.0f,
     py::arg("act") = "none", py::arg("lo") = 0.0f, py::arg("hi") = 0.0f,
     "act(alpha * A'.B' + beta * bias) with B packed per call.");

  m.def("matmul", [](const py::array& a, const py::array& b, bool packed, std::int64_t n_packed) {
    auto pa = f32(a, "matmul A");
    auto pb = f32(b, "matmul B");
    const Shape sa = shape_of(pa), sb = shape_of(pb);
    const std::size_t core_b = packed ? 3 : 2;
    if (sa.size() < 2 || sb.size() < core_b)
      throw py::value_error("matmul: expected A of rank >= 2 and B of rank >= " + str(core_b) +
                            ", received " + shape_str(sa) + " and " + shape_str(sb));
    const std::int64_t mm = sa[sa.size() - 2], k = sa.back();
    std::int64_t n, kb;
    if (packed) {
      n = n_packed;
      if (n < 0 || sb.back() != kGemmNR || sb[sb.size() - 3] != gemm_panels(n))
        throw py::value_error("matmul: expected a packed B of shape (..., " +
                              str(gemm_panels(std::max<std::int64_t>(n, 0))) +
                              ", K, 16) for N=" + str(n) + ", received " + shape_str(sb));
      kb = sb[sb.size() - 2];
    } else {
      kb = sb[sb.size() - 2];
      n = sb.back();
    }
    if (k != kb)
      throw py::value_error("matmul: inner dimensions differ, A " + shape_str(sa) + " has K=" +
                            str(k) + ", B has K=" + str(kb));
    const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - core_b);
    std::vector<std::int64_t> ia, ib;
    Shape out_shape = broadcast_batch(ba, bb, ia, ib);
    const std::int64_t batches = static_cast<std::int64_t>(ia.size());
    out_shape.push_back(mm);
    out_shape.push_back(n);
    auto out = empty(out_shape);
    const float* ap = pa.data();
    const float* bp = pb.data();
    float* c = out.mutable_data();
    const std::int64_t b_size = packed ? packed_b_size(k, n) : k * n;
    bool b_shared = true;
    for (auto o : ib) b_shared = b_shared && o == 0;
    {
      py::gil_scoped_release nogil;
      const GemmEpilogue ep;
      if (b_shared) {
        // one B for every batch: A's batches are consecutive rows of one big GEMM when A is
        // not broadcast itself (it never is here: B has no batch of its own)
        const std::int64_t rows = mm * batches;
        GemmA ga;
        ga.dense = DenseA{ap, k, 1};
        if (packed) {
          gemm_packed(rows, n, k, ga, bp, c, n, ep);
        } else {
          gemm(rows, n, k, ga.dense, bp, n, 1, c, n, ep);
        }
      } else {
        const bool split = batches >= num_threads() && mm * n * k < (1 << 21);
        auto one = [&](std::int64_t t, bool threaded) {
          const float* at = ap + ia[static_cast<std::size_t>(t)] * mm * k;
          const float* bt = bp + ib[static_cast<std::size_t>(t)] * b_size;
          float* ct = c + t * mm * n;
          GemmA ga;
          ga.dense = DenseA{at, k, 1};
          if (packed)
            gemm_packed(mm, n, k, ga, bt, ct, n, ep, threaded);
          else
            gemm(mm, n, k, ga.dense, bt, n, 1, ct, n, ep, threaded);
        };
        if (split)
          parallel_for(batches, [&](std::int64_t t) { one(t, false); });
        else
          for (std::int64_t t = 0; t < batches; ++t) one(t, true);
      }
    }
    return out;
  }, py::arg("a"), py::arg("b"), py::arg("packed") = false, py::arg("n") = -1,
     "Batched A (..., M, K) . B (..., K, N) with numpy batch broadcasting (ranks >= 2); with "
     "packed, B is (..., ceil(N/16), K, 16) from gemm_pack_b and n gives N.");

  m.def("conv_pack_weight", [](const py::array& w, std::int64_t group) {
    auto pw = f32(w, "conv_pack_weight input", 4);
    const std::int64_t mo = pw.shape(0), cg = pw.shape(1), kh = pw.shape(2), kw = pw.shape(3);
    if (group < 1 || mo % group)
      throw py::value_error("conv_pack_weight: group " + str(group) +
                            " must be >= 1 and divide the " + str(mo) + " output channels");
    const std::int64_t mg = mo / group;
    auto out = empty({group, gemm_panels(mg), kh * kw * cg, kGemmNR});
    const float* s = pw.data();
    float* d = out.mutable_data();
    { py::gil_scoped_release nogil; conv_pack_weight(s, mo, cg, kh, kw, group, d); }
    return out;
  }, py::arg("w"), py::arg("group") = 1,
     "Conv weight (M, C/group, KH, KW) -> (group, ceil(M/group/16), KH*KW*C/group, 16).");

  m.def("conv_unpack_weight", [](const py::array& packed, const Shape& shape,
                                 std::int64_t group) {
    if (shape.size() != 4 || group < 1 || shape[0] % group)
      throw py::value_error("conv_unpack_weight: expected a weight shape (M, C/group, KH, KW) "
                            "with M divisible by group, received " + shape_str(shape) +
                            ", group " + str(group));
    const std::int64_t mo = shape[0], cg = shape[1], kh = shape[2], kw = shape[3];
    const std::int64_t mg = mo / group;
    auto pp = f32_shape(packed, "conv_unpack_weight input",
                        {group, gemm_panels(mg), kh * kw * cg, kGemmNR});
    auto out = empty(shape);
    const float* s = pp.data();
    float* d = out.mutable_data();
    { py::gil_scoped_release nogil; conv_unpack_weight(s, mo, cg, kh, kw, group, d); }
    return out;
  }, py::arg("packed"), py::arg("shape"), py::arg("group") = 1,
     "Inverse of conv_pack_weight.");

  m.def("conv_nhwc", [](const py::array& x, const py::array& w_packed, std::int64_t mo,
                        const Shape& kernel, const Shape& strides, const Shape& dilations,
                        const Shape& pads, std::int64_t group, const py::object& bias,
                        const py::object& residual, const std::string& act, float lo,
                        float hi) {
    auto px = f32(x, "conv_nhwc input", 4);
    const ConvArgs ca = conv_args(px, mo, kernel, strides, dilations, pads, group);
    const ConvGeom& g = ca.g;
    const std::int64_t cg = g.c / g.group, mg = g.m / g.group;
    auto pw = f32_shape(w_packed, "conv_nhwc packed weight",
                        {g.group, gemm_panels(mg), g.kh * g.kw * cg, kGemmNR});
    const Shape ys{g.n, g.oh, g.ow, g.m};
    std::vector<FloatArray> keep;
    const float* bp = optional_vec(bias, g.m, "conv_nhwc bias", keep);
    const float* rp = optional_like(residual, ys, "conv_nhwc residual", keep);
    const Activation a = activation_of(act);
    auto out = empty(ys);
    const float* xs = px.data();
    const float* ws = pw.data();
    float* y = out.mutable_data();
    { py::gil_scoped_release nogil; conv_nhwc(g, xs, ws, y, bp, rp, a, lo, hi); }
    return out;
  }, py::arg("x"), py::arg("w_packed"), py::arg("m"), py::arg("kernel"), py::arg("strides"),
     py::arg("dilations"), py::arg("pads"), py::arg("group") = 1, py::arg("bias") = py::none(),
     py::arg("residual") = py::none(), py::arg("act") = "none", py::arg("lo") = 0.0f,
     py::arg("hi") = 0.0f,
     "2-D Conv over nhwc x (N, H, W, C) with a weight from conv_pack_weight; pads are (top, "
     "left, bottom, right); y = act(conv + bias + residual), nhwc.");

  m.def("conv_nhwc_depthwise", [](const py::array& x, const py::array& w_hwc,
                                  const Shape& strides, const Shape& dilations, const Shape& pads,
                                  const py::object& bias, const py::object& residual,
                                  const std::string& act, float lo, float hi) {
    auto px = f32(x, "conv_nhwc_depthwise input", 4);
    auto pw = f32(w_hwc, "conv_nhwc_depthwise weight", 3);
    const std::int64_t c = px.shape(3);
    if (pw.shape(2) != c)
      throw py::value_error("conv_nhwc_depthwise: weight must be (KH, KW, " + str(c) +
                            "), received " + shape_str(pw));
    const ConvArgs ca =
        conv_args(px, c, {pw.shape(0), pw.shape(1)}, strides, dilations, pads, c);
    const ConvGeom& g = ca.g;
    const Shape ys{g.n, g.oh, g.ow, g.m};
    std::vector<FloatArray> keep;
    const float* bp = optional_vec(bias, g.m, "conv_nhwc_depthwise bias", keep);
    const float* rp = optional_like(residual, ys, "conv_nhwc_depthwise residual", keep);
    const Activation a = activation_of(act);
    auto out = empty(ys);
    const float* xs = px.data();
    const float* ws = pw.data();
    float* y = out.mutable_data();
    { py::gil_scoped_release nogil; conv_nhwc_depthwise(g, xs, ws, y, bp, rp, a, lo, hi); }
    return out;
  }, py::arg("x"), py::arg("w_hwc"), py::arg("strides"), py::arg("dilations"), py::arg("pads"),
     py::arg("bias") = py::none(), py::arg("residual") = py::none(), py::arg("act") = "none",
     py::arg("lo") = 0.0f, py::arg("hi") = 0.0f,
     "Depthwise 2-D Conv (group == C == M) over nhwc x with the weight as (KH, KW, C).");

  m.def("conv_nchw_1x1", [](const py::array& x, const py::array& w, const py::object& bias,
                            const py::object& residual, const std::string& act, float lo,
                            float hi) {
    auto px = f32(x, "conv_nchw_1x1 input", 4);
    auto pw = f32(w, "conv_nchw_1x1 weight", 2);
    const std::int64_t n = px.shape(0), c = px.shape(1), hw = px.shape(2) * px.shape(3);
    const std::int64_t mo = pw.shape(0);
    if (pw.shape(1) != c)
      throw py::value_error("conv_nchw_1x1: weight must be (M, " + str(c) + "), received " +
                            shape_str(pw));
    std::vector<FloatArray> keep;
    const float* bp = optional_vec(bias, mo, "conv_nchw_1x1 bias", keep);
    const Shape ys{n, mo, px.shape(2), px.shape(3)};
    const float* rp = optional_like(residual, ys, "conv_nchw_1x1 residual", keep);
    const Activation a = activation_of(act);
    auto out = empty(ys);
    const float* xs = px.data();
    const float* ws = pw.data();
    float* y = out.mutable_data();
    { py::gil_scoped_release nogil; conv_nchw_1x1(n, c, hw, mo, xs, ws, y, bp, rp, a, lo, hi); }
    return out;
  }, py::arg("x"), py::arg("w"), py::arg("bias") = py::none(),
     py::arg("residual") = py::none(), py::arg("act") = "none",
     py::arg("lo") = 0.0f, py::arg("hi") = 0.0f,
     "1x1 Conv (stride 1, no padding, group 1) in nchw: Y[b] = act(W (M, C) . X[b] (C, H*W) + "
     "bias + residual[b]).");
}

}  // namespace opd::bindings
