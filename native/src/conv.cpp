// Convolutions in the blocked layouts: parameter validation, weight packing and dispatch to the
// kernels compiled per instruction set (native/src/isa/conv_blocked.cpp). See opdispatch/conv.h.
#include "opdispatch/conv.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "opdispatch/isa.h"
#include "opdispatch/parallel.h"

namespace opd {

OPD_DECLARE_FOR_EACH_ISA(void conv_direct_kernel(const conv_detail::KernelArgs& a))
OPD_DECLARE_FOR_EACH_ISA(void conv_depthwise_kernel(const conv_detail::KernelArgs& a))

namespace {

using conv_detail::KernelArgs;
using i64 = std::int64_t;

i64 blocks(i64 c, i64 b) { return (c + b - 1) / b; }

void check_block(int block) {
  if (block != 8 && block != 16)
    throw std::invalid_argument("conv: block must be 8 or 16, received " + std::to_string(block));
}

void require(bool ok, const std::string& what, i64 value, const char* expected) {
  if (!ok)
    throw std::invalid_argument("conv: " + what + " must be " + expected + ", received " +
                                std::to_string(value));
}

// Per-channel epilogue vectors of ob*block floats; channels past M get bias 0 and lo = hi = 0
// so the padding of the output stays zero whatever the clamp.
struct EpilogueVectors {
  std::vector<float> bias, lo, hi;
  bool clamp = false;

  EpilogueVectors(const ConvEpilogue& ep, i64 m, i64 ob, int block)
      : bias(static_cast<std::size_t>(ob * block), 0.0f) {
    if (ep.bias) std::copy(ep.bias, ep.bias + m, bias.begin());
    clamp = !(ep.lo == -std::numeric_limits<float>::infinity() &&
              ep.hi == std::numeric_limits<float>::infinity());
    if (clamp) {
      if (!(ep.lo <= ep.hi))
        throw std::invalid_argument("conv: clamp bounds must satisfy lo <= hi, received lo=" +
                                    std::to_string(ep.lo) + " hi=" + std::to_string(ep.hi));
      lo.assign(bias.size(), 0.0f);
      hi.assign(bias.size(), 0.0f);
      std::fill(lo.begin(), lo.begin() + m, ep.lo);
      std::fill(hi.begin(), hi.begin() + m, ep.hi);
    }
  }

  void apply(KernelArgs& a) const {
    a.bias = bias.data();
    a.lo = clamp ? lo.data() : nullptr;
    a.hi = clamp ? hi.data() : nullptr;
  }
};

KernelArgs base_args(const Conv2dShape& s, int block, int bi, const float* x, const float* w,
                     const ConvEpilogue& ep, float* y) {
  KernelArgs a;
  a.n = s.n;
  a.xblocks = bi == 1 ? s.c : blocks(s.c, block);
  a.ih = s.h;
  a.iw = s.w;
  a.ob = blocks(s.m, block);
  a.oh = s.oh();
  a.ow = s.ow();
  a.kh = s.kh;
  a.kw = s.kw;
  a.sh = s.sh;
  a.sw = s.sw;
  a.dh = s.dh;
  a.dw = s.dw;
  a.pt = s.pt;
  a.pl = s.pl;
  a.block = block;
  a.bi = bi;
  a.x = x;
  a.w = w;
  a.residual = ep.residual;
  a.y = y;
  return a;
}

// Output columns whose taps are not all inside the input (run one pixel at a time).
i64 border_columns(const KernelArgs& a) {
  i64 e = 0;
  for (i64 ow = 0; ow < a.ow; ++ow) {
    const i64 i0 = ow * a.sw - a.pl;
    if (i0 < 0 || i0 + (a.kw - 1) * a.dw > a.iw - 1) ++e;
  }
  return e;
}

// Copies x into `buf` with its zero padding (pt/pb rows, pl/pr columns) and points `a` at it,
// when the border columns, which run one pixel at a time, would cost more than the copy.
void maybe_pad_input(KernelArgs& a, i64 pb, i64 pr, std::vector<float>& buf) {
  if (a.kw == 1 || (a.pl == 0 && pr == 0)) return;
  const i64 border = border_columns(a);
  if (border * 16 <= a.ow) return;  // few border pixels: the per-pixel path is cheaper
  const i64 hp = a.ih + a.pt + pb, wp = a.iw + a.pl + pr, planes = a.n * a.xblocks, bi = a.bi;
  buf.assign(static_cast<std::size_t>(planes * hp * wp * bi), 0.0f);
  const float* src = a.x;
  float* dst = buf.data();
  const i64 h = a.ih, w = a.iw, pl = a.pl, pt = a.pt;
  parallel_chunks(planes * h, 64, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const i64 plane = r / h, y = r % h;
      std::memcpy(dst + ((plane * hp + pt + y) * wp + pl) * bi, src + r * w * bi,
                  static_cast<std::size_t>(w * bi) * sizeof(float));
    }
  });
  a.x = buf.data();
  a.ih = hp;
  a.iw = wp;
  a.pt = a.pl = 0;
}

