// Convolution kernels in the blocked layouts, compiled once per instruction set (OPD_ISA).
//
// direct_conv: y[n, ob, oh, ow, :] = sum over input blocks ib, taps (kh, kw) and channels ic of
//   x[n, ib, ih, iw, ic] * w[ob, ib, kh, kw, ic, :], register-blocked as up to 6 output pixels
//   (one row of 6, or two rows of 3 when rows are narrow, e.g. 7x7) x NOB output blocks of B
//   channels = 12 vector accumulators of 8 floats; each input value is broadcast once and
//   multiplied into NOB*B/8 weight vectors. With bi = 1 the same kernel reads a standard nchw
//   input (the first-layer variant); a 1x1 stride-1 conv runs over the flattened spatial axis
//   (a GEMM: pixels contiguous). Cache blocking: input blocks are walked in chunks whose
//   weights stay in L1 while every output pixel of a work item reuses them; a work item covers
//   a group of rows (or a row segment) of several output-block tiles, so each input chunk is
//   also reused across output blocks while it is in cache. Threads split the work items
//   (batch x output-block groups x row groups).
// depthwise_conv: y[n, cb, oh, ow, :] = sum over taps of x[n, cb, ih, iw, :] * w[cb, kh, kw, :].
//
// Both fuse the epilogue: + bias, + residual, clamp to [lo, hi] (see conv.h). Padding: output
// pixels whose taps all fall inside the input run in register tiles; border pixels run one at a
// time over their valid taps only (the caller may zero-pad the input instead).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

// v8f values pass between inlined helpers only; the generic (SSE) build warns about the ABI of
// 32-byte vectors, which never crosses a translation unit here.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "opdispatch/conv.h"
#include "opdispatch/parallel.h"
#include "opdispatch/vec.h"

