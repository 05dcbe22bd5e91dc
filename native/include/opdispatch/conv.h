// 2-D convolutions in the blocked activation layouts nchw8c / nchw16c (float32).
//
// Activations: physical (N, ceil(C/B), H, W, B), channels past C zero (see layouts.h). Every
// kernel here writes whole output blocks and keeps the channels past M zero.
//
// Weight formats (W logical (M, C/group, KH, KW), packed once by the caller):
//   blocked    "OIhw{B}i{B}o": (ceil(M/B), ceil(Cg/B), KH, KW, B_in, B_out), zero-padded. Also
//              serves grouped convolutions whose per-group channel counts are multiples of B.
//   depthwise  "Goihw{B}g":    (ceil(M/B), KH, KW, B) for group == C == M.
//   first      "Oihw{B}o":     (ceil(M/B), C, KH, KW, B): the first-layer kernel that reads a
//              standard (nchw) input with few channels and writes nchw{B}c.
//   grouped    (any group): (ceil(M/B), nib, KH, KW, B, B) plus, per output block, the first
//              input block it reads (pack_grouped_weight); cross-group weights are zero.
//
// Epilogue (fused in every kernel): y = clamp(conv(x) + bias [+ residual], lo, hi), where the
// residual is a tensor of the output's physical shape (the other input of a fused Add) and
// clamp is skipped when lo = -inf and hi = +inf.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace opd {

// Geometry of one 2-D convolution, logical sizes, pads explicit (auto_pad resolved by the
// caller): pt/pl = pad at the beginning of H/W, pb/pr = at the end.
struct Conv2dShape {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input
  std::int64_t m = 0;                       // output channels
  std::int64_t kh = 1, kw = 1;
  std::int64_t sh = 1, sw = 1, dh = 1, dw = 1;
  std::int64_t pt = 0, pl = 0, pb = 0, pr = 0;
  std::int64_t group = 1;

  std::int64_t oh() const { return (h + pt + pb - (kh - 1) * dh - 1) / sh + 1; }
  std::int64_t ow() const { return (w + pl + pr - (kw - 1) * dw - 1) / sw + 1; }
};

// Throws std::invalid_argument (naming the bad value) when `s` is not a valid convolution
// with at least one output pixel.
void validate_conv(const Conv2dShape& s);

struct ConvEpilogue {
  const float* bias = nullptr;      // (M,) or null
  const float* residual = nullptr;  // output's physical shape, same layout, or null
  float lo = -std::numeric_limits<float>::infinity();
  float hi = std::numeric_limits<float>::infinity();
};

enum class WeightFormat { blocked = 0, depthwise = 1, first = 2 };

// Parses "blocked", "depthwise", "first"; throws std::invalid_argument otherwise.
WeightFormat weight_format_from_name(const char* name);

// Physical shape of a packed weight of logical shape `w` = (M, Cg, KH, KW).
std::vector<std::int64_t> packed_weight_shape(WeightFormat f, const std::int64_t w[4], int block);

// Logical (M, Cg, KH, KW) -> packed format (every element of `out` written) and back.
void pack_weight(WeightFormat f, const float* w, const std::int64_t shape[4], int block,
                 float* out);
void unpack_weight(WeightFormat f, const float* packed, const std::int64_t shape[4], int block,
                   float* out);

// The general grouped packing (see the header comment): number of input blocks each output
// block reads, and the packing itself (`ib_start` gets ceil(M/B) entries).
std::int64_t grouped_input_blocks(std::int64_t c, std::int64_t m, std::int64_t group, int block);
void pack_grouped_weight(const float* w, const std::int64_t shape[4], std::int64_t c,
                         std::int64_t group, int block, float* out, std::int64_t* ib_start);

// Direct blocked convolution: x (N, ceil(C/B), H, W, B) -> y (N, ceil(M/B), OH, OW, B) with a
// "blocked" weight (group == 1 or per-group channels multiples of B; ib_start null), or a
// "grouped" packing (ib_start, nib from pack_grouped_weight). 1x1 kernels run as a GEMM.
void conv2d_blocked(const Conv2dShape& s, int block, const float* x, const float* w,
                    const std::int64_t* ib_start, std::int64_t nib, const ConvEpilogue& ep,
                    float* y);

// Depthwise (group == C == M) blocked convolution with a "depthwise" weight.
void conv2d_depthwise_blocked(const Conv2dShape& s, int block, const float* x, const float* w,
                              const ConvEpilogue& ep, float* y);

// First-layer convolution (group 1): x standard (N, C, H, W) -> y nchw{B}c, "first" weight.
void conv2d_first_blocked(const Conv2dShape& s, int block, const float* x, const float* w,
                          const ConvEpilogue& ep, float* y);

}  // namespace opd

// ---- internal: the interface between conv.cpp (validation, packing, dispatch) and the kernels
// compiled once per instruction set (native/src/isa/conv_blocked.cpp) ------------------------
namespace opd::conv_detail {

// One kernel run, in physical terms. `x` has `xblocks` blocks of `bi` channels (bi = block for
// blocked input, 1 for the first-layer kernel's nchw input); pads/sizes are those of `x` (the
// caller may have zero-padded it already). bias/lo/hi hold ob*block floats (channels past M:
// bias 0, lo = hi = 0); lo/hi null: no clamp.
struct KernelArgs {
  std::int64_t n = 0, xblocks = 0, ih = 0, iw = 0;
  std::int64_t ob = 0, oh = 0, ow = 0;
  std::int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0;
  int block = 16, bi = 16;
  const float* x = nullptr;
  const float* w = nullptr;
  const std::int64_t* ib_start = nullptr;  // per output block (grouped), or null: 0 (group 1)
  std::int64_t nib = 0;                    // input blocks each output block reads
  const float* bias = nullptr;
  const float* lo = nullptr;
  const float* hi = nullptr;
  const float* residual = nullptr;
  float* y = nullptr;
};

}  // namespace opd::conv_detail
