// Per-ISA depthwise convolution in the channels-last layout (see opdispatch/gemm.h).
//
// y[b, oy, ox, ch] = act(bias[ch] + sum_{ky, kx} x[b, iy, ix, ch] * w[ky, kx, ch] (+ residual))
// with iy = oy * sh - pt + ky * dh, ix = ox * sw - pl + kx * dw (taps outside the image skipped).
// Channels are contiguous in nhwc, so each output pixel is a few vectors of channels. Pixels
// whose taps all fall inside the image along x (the interior of a row) share one list of tap
// offsets and go in pairs, so each weight vector loaded serves two pixels; border pixels build
// their own list of taps in bounds. Channels go by blocks of 4 vectors, then single vectors,
// then scalars.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "opdispatch/gemm.h"
#include "opdispatch/vec.h"

namespace opd {
namespace OPD_ISA {
namespace {

#if defined(__AVX512F__)
typedef v16f V;
constexpr int kW = 16;
#elif defined(__AVX2__)
typedef v8f V;
constexpr int kW = 8;
#else
typedef float v4f __attribute__((vector_size(16)));
typedef v4f V;
constexpr int kW = 4;
#endif

// The write-back: per-channel bias (or null), the activation and its clamp bounds.
struct Epi {
  const float* bias;
  Activation act;
  float lo, hi;
};

inline V finish(V acc, const Epi& e, std::int64_t ch, const float* res) {
  if (res) acc += vload<V>(res + ch);  // residual at this pixel
  if (e.act == Activation::relu) {
    acc = vmax(acc, V{});
  } else if (e.act == Activation::clip) {
    acc = vmin(vmax(acc, V{} + e.lo), V{} + e.hi);
  }
  return acc;
}

inline float finish1(float acc, const Epi& e, std::int64_t ch, const float* res) {
  if (res) acc += res[ch];
  if (e.act == Activation::relu) acc = acc < 0.0f ? 0.0f : acc;  // NaN stays NaN
  if (e.act == Activation::clip) acc = std::min(std::max(acc, e.lo), e.hi);
  return acc;
}

// Channels [ch, ch + NV * kW) of P output pixels, `pstep` floats apart in x (the stride) and
// c apart in y; `taps` lists the (x, w) offsets of the taps in bounds, x's relative to the
// first pixel. The weights loaded for a tap serve all P pixels.
template <int NV, int P>
inline void pixel_block(const float* x, const float* w, const std::int64_t* xoff,
                        const std::int64_t* woff, int taps, std::int64_t pstep, std::int64_t c,
                        std::int64_t ch, const Epi& e, float* yp, const float* res) {
  V acc[P][NV];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[p][v] = e.bias ? vload<V>(e.bias + ch + v * kW) : V{};
  for (int t = 0; t < taps; ++t) {
    const float* xp = x + xoff[t] + ch;
    const float* wp = w + woff[t] + ch;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const V wv = vload<V>(wp + v * kW);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[p][v] += vload<V>(xp + p * pstep + v * kW) * wv;
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      vstore(yp + p * c + ch + v * kW,
             finish(acc[p][v], e, ch + v * kW, res ? res + p * c : nullptr));
}

// Every channel of P pixels (see pixel_block): 4-vector blocks, single vectors, scalars.
template <int P>
void pixels(const float* x, const float* w, const std::int64_t* xoff, const std::int64_t* woff,
            int taps, std::int64_t pstep, std::int64_t c, const Epi& e, float* yp,
            const float* res) {
  std::int64_t ch = 0;
  for (; ch + 4 * kW <= c; ch += 4 * kW)
    pixel_block<4, P>(x, w, xoff, woff, taps, pstep, c, ch, e, yp, res);
  for (; ch + kW <= c; ch += kW)
    pixel_block<1, P>(x, w, xoff, woff, taps, pstep, c, ch, e, yp, res);
  for (; ch < c; ++ch) {
    for (int p = 0; p < P; ++p) {
      float acc = e.bias ? e.bias[ch] : 0.0f;
      for (int t = 0; t < taps; ++t) acc += x[p * pstep + xoff[t] + ch] * w[woff[t] + ch];
      yp[p * c + ch] = finish1(acc, e, ch, res ? res + p * c : nullptr);
    }
  }
}

}  // namespace

void depthwise_nhwc_rows(const ConvGeom& g, const float* x, const float* w_hwc, float* y,
                         const float* bias, const float* residual, Activation act, float lo,
                         float hi, std::int64_t row0, std::int64_t row1) {
  const std::int64_t c = g.c;
  const std::int64_t taps_max = g.kh * g.kw;
  std::vector<std::int64_t> offs(static_cast<std::size_t>(4 * taps_max));
  std::int64_t* xoff = offs.data();                 // border pixel: absolute in the image
  std::int64_t* woff = offs.data() + taps_max;
  std::int64_t* xin = offs.data() + 2 * taps_max;   // interior pixels: relative to the pixel
  std::int64_t* win = offs.data() + 3 * taps_max;
  // output columns whose taps all fall inside the image along x
  const std::int64_t ext_w = (g.kw - 1) * g.dw;
  const std::int64_t ox_lo = std::min(g.ow, (g.pl + g.sw - 1) / g.sw);
  const std::int64_t ox_hi =
      g.w - 1 - ext_w + g.pl < 0 ? 0 : std::min(g.ow, (g.w - 1 - ext_w + g.pl) / g.sw + 1);
  const std::int64_t pstep = g.sw * c;
  for (std::int64_t row = row0; row < row1; ++row) {
    const std::int64_t b = row / g.oh, oy = row % g.oh;
    const float* img = x + b * g.h * g.w * c;
    const std::int64_t iy0 = oy * g.sh - g.pt;
    int tin = 0;
    for (std::int64_t ky = 0; ky < g.kh; ++ky) {
      const std::int64_t iy = iy0 + ky * g.dh;
      if (iy < 0 || iy >= g.h) continue;
      for (std::int64_t kx = 0; kx < g.kw; ++kx) {
        xin[tin] = (iy * g.w + kx * g.dw) * c;
        win[tin] = (ky * g.kw + kx) * c;
        ++tin;
      }
    }
    float* yrow = y + row * g.ow * c;
    const float* rrow = residual ? residual + row * g.ow * c : nullptr;
    const Epi e{bias, act, lo, hi};
    auto border = [&](std::int64_t ox) {
      const std::int64_t ix0 = ox * g.sw - g.pl;
      int taps = 0;
      for (std::int64_t ky = 0; ky < g.kh; ++ky) {
        const std::int64_t iy = iy0 + ky * g.dh;
        if (iy < 0 || iy >= g.h) continue;
        for (std::int64_t kx = 0; kx < g.kw; ++kx) {
          const std::int64_t ix = ix0 + kx * g.dw;
          if (ix < 0 || ix >= g.w) continue;
          xoff[taps] = (iy * g.w + ix) * c;
          woff[taps] = (ky * g.kw + kx) * c;
          ++taps;
        }
      }
      pixels<1>(img, w_hwc, xoff, woff, taps, pstep, c, e, yrow + ox * c,
                rrow ? rrow + ox * c : nullptr);
    };
    for (std::int64_t ox = 0; ox < std::min(ox_lo, g.ow); ++ox) border(ox);
    std::int64_t ox = ox_lo;
    for (; ox + 2 <= ox_hi; ox += 2) {
      const float* base = img + (ox * g.sw - g.pl) * c;
      pixels<2>(base, w_hwc, xin, win, tin, pstep, c, e, yrow + ox * c,
                rrow ? rrow + ox * c : nullptr);
    }
    for (; ox < ox_hi; ++ox) {
      const float* base = img + (ox * g.sw - g.pl) * c;
      pixels<1>(base, w_hwc, xin, win, tin, pstep, c, e, yrow + ox * c,
                rrow ? rrow + ox * c : nullptr);
    }
    for (ox = std::max(ox_hi, ox_lo); ox < g.ow; ++ox) border(ox);
  }
}

}  // namespace OPD_ISA
}  // namespace opd
