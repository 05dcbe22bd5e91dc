// Packed single-precision GEMM and the convolutions built on it (channels-last "nhwc").
//
// C (m x n, leading dimension ldc) = epilogue(A (m x k) . B (k x n)).
//
// B is packed ONCE (constant weights) into column panels of kGemmNR = 16 columns: panel p holds
// columns [16p, 16p + 16) as k rows of 16 contiguous floats, columns past n are zero. The panel
// width is the same for every instruction set, so a packed weight stays valid when the active
// ISA changes. A is packed per call, in MR-row panels whose height depends on the ISA (6 for
// AVX2, 14 for AVX-512, 3 for the portable build), block by block (KC columns x MC rows), from
// either a dense matrix with arbitrary strides (transposes are free) or an nhwc image read as its
// implicit im2col matrix (no im2col buffer). Work is split over threads by blocks of C.
#pragma once

#include <cstdint>

#include "opdispatch/isa.h"

namespace opd {

// Column panel width of packed B (every ISA).
constexpr std::int64_t kGemmNR = 16;

// Number of 16-column panels for n columns.
inline std::int64_t gemm_panels(std::int64_t n) { return (n + kGemmNR - 1) / kGemmNR; }

// Floats in a packed B of k rows and n columns: panels * k * 16.
inline std::int64_t packed_b_size(std::int64_t k, std::int64_t n) {
  return gemm_panels(n) * k * kGemmNR;
}

// Packs B (k x n; element (r, j) at b[r * rs + j * cs]) into `dst` (packed_b_size floats).
// rs = n, cs = 1 for a row-major (k, n) matrix; rs = 1, cs = k for a row-major (n, k) one
// (i.e. B transposed). Runs on the kernels' threads.
void pack_b(const float* b, std::int64_t k, std::int64_t n, std::int64_t rs, std::int64_t cs,
            float* dst);

// Inverse of pack_b: writes B's element (r, j) to dst[r * rs + j * cs].
void unpack_b(const float* packed, std::int64_t k, std::int64_t n, std::int64_t rs,
              std::int64_t cs, float* dst);

enum class Activation { none = 0, relu = 1, clip = 2 };

// What the write-back of C applies, in this order:
//   v = alpha * (A.B)[i, j]
//   v += beta * bias[i * bias_rs + j * bias_cs]     (when bias; strides 0 broadcast)
//   v += residual[i * residual_ld + j]              (when residual)
//   v = relu(v) or clip(v, lo, hi)                  (act)
struct GemmEpilogue {
  float alpha = 1.0f;
  const float* bias = nullptr;
  std::int64_t bias_rs = 0;
  std::int64_t bias_cs = 0;
  float beta = 1.0f;
  const float* residual = nullptr;
  std::int64_t residual_ld = 0;
  Activation act = Activation::none;
  float lo = 0.0f;
  float hi = 0.0f;

  bool trivial() const {
    return alpha == 1.0f && bias == nullptr && residual == nullptr && act == Activation::none;
  }
};

// A dense A operand: element (i, r) at a[i * rs + r * cs] (rs = k, cs = 1 when row-major;
// rs = 1, cs = m for a row-major (k, m) A, i.e. transA).
struct DenseA {
  const float* a = nullptr;
  std::int64_t rs = 0;
  std::int64_t cs = 0;
};

// A convolution's implicit im2col matrix over an nhwc input x (n, h, w, c):
// row i = output pixel (b, oy, ox) of an (n, oh, ow) grid; column r = (ky * kw + kx) * cg + ch
// reads x[b, oy * sh - pt + ky * dh, ox * sw - pl + kx * dw, c0 + ch], or 0 outside the image.
struct ConvA {
  const float* x = nullptr;
  std::int64_t n = 0, h = 0, w = 0, c = 0;     // input (physical nhwc)
  std::int64_t oh = 0, ow = 0;                 // output grid
  std::int64_t kh = 1, kw = 1;                 // kernel
  std::int64_t sh = 1, sw = 1, dh = 1, dw = 1; // strides, dilations
  std::int64_t pt = 0, pl = 0;                 // padding before (top, left)
  std::int64_t c0 = 0, cg = 0;                 // first channel and channel count (group)
  // every tap is inside x (x is already padded), dw == 1 and cg == c: the kw taps of a kernel
  // row are then kw * c contiguous floats, read as one run
  bool rows_contiguous = false;
};

// The A operand of one GEMM: dense or a convolution's implicit im2col.
struct GemmA {
  enum class Kind { dense = 0, conv_nhwc = 1 } kind = Kind::dense;
  DenseA dense;
  ConvA conv;
};

// One GEMM over a packed B; see the file comment. b_packed holds packed_b_size(k, n) floats.
// threaded = false runs on the calling thread only (callers that parallelise over batches).
void gemm_packed(std::int64_t m, std::int64_t n, std::int64_t k, const GemmA& a,
                 const float* b_packed, float* c, std::int64_t ldc, const GemmEpilogue& ep,
                 bool threaded = true);

// Convenience: dense A and unpacked B (element (r, j) at b[r * b_rs + j * b_cs]); B is packed
// into a temporary buffer first.
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const DenseA& a, const float* b,
          std::int64_t b_rs, std::int64_t b_cs, float* c, std::int64_t ldc,
          const GemmEpilogue& ep, bool threaded = true);