// A 1x1 unpadded convolution with strides: gathers the pixels it reads into `buf` (N, blocks,
// OH, OW, B) and turns `a` into a stride-1 GEMM over the flattened spatial axis.
void gather_strided_1x1(KernelArgs& a, std::vector<float>& buf) {
  const i64 planes = a.n * a.xblocks, oh = a.oh, ow = a.ow, b = a.bi;
  buf.resize(static_cast<std::size_t>(planes * oh * ow * b));
  const float* src = a.x;
  float* dst = buf.data();
  const i64 ih = a.ih, iw = a.iw, sh = a.sh, sw = a.sw;
  parallel_chunks(planes * oh, 16, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const i64 plane = r / oh, y = r % oh;
      const float* s = src + (plane * ih + y * sh) * iw * b;
      float* d = dst + r * ow * b;
      for (i64 x = 0; x < ow; ++x)
        std::memcpy(d + x * b, s + x * sw * b, static_cast<std::size_t>(b) * sizeof(float));
    }
  });
  a.x = buf.data();
  a.ih = a.oh = 1;
  a.iw = a.ow = oh * ow;
  a.sh = a.sw = 1;
}

}  // namespace

void validate_conv(const Conv2dShape& s) {
  require(s.n >= 0, "batch N", s.n, ">= 0");
  require(s.c >= 1, "input channels C", s.c, ">= 1");
  require(s.h >= 1 && s.w >= 1, "input height/width", std::min(s.h, s.w), ">= 1");
  require(s.m >= 1, "output channels M", s.m, ">= 1");
  require(s.kh >= 1 && s.kw >= 1, "kernel size", std::min(s.kh, s.kw), ">= 1");
  require(s.sh >= 1 && s.sw >= 1, "stride", std::min(s.sh, s.sw), ">= 1");
  require(s.dh >= 1 && s.dw >= 1, "dilation", std::min(s.dh, s.dw), ">= 1");
  require(std::min({s.pt, s.pl, s.pb, s.pr}) >= 0, "pad", std::min({s.pt, s.pl, s.pb, s.pr}),
          ">= 0");
  require(s.group >= 1, "group", s.group, ">= 1");
  require(s.c % s.group == 0, "C (" + std::to_string(s.c) + ") modulo group", s.c % s.group, "0");
  require(s.m % s.group == 0, "M (" + std::to_string(s.m) + ") modulo group", s.m % s.group, "0");
  require(s.oh() >= 1, "output height", s.oh(), ">= 1 (kernel larger than the padded input)");
  require(s.ow() >= 1, "output width", s.ow(), ">= 1 (kernel larger than the padded input)");
}

WeightFormat weight_format_from_name(const char* name) {
  const std::string n = name;
  if (n == "blocked") return WeightFormat::blocked;
  if (n == "depthwise") return WeightFormat::depthwise;
  if (n == "first") return WeightFormat::first;
  throw std::invalid_argument("unknown conv weight format '" + n +
                              "'; known: blocked, depthwise, first");
}

std::vector<i64> packed_weight_shape(WeightFormat f, const i64 w[4], int block) {
  check_block(block);
  const i64 ob = blocks(w[0], block);
  switch (f) {
    case WeightFormat::blocked: return {ob, blocks(w[1], block), w[2], w[3], block, block};
    case WeightFormat::depthwise:
      require(w[1] == 1, "a depthwise weight's second dimension", w[1], "1");
      return {ob, w[2], w[3], block};
    default: return {ob, w[1], w[2], w[3], block};
  }
}