namespace opd {
namespace OPD_ISA {
namespace {

using conv_detail::KernelArgs;
using i64 = std::int64_t;

constexpr int kMaxWB = 6;   // output pixels per register tile (one row)
constexpr int kPairWB = 3;  // pixels per row of a two-row register tile

// Vector helpers with internal linkage (one copy per instruction set, never merged by the
// linker with another build's copy).
inline v8f ld(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void st(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
inline v8f bc(float x) { return v8f{x, x, x, x, x, x, x, x}; }
// NaN-propagating (see vmax in opdispatch/vec.h)
inline v8f vmax8(v8f a, v8f b) { return (a > b) | (a != a) ? a : b; }
inline v8f vmin8(v8f a, v8f b) { return (a < b) | (a != a) ? a : b; }

// Runs fn(i) for i in [0, items) over the threads, or inline when the whole job (`flops`) is
// too small to pay for waking them. Threads take runs of consecutive items (which share weights
// and inputs) from a shared counter, so a thread that starts late or is slowed down by another
// process does not hold the others up.
template <class Fn>
inline void run_items(i64 items, double flops, Fn&& fn) {
  const i64 nt = std::min<i64>(num_threads(), items);
  if (flops < 2e6 || nt <= 1) {
    for (i64 i = 0; i < items; ++i) fn(i);
    return;
  }
  const i64 run = std::max<i64>(1, items / (4 * nt));
  std::atomic<i64> next{0};
  parallel_for(nt, [&](i64) {
    for (i64 b; (b = next.fetch_add(run, std::memory_order_relaxed)) < items;)
      for (i64 i = b; i < std::min(items, b + run); ++i) fn(i);
  });
}

// Valid tap range [lo, hi) along one axis for an output starting at input coordinate `i0`.
inline void tap_range(i64 i0, i64 k, i64 d, i64 n, i64& lo, i64& hi) {
  lo = i0 >= 0 ? 0 : (-i0 + d - 1) / d;
  hi = n - 1 - i0 < 0 ? 0 : std::min<i64>(k, (n - 1 - i0) / d + 1);
  if (hi < lo) hi = lo;
}

// The pointers and ranges of one register tile of direct_conv.
struct DirectTile {
  const float* x;    // input block ib_begin of this image, row 0, at the tile's first column
  i64 x_ib;          // floats between input blocks
  i64 x_row;         // floats between input rows
  i64 xs;            // floats between consecutive output pixels' inputs (runtime stride)
  i64 x_rstep;       // two-row tiles: floats between the two output rows' inputs
  i64 y_rstep;       // two-row tiles: floats between the two output rows
  i64 ih0;           // input row of kernel row 0
  i64 kh_lo, kh_hi, kw_lo, kw_hi, dh, dw, kw_total;
  const float* w[2];  // weights of the NOB output blocks at input block ib_begin
  i64 w_ib;           // floats between input blocks of one output block's weights
  i64 nib;            // input blocks in this chunk
  float* y[2];        // outputs of the NOB blocks at the tile's first pixel
  const float* r[2];  // residuals (or null)
  const float* bias;  // NOB*B floats
  const float* lo;    // NOB*B floats or null
  const float* hi;
  bool first, last;   // first chunk: start from bias; last: apply the epilogue
};

// acc[v][j] += w[ic][v] * x[j][ic] over the BI input channels of one kernel tap: pixel
// j = r * WB + c (R rows of WB columns) at xp + r * rstep + c * xs, weights of the NOB output
// blocks at wp0 / wp1 ((BI, B) each).
template <int BI, int B, int NOB, int R, int WB>
inline void fma_taps(v8f (&acc)[NOB * B / 8][R * WB], const float* xp, i64 xs, i64 rstep,
                     const float* wp0, const float* wp1) {
  constexpr int VB = B / 8;
  constexpr int NV = NOB * VB;
#pragma GCC unroll 16
  for (int ic = 0; ic < BI; ++ic) {
    v8f wv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < VB; ++v) {
      wv[v] = ld(wp0 + ic * B + v * 8);
      if (NOB > 1) wv[VB + v] = ld(wp1 + ic * B + v * 8);
    }
#pragma GCC unroll 16
    for (int j = 0; j < R * WB; ++j) {
      const v8f xv = bc(xp[(j / WB) * rstep + (j % WB) * xs + ic]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[v][j] += wv[v] * xv;
    }
    // Keeps the next channel's loads below this one's FMAs: without it GCC hoists them and
    // spills accumulators of the 12-accumulator tiles.
    asm volatile("" ::: "memory");
  }
}

// One register tile: R rows (1, 2) of WB pixels x NOB blocks of B output channels (pixel
// j = r * WB + c). SW = compile-time pixel
// stride multiplier (1, 2), 0 for the runtime stride `xs`, or -1 for a 1x1 kernel over a
// flattened row (pixels contiguous, no taps to walk).
template <int BI, int B, int NOB, int R, int WB, int SW>
inline void direct_tile(const DirectTile& t) {
  constexpr int VB = B / 8;
  constexpr int NV = NOB * VB;
  constexpr int PX = R * WB;
  v8f acc[NV][PX];
  auto yo = [&](int j) { return (j / WB) * t.y_rstep + (j % WB) * B; };
  if (t.first) {
    #pragma GCC unroll 16
    for (int k = 0; k < NOB; ++k)
      #pragma GCC unroll 16
      for (int v = 0; v < VB; ++v) {
        const v8f b = ld(t.bias + k * B + v * 8);
        #pragma GCC unroll 16
        for (int j = 0; j < PX; ++j) acc[k * VB + v][j] = b;
      }
  } else {
    #pragma GCC unroll 16
    for (int k = 0; k < NOB; ++k)
      #pragma GCC unroll 16
      for (int v = 0; v < VB; ++v)
        #pragma GCC unroll 16
        for (int j = 0; j < PX; ++j) acc[k * VB + v][j] = ld(t.y[k] + yo(j) + v * 8);
  }
  if constexpr (SW < 0) {  // 1x1 kernel over a flattened row: input pixels are contiguous
    for (i64 ib = 0; ib < t.nib; ++ib) {
      const float* wi0 = t.w[0] + ib * t.w_ib;
      fma_taps<BI, B, NOB, 1, WB>(acc, t.x + ib * t.x_ib, BI, 0, wi0,
                                  NOB > 1 ? t.w[1] + ib * t.w_ib : wi0);
    }
  } else {
    const i64 xs = SW ? SW * BI : t.xs;
    for (i64 ib = 0; ib < t.nib; ++ib) {
      const float* xi = t.x + ib * t.x_ib;
      const float* wi0 = t.w[0] + ib * t.w_ib;
      const float* wi1 = NOB > 1 ? t.w[1] + ib * t.w_ib : wi0;
      for (i64 kh = t.kh_lo; kh < t.kh_hi; ++kh) {
        const float* xr = xi + (t.ih0 + kh * t.dh) * t.x_row;
        const i64 wrow = kh * t.kw_total * BI * B;
        for (i64 kw = t.kw_lo; kw < t.kw_hi; ++kw)
          fma_taps<BI, B, NOB, R, WB>(acc, xr + kw * t.dw * BI, xs, t.x_rstep,
                                      wi0 + wrow + kw * BI * B, wi1 + wrow + kw * BI * B);
      }
    }
  }
  #pragma GCC unroll 16
  for (int k = 0; k < NOB; ++k)
    #pragma GCC unroll 16
    for (int v = 0; v < VB; ++v) {
      if (t.last) {
        if (t.r[k])
          #pragma GCC unroll 16
          for (int j = 0; j < PX; ++j) acc[k * VB + v][j] += ld(t.r[k] + yo(j) + v * 8);
        if (t.lo) {
          const v8f lo = ld(t.lo + k * B + v * 8);
          const v8f hi = ld(t.hi + k * B + v * 8);
          #pragma GCC unroll 16
          for (int j = 0; j < PX; ++j)
            acc[k * VB + v][j] = vmin8(vmax8(acc[k * VB + v][j], lo), hi);
        }
      }
      #pragma GCC unroll 16
      for (int j = 0; j < PX; ++j) st(t.y[k] + yo(j) + v * 8, acc[k * VB + v][j]);
    }
}

template <int BI, int B, int NOB, int SW>
void direct_tile_wb(int rows, int wb, const DirectTile& t) {
  if constexpr (SW > 0) {  // callers pair rows only for strides 1 and 2
    if (rows == 2) {
      switch (wb) {
        case 1: direct_tile<BI, B, NOB, 2, 1, SW>(t); break;
        case 2: direct_tile<BI, B, NOB, 2, 2, SW>(t); break;
        default: direct_tile<BI, B, NOB, 2, 3, SW>(t); break;
      }
      return;
    }
  }
  switch (wb) {
    case 1: direct_tile<BI, B, NOB, 1, 1, SW>(t); break;
    case 2: direct_tile<BI, B, NOB, 1, 2, SW>(t); break;
    case 3: direct_tile<BI, B, NOB, 1, 3, SW>(t); break;
    case 4: direct_tile<BI, B, NOB, 1, 4, SW>(t); break;
    case 5: direct_tile<BI, B, NOB, 1, 5, SW>(t); break;
    default: direct_tile<BI, B, NOB, 1, 6, SW>(t); break;
  }
}

// Calls tile(ow0, wb, kw_lo, kw_hi) over output columns [c0, c1) of one row: runs of interior
// pixels (all taps valid) in balanced tiles of at most `max_wb`, border pixels one at a time.
template <class Tile>
inline void for_row_tiles(i64 c0, i64 c1, i64 sw, i64 pl, i64 kw, i64 dw, i64 w, i64 max_wb,
                          Tile&& tile) {
  i64 ow = c0;
  while (ow < c1) {
    i64 lo, hi;
    tap_range(ow * sw - pl, kw, dw, w, lo, hi);
    if (lo != 0 || hi != kw) {
      tile(ow, 1, lo, hi);
      ++ow;
      continue;
    }
    i64 end = ow + 1;
    while (end < c1) {
      tap_range(end * sw - pl, kw, dw, w, lo, hi);
      if (lo != 0 || hi != kw) break;
      ++end;
    }
    const i64 len = end - ow;
    const i64 ntiles = (len + max_wb - 1) / max_wb;
    for (i64 t = 0; t < ntiles; ++t) {
      const i64 b = ow + len * t / ntiles, e = ow + len * (t + 1) / ntiles;
      tile(b, static_cast<int>(e - b), i64{0}, kw);
    }
    ow = end;
  }
}

// Input blocks per L1 chunk: the chunk's weights for one tile stay below kChunkBytes.
constexpr i64 kChunkBytes = 24 * 1024;
constexpr i64 kWant = 8;  // work items per thread, at least
constexpr i64 kOutBytes = 64 * 1024;  // outputs of one work item (see direct_conv_t)
inline i64 chunk_blocks(const KernelArgs& a, int nob) {
  const i64 per_ib = a.kh * a.kw * a.bi * a.block * nob * static_cast<i64>(sizeof(float));
  return std::max<i64>(1, std::min<i64>(a.nib, kChunkBytes / std::max<i64>(per_ib, 1)));
}

// How the output of one image and output-block tile splits into work items: `groups` groups
// of `per` rows (or, for a single long row such as a flattened 1x1 GEMM, segments of `per`
// columns), enough items to balance the threads while each item keeps a weight chunk in L1
// over as many output pixels as possible.
struct Split {
  i64 groups, per;
};

inline Split split_rows(const KernelArgs& a, i64 outer, bool even_rows) {
  const i64 want = kWant * static_cast<i64>(num_threads());
  const i64 along = a.oh == 1 ? a.ow : a.oh;
  i64 groups = outer >= want ? 1 : std::min(along, (want + outer - 1) / outer);
  if (a.oh == 1) groups = std::max(groups, (a.ow + 511) / 512);  // segments of <= 512 pixels
  i64 per = (along + groups - 1) / groups;
  if (a.oh == 1 && per < along) per = std::min(along, (per + kMaxWB - 1) / kMaxWB * kMaxWB);
  if (even_rows && per % 2 && per < along) ++per;  // keep row pairs within one item
  return {(along + per - 1) / per, per};
}

template <int BI, int B, int SW>
void direct_conv_t(const KernelArgs& a) {
  // Output-block tiles: B = 16 one block per tile; B = 8 two (when they read the same input
  // blocks) so that both register-tile shapes hold 2 x 6 vector accumulators.
  constexpr int kNob = B == 8 ? 2 : 1;
  const i64 ntiles = (a.ob + kNob - 1) / kNob;
  const bool flat = a.oh == 1;
  // Narrow rows (e.g. 7 pixels: tiles of 4 + 3) leave too few accumulators per tile to hide
  // the FMA latency; pairs of rows then share tiles of up to 2 x 3 pixels.
  const bool pair_rows = SW > 0 && !flat && a.ow < 4 * ((a.ow + kMaxWB - 1) / kMaxWB);
  const Split sp = split_rows(a, a.n * ntiles, pair_rows);
  // Tiles of one work item: as many as keep the item's outputs within kOutBytes, so that an
  // input chunk is reused across them while it is in cache (small images, many channels).
  const i64 nt = num_threads();
  const i64 tile_out = (flat ? sp.per : sp.per * a.ow) * kNob * B * static_cast<i64>(sizeof(float));
  const i64 gmax = std::max<i64>(1, kOutBytes / std::max<i64>(tile_out, 1));
  i64 tgroups = std::min(ntiles, nt * ((ntiles + nt * gmax - 1) / (nt * gmax)));
  if (a.n * sp.groups >= 2 * nt) tgroups = std::min(ntiles, (ntiles + gmax - 1) / gmax);
  const i64 tper = (ntiles + tgroups - 1) / tgroups;
  tgroups = (ntiles + tper - 1) / tper;
  const i64 items = a.n * tgroups * sp.groups;
  const i64 x_img = a.xblocks * a.ih * a.iw * BI;
  const i64 w_ob = a.nib * a.kh * a.kw * BI * B;
  const i64 y_blk = a.oh * a.ow * B;
  const i64 kchunk = chunk_blocks(a, kNob);
  const double flops = 2.0 * a.n * a.oh * a.ow * a.ob * B * a.nib * BI * a.kh * a.kw;
  run_items(items, flops, [&](i64 item) {
    const i64 g = item % sp.groups;
    const i64 tg = (item / sp.groups) % tgroups;
    const i64 n = item / (sp.groups * tgroups);
    const i64 r0 = flat ? 0 : g * sp.per, r1 = flat ? 1 : std::min(a.oh, r0 + sp.per);
    const i64 c0 = flat ? g * sp.per : 0, c1 = flat ? std::min(a.ow, c0 + sp.per) : a.ow;
    DirectTile t{};
    t.x_ib = a.ih * a.iw * BI;
    t.x_row = a.iw * BI;
    t.xs = a.sw * BI;
    t.x_rstep = a.sh * a.iw * BI;
    t.y_rstep = a.ow * B;
    t.dh = a.dh;
    t.dw = a.dw;
    t.kw_total = a.kw;
    t.w_ib = a.kh * a.kw * BI * B;
    for (i64 kb = 0; kb < a.nib; kb += kchunk) {
      const i64 kn = std::min(kchunk, a.nib - kb);
      t.nib = kn;
      t.first = kb == 0;
      t.last = kb + kn == a.nib;
      for (i64 ti = tg * tper; ti < std::min(ntiles, (tg + 1) * tper); ++ti) {
        const i64 ob0 = ti * kNob;
        const int tile_nob = static_cast<int>(std::min<i64>(kNob, a.ob - ob0));
        // output blocks of one tile must read the same input blocks (grouped packing)
        const bool split = tile_nob == 2 && a.ib_start && a.ib_start[ob0 + 1] != a.ib_start[ob0];
        const int nob = split ? 1 : tile_nob;
        for (int p = 0; p < (split ? 2 : 1); ++p) {
          const i64 obp = ob0 + p;
          const i64 ibp = a.ib_start ? a.ib_start[obp] : 0;
          t.bias = a.bias + obp * B;
          t.lo = a.lo ? a.lo + obp * B : nullptr;
          t.hi = a.hi ? a.hi + obp * B : nullptr;
          for (int k = 0; k < nob; ++k) t.w[k] = a.w + (obp + k) * w_ob + kb * t.w_ib;
          const float* xbase = a.x + n * x_img + (ibp + kb) * t.x_ib;
          for (i64 oh = r0; oh < r1;) {
            t.ih0 = oh * a.sh - a.pt;
            tap_range(t.ih0, a.kh, a.dh, a.ih, t.kh_lo, t.kh_hi);
            int rows = 1;
            if (pair_rows && oh + 1 < r1) {  // two rows share a tile when their taps match
              i64 lo2, hi2;
              tap_range(t.ih0 + a.sh, a.kh, a.dh, a.ih, lo2, hi2);
              if (lo2 == t.kh_lo && hi2 == t.kh_hi) rows = 2;
            }
            for_row_tiles(c0, c1, a.sw, a.pl, a.kw, a.dw, a.iw, rows == 2 ? kPairWB : kMaxWB,
                          [&](i64 ow0, int wb, i64 kw_lo, i64 kw_hi) {
              t.x = xbase + (ow0 * a.sw - a.pl) * BI;
              t.kw_lo = kw_lo;
              t.kw_hi = kw_hi;
              for (int k = 0; k < nob; ++k) {
                const i64 yoff = (n * a.ob + obp + k) * y_blk + (oh * a.ow + ow0) * B;
                t.y[k] = a.y + yoff;
                t.r[k] = a.residual ? a.residual + yoff : nullptr;
              }
              if constexpr (kNob == 2) {
                if (nob == 2) return direct_tile_wb<BI, B, 2, SW>(rows, wb, t);
              }
              direct_tile_wb<BI, B, 1, SW>(rows, wb, t);
            });
            oh += rows;
          }
        }
      }
    }
  });
}

template <int BI, int B>
void direct_conv_b(const KernelArgs& a) {
  if constexpr (BI > 1) {  // a blocked 1x1 GEMM over one (flattened) row
    if (a.oh == 1 && a.kh == 1 && a.kw == 1 && a.sw == 1 && a.pl == 0 && a.ow == a.iw)
      return direct_conv_t<BI, B, -1>(a);
  }
  if (a.sw == 1)
    direct_conv_t<BI, B, 1>(a);
  else if (a.sw == 2)
    direct_conv_t<BI, B, 2>(a);
  else
    direct_conv_t<BI, B, 0>(a);
}

// One depthwise register tile: WB pixels x one block of B channels (12 vector accumulators at
// most: 6 pixels of 16 channels or 12 of 8).
template <int B, int WB>
inline void depthwise_tile(const float* x, i64 xs, i64 x_row, i64 ih0, i64 kh_lo, i64 kh_hi,
                           i64 kw_lo, i64 kw_hi, i64 dh, i64 dw, i64 kw_total, const float* w,
                           const float* bias, const float* lo, const float* hi,
                           const float* r, float* y) {
  constexpr int VB = B / 8;
  v8f acc[VB][WB];
  #pragma GCC unroll 16
  for (int v = 0; v < VB; ++v) {
    const v8f b = ld(bias + v * 8);
    #pragma GCC unroll 16
    for (int j = 0; j < WB; ++j) acc[v][j] = b;
  }
  for (i64 kh = kh_lo; kh < kh_hi; ++kh) {
    const float* xr = x + (ih0 + kh * dh) * x_row;
    for (i64 kw = kw_lo; kw < kw_hi; ++kw) {
      const float* xp = xr + kw * dw * B;
      const float* wp = w + (kh * kw_total + kw) * B;
      #pragma GCC unroll 16
      for (int v = 0; v < VB; ++v) {
        const v8f wv = ld(wp + v * 8);
        #pragma GCC unroll 16
        for (int j = 0; j < WB; ++j) acc[v][j] += ld(xp + j * xs + v * 8) * wv;
      }
    }
  }
  #pragma GCC unroll 16
  for (int v = 0; v < VB; ++v) {
    if (r)
      #pragma GCC unroll 16
      for (int j = 0; j < WB; ++j) acc[v][j] += ld(r + j * B + v * 8);
    if (lo) {
      const v8f l = ld(lo + v * 8), h = ld(hi + v * 8);
      #pragma GCC unroll 16
      for (int j = 0; j < WB; ++j) acc[v][j] = vmin8(vmax8(acc[v][j], l), h);
    }
    #pragma GCC unroll 16
    for (int j = 0; j < WB; ++j) st(y + j * B + v * 8, acc[v][j]);
  }
}

template <int B>
void depthwise_conv_t(const KernelArgs& a) {
  const i64 items = a.n * a.ob * a.oh;
  run_items(items, 2.0 * items * a.ow * B * a.kh * a.kw, [&](i64 item) {
    const i64 oh = item % a.oh;
    const i64 cb = (item / a.oh) % a.ob;
    const i64 n = item / (a.oh * a.ob);
    const i64 ih0 = oh * a.sh - a.pt;
    i64 kh_lo, kh_hi;
    tap_range(ih0, a.kh, a.dh, a.ih, kh_lo, kh_hi);
    const float* xb = a.x + (n * a.xblocks + cb) * a.ih * a.iw * B;
    const float* wbase = a.w + cb * a.kh * a.kw * B;
    const i64 yrow = ((n * a.ob + cb) * a.oh + oh) * a.ow * B;
    const float* lo = a.lo ? a.lo + cb * B : nullptr;
    const float* hi = a.hi ? a.hi + cb * B : nullptr;
    for_row_tiles(0, a.ow, a.sw, a.pl, a.kw, a.dw, a.iw, 12 * 8 / B,
                  [&](i64 ow0, int wb, i64 kw_lo, i64 kw_hi) {
      const float* x = xb + (ow0 * a.sw - a.pl) * B;
      const float* r = a.residual ? a.residual + yrow + ow0 * B : nullptr;
      float* y = a.y + yrow + ow0 * B;
#define OPD_DW(WBV)                                                                          \
  depthwise_tile<B, WBV>(x, a.sw * B, a.iw * B, ih0, kh_lo, kh_hi, kw_lo, kw_hi, a.dh, a.dw, \
                         a.kw, wb_ptr, a.bias + cb * B, lo, hi, r, y)
      const float* wb_ptr = wbase;
      switch (wb) {
        case 1: OPD_DW(1); break;
        case 2: OPD_DW(2); break;
        case 3: OPD_DW(3); break;
        case 4: OPD_DW(4); break;
        case 5: OPD_DW(5); break;
        case 6: OPD_DW(6); break;
        default:
          if constexpr (B == 8) {  // one vector per pixel: up to 12 pixels per tile
            switch (wb) {
              case 7: OPD_DW(7); break;
              case 8: OPD_DW(8); break;
              case 9: OPD_DW(9); break;
              case 10: OPD_DW(10); break;
              case 11: OPD_DW(11); break;
              default: OPD_DW(12); break;
            }
          }
          break;
      }
#undef OPD_DW
    });
  });
}

}  // namespace

// Direct (and 1x1, grouped, first-layer) convolution; see the file comment.
void conv_direct_kernel(const KernelArgs& a) {
  if (a.block == 16) {
    if (a.bi == 1)
      direct_conv_b<1, 16>(a);
    else
      direct_conv_b<16, 16>(a);
  } else {
    if (a.bi == 1)
      direct_conv_b<1, 8>(a);
    else
      direct_conv_b<8, 8>(a);
  }
}

// Depthwise convolution; see the file comment.
void conv_depthwise_kernel(const KernelArgs& a) {
  if (a.block == 16)
    depthwise_conv_t<16>(a);
  else
    depthwise_conv_t<8>(a);
}

}  // namespace OPD_ISA
}  // namespace opd