// Geometry of a 2-D convolution (ONNX Conv, pads already resolved from auto_pad).
struct ConvGeom {
  std::int64_t n = 0, h = 0, w = 0, c = 0;  // input
  std::int64_t m = 0;                       // output channels
  std::int64_t oh = 0, ow = 0;              // output spatial size
  std::int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0;
  std::int64_t group = 1;
};

// Throws std::invalid_argument when the geometry is inconsistent (sizes, group divisibility,
// output size not matching the ONNX formula for the given pads).
void check_conv_geom(const ConvGeom& g, std::int64_t pb, std::int64_t pr);

// Packs a Conv weight (m, c / group, kh, kw) for conv_nhwc: per group, B_g is the
// (kh * kw * cg) x (m / group) matrix with row (ky * kw + kx) * cg + ch and column oc, packed
// with pack_b; groups are consecutive, each packed_b_size(kh * kw * cg, m / group) floats.
std::int64_t conv_packed_size(std::int64_t m, std::int64_t cg, std::int64_t kh, std::int64_t kw,
                              std::int64_t group);
void conv_pack_weight(const float* w, std::int64_t m, std::int64_t cg, std::int64_t kh,
                      std::int64_t kw, std::int64_t group, float* dst);
// Inverse of conv_pack_weight (back to (m, cg, kh, kw)).
void conv_unpack_weight(const float* packed, std::int64_t m, std::int64_t cg, std::int64_t kh,
                        std::int64_t kw, std::int64_t group, float* dst);

// Conv over nhwc x (n, h, w, c) into nhwc y (n, oh, ow, m) through the packed GEMM (one GEMM
// per group over the implicit im2col matrix; a 1x1 stride-1 unpadded conv reads x directly).
// Epilogue: per-channel bias, then residual (nhwc, the shape of y), then the activation; the
// epilogue's bias / residual pointers are per output channel / per y element.
void conv_nhwc(const ConvGeom& g, const float* x, const float* w_packed, float* y,
               const float* bias, const float* residual, Activation act, float lo, float hi);

// Depthwise conv (group == c == m) over nhwc x; w_hwc is the weight as (kh, kw, c).
void conv_nhwc_depthwise(const ConvGeom& g, const float* x, const float* w_hwc, float* y,
                         const float* bias, const float* residual, Activation act, float lo,
                         float hi);

// Conv 1x1 (stride 1, no padding, group 1) in the standard nchw layout: per image,
// Y[b] (m, h*w) = act(W (m, c) . X[b] (c, h*w) + bias[m] + residual[b]).
void conv_nchw_1x1(std::int64_t n, std::int64_t c, std::int64_t hw, std::int64_t m,
                   const float* x, const float* w, float* y, const float* bias,
                   const float* residual, Activation act, float lo, float hi);

namespace gemm_detail {

// A block of C for one task: rows [m0, m1), columns [n0, n1) (n0 a multiple of 16), all of K.
struct GemmProblem {
  std::int64_t m = 0, n = 0, k = 0;
  GemmA a;
  const float* b = nullptr;  // packed
  float* c = nullptr;
  std::int64_t ldc = 0;
  GemmEpilogue ep;
  std::int64_t kc = 256;     // K block
};

}  // namespace gemm_detail

// Per-ISA kernels (native/src/isa/gemm_packed.cpp, native/src/isa/conv_nhwc.cpp).
OPD_DECLARE_FOR_EACH_ISA(int gemm_mr())
OPD_DECLARE_FOR_EACH_ISA(void gemm_block(const gemm_detail::GemmProblem& p, std::int64_t m0,
                                         std::int64_t m1, std::int64_t n0, std::int64_t n1))
OPD_DECLARE_FOR_EACH_ISA(void depthwise_nhwc_rows(const ConvGeom& g, const float* x,
                                                  const float* w_hwc, float* y,
                                                  const float* bias, const float* residual,
                                                  Activation act, float lo, float hi,
                                                  std::int64_t row0, std::int64_t row1))

}  // namespace opd