// Runs fn(o) for every output block o, on the threads only when there is enough to pack.
template <class Fn>
static void for_blocks(i64 ob, i64 floats_per_block, Fn&& fn) {
  const i64 grain = std::max<i64>(1, (i64{1} << 16) / std::max<i64>(1, floats_per_block));
  parallel_chunks(ob, grain, [&](i64 b, i64 e) {
    for (i64 o = b; o < e; ++o) fn(o);
  });
}

// Visits every (packed index, logical index or -1) pair of format `f`.
template <class Fn>
static void for_each_packed(WeightFormat f, const i64 s[4], int block, Fn&& fn) {
  const i64 m = s[0], cg = s[1], kk = s[2] * s[3], ob = blocks(m, block);
  const i64 b = block;
  if (f == WeightFormat::blocked) {
    const i64 ib = blocks(cg, block);
    for_blocks(ob, ib * kk * b * b, [&](i64 o) {
      for (i64 i = 0; i < ib; ++i)
        for (i64 k = 0; k < kk; ++k)
          for (i64 ic = 0; ic < b; ++ic)
            for (i64 oc = 0; oc < b; ++oc) {
              const i64 p = (((o * ib + i) * kk + k) * b + ic) * b + oc;
              const i64 mo = o * b + oc, ci = i * b + ic;
              fn(p, mo < m && ci < cg ? (mo * cg + ci) * kk + k : -1);
            }
    });
  } else if (f == WeightFormat::depthwise) {
    for_blocks(ob, kk * b, [&](i64 o) {
      for (i64 k = 0; k < kk; ++k)
        for (i64 oc = 0; oc < b; ++oc) {
          const i64 mo = o * b + oc;
          fn((o * kk + k) * b + oc, mo < m ? mo * kk + k : -1);
        }
    });
  } else {
    for_blocks(ob, cg * kk * b, [&](i64 o) {
      for (i64 ci = 0; ci < cg; ++ci)
        for (i64 k = 0; k < kk; ++k)
          for (i64 oc = 0; oc < b; ++oc) {
            const i64 mo = o * b + oc;
            fn(((o * cg + ci) * kk + k) * b + oc, mo < m ? (mo * cg + ci) * kk + k : -1);
          }
    });
  }
}

void pack_weight(WeightFormat f, const float* w, const i64 shape[4], int block, float* out) {
  packed_weight_shape(f, shape, block);  // validates
  for_each_packed(f, shape, block, [&](i64 p, i64 l) { out[p] = l >= 0 ? w[l] : 0.0f; });
}

void unpack_weight(WeightFormat f, const float* packed, const i64 shape[4], int block,
                   float* out) {
  packed_weight_shape(f, shape, block);
  for_each_packed(f, shape, block, [&](i64 p, i64 l) {
    if (l >= 0) out[l] = packed[p];
  });
}

// Input-block range [lo, hi) read by output block `o` of a grouped convolution.
static void grouped_range(i64 o, i64 c, i64 m, i64 group, int block, i64& lo, i64& hi) {
  const i64 cg = c / group, mg = m / group;
  const i64 m0 = o * block, m1 = std::min(m, m0 + block) - 1;
  const i64 c0 = (m0 / mg) * cg, c1 = (m1 / mg + 1) * cg;
  lo = c0 / block;
  hi = blocks(c1, block);
}

i64 grouped_input_blocks(i64 c, i64 m, i64 group, int block) {
  check_block(block);
  require(group >= 1 && c % group == 0 && m % group == 0, "group (dividing C and M)", group,
          "a divisor of C and M");
  i64 nib = 1;
  for (i64 o = 0; o < blocks(m, block); ++o) {
    i64 lo, hi;
    grouped_range(o, c, m, group, block, lo, hi);
    nib = std::max(nib, hi - lo);
  }
  return nib;
}

void pack_grouped_weight(const float* w, const i64 shape[4], i64 c, i64 group, int block,
                         float* out, i64* ib_start) {
  const i64 m = shape[0], cg = shape[1], kk = shape[2] * shape[3];
  require(cg * group == c, "W's input channels x group", cg * group, "C");
  const i64 nib = grouped_input_blocks(c, m, group, block), ob = blocks(m, block);
  const i64 cb = blocks(c, block), mg = m / group, b = block;
  for (i64 o = 0; o < ob; ++o) {
    i64 lo, hi;
    grouped_range(o, c, m, group, block, lo, hi);
    ib_start[o] = std::min(lo, cb - nib);
  }
  for_blocks(ob, nib * kk * b * b, [&](i64 o) {
    for (i64 i = 0; i < nib; ++i)
      for (i64 k = 0; k < kk; ++k)
        for (i64 ic = 0; ic < b; ++ic)
          for (i64 oc = 0; oc < b; ++oc) {
            const i64 mo = o * b + oc, ci = (ib_start[o] + i) * b + ic;
            float v = 0.0f;
            if (mo < m && ci < c && ci / cg == mo / mg)
              v = w[(mo * cg + (ci - (mo / mg) * cg)) * kk + k];
            out[(((o * nib + i) * kk + k) * b + ic) * b + oc] = v;
          }
  });
}

void conv2d_blocked(const Conv2dShape& s, int block, const float* x, const float* w,
                    const i64* ib_start, i64 nib, const ConvEpilogue& ep, float* y) {
  validate_conv(s);
  check_block(block);
  KernelArgs a = base_args(s, block, block, x, w, ep, y);
  std::vector<i64> starts;
  if (ib_start) {
    require(nib >= 1 && nib <= a.xblocks, "input blocks per output block", nib,
            "in [1, ceil(C/B)]");
    for (i64 o = 0; o < a.ob; ++o)
      require(ib_start[o] >= 0 && ib_start[o] + nib <= a.xblocks, "a grouped input block start",
              ib_start[o], "inside the input");
  } else {
    const i64 cg = s.c / s.group, mg = s.m / s.group;
    require(nib == blocks(cg, block), "input blocks of the blocked weight", nib, "ceil(C/group/B)");
    if (s.group > 1) {
      if (cg % block || mg % block)
        throw std::invalid_argument(
            "conv: the blocked weight format serves groups whose channel counts are multiples of "
            "the block (" + std::to_string(block) + "); received " + std::to_string(cg) +
            " input and " + std::to_string(mg) + " output channels per group (use the grouped "
            "packing)");
      starts.resize(static_cast<std::size_t>(a.ob));
      for (i64 o = 0; o < a.ob; ++o) starts[o] = (o * block / mg) * (cg / block);
      ib_start = starts.data();
    }
  }
  a.ib_start = ib_start;
  a.nib = nib;
  std::vector<float> copy;
  if (s.kh == 1 && s.kw == 1 && s.pt + s.pl + s.pb + s.pr == 0) {
    if (s.sh == 1 && s.sw == 1) {  // 1x1: a GEMM over the flattened spatial axis
      a.iw = a.ow = s.h * s.w;
      a.ih = a.oh = 1;
    } else {
      gather_strided_1x1(a, copy);
    }
  }
  EpilogueVectors ev(ep, s.m, a.ob, block);
  ev.apply(a);
  maybe_pad_input(a, s.pb, s.pr, copy);
  OPD_ISA_CALL(conv_direct_kernel, a);
}

void conv2d_depthwise_blocked(const Conv2dShape& s, int block, const float* x, const float* w,
                              const ConvEpilogue& ep, float* y) {
  validate_conv(s);
  check_block(block);
  if (!(s.group == s.c && s.m == s.c))
    throw std::invalid_argument("conv: the depthwise kernel needs group == C == M, received group=" +
                                std::to_string(s.group) + " C=" + std::to_string(s.c) +
                                " M=" + std::to_string(s.m));
  KernelArgs a = base_args(s, block, block, x, w, ep, y);
  EpilogueVectors ev(ep, s.m, a.ob, block);
  ev.apply(a);
  OPD_ISA_CALL(conv_depthwise_kernel, a);
}

void conv2d_first_blocked(const Conv2dShape& s, int block, const float* x, const float* w,
                          const ConvEpilogue& ep, float* y) {
  validate_conv(s);
  check_block(block);
  require(s.group == 1, "group of the first-layer kernel", s.group, "1");
  KernelArgs a = base_args(s, block, 1, x, w, ep, y);
  a.nib = s.c;
  EpilogueVectors ev(ep, s.m, a.ob, block);
  ev.apply(a);
  std::vector<float> padded;
  maybe_pad_input(a, s.pb, s.pr, padded);
  OPD_ISA_CALL(conv_direct_kernel, a);
}

}  // namespace opd
