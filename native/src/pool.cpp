// Pooling kernels (see opdispatch/pool.h).
//
// Every 2-D kernel first plans each spatial axis once per call (AxisPlan: for each output
// coordinate, the input coordinate of tap 0, the range of taps that land inside the input, and
// the divisor's factor along that axis), so the inner loops never test bounds:
// - nchw: per plane and output row, one pass per kernel tap over the output columns whose tap
//   is inside the input (a contiguous, vectorisable loop over the row; stride 1 and 2 are
//   specialised so the compiler sees a constant stride);
// - nhwc: per output pixel, the channel row of every valid tap is folded into the output row
//   (a loop over contiguous channels);
// - nchw{B}c: like nchw, per (image, channel block) and output row, one pass per kernel tap
//   over the output pixels whose tap is inside the input, each pixel a run of B channels (stride
//   1: one contiguous loop over the row).
// Wide vectors (v8f, v16f) only pass between inlined helpers of this file; the baseline build
// notes that their ABI differs from AVX builds, which never matters here.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "opdispatch/pool.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "opdispatch/parallel.h"
#include "opdispatch/vec.h"


namespace opd {
namespace {

using i64 = std::int64_t;

// Vector helpers with internal linkage: vec.h's templates have external linkage and are also
// instantiated by the per-ISA objects, whose copies use another vector ABI.
template <class V>
inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
inline void store(float* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}
template <class V>
inline V splat(float x) {
  return V{} + x;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Below this many floats touched a kernel runs on the calling thread (waking threads costs
// more than the work).
constexpr i64 kMinParallelWork = i64{1} << 15;

i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }

// Runs fn(i) for i in [0, items): over the threads when `work` is large enough.
template <class Fn>
void for_items(i64 items, i64 work, Fn&& fn) {
  if (work < kMinParallelWork || items < 2) {
    for (i64 i = 0; i < items; ++i) fn(i);
    return;
  }
  parallel_for(items, fn);
}

// Runs fn(begin, end) over chunks of [0, items) of at least `grain` items (threads when the
// range is long enough).
template <class Fn>
void for_chunks(i64 items, i64 grain, Fn&& fn) {
  if (items <= grain) {
    if (items > 0) fn(i64{0}, items);
    return;
  }
  parallel_chunks(items, grain, fn);
}

void check_block(int block) {
  if (block != 8 && block != 16)
    throw std::invalid_argument("pool: channel block must be 8 or 16, received " +
                                std::to_string(block));
}

void check_dims(i64 n, i64 c, i64 h, i64 w) {
  if (n < 0 || c < 0 || h < 1 || w < 1)
    throw std::invalid_argument("pool: expected N, C >= 0 and H, W >= 1, received N=" +
                                std::to_string(n) + " C=" + std::to_string(c) +
                                " H=" + std::to_string(h) + " W=" + std::to_string(w));
}

// Where the window of each output coordinate lands along one spatial axis.
struct AxisPlan {
  i64 out = 0;
  std::vector<i64> start;  // input coordinate of tap 0 (may be negative: padding)
  std::vector<i64> lo;     // first tap inside the input
  std::vector<i64> hi;     // one past the last tap inside the input (hi >= lo)
  std::vector<i64> count;  // cells the average divides by along this axis
};

AxisPlan plan_axis(const Pool2dParams& p, int axis, i64 n) {
  AxisPlan a;
  a.out = pool_output_size(p, axis, n);
  const i64 k = p.kernel[axis], s = p.stride[axis], d = p.dilation[axis];
  const i64 pb = p.pad_begin[axis], pe = p.pad_end[axis];
  a.start.resize(a.out);
  a.lo.resize(a.out);
  a.hi.resize(a.out);
  a.count.resize(a.out);
  for (i64 o = 0; o < a.out; ++o) {
    const i64 i0 = o * s - pb;
    const i64 lo = i0 >= 0 ? 0 : std::min(k, cdiv(-i0, d));
    const i64 hi = n - 1 - i0 < 0 ? 0 : std::min(k, (n - 1 - i0) / d + 1);
    a.start[o] = i0;
    a.lo[o] = lo;
    a.hi[o] = std::max(lo, hi);
    if (p.count_include_pad) {
      // taps inside [-pb, n + pe): i0 >= -pb always, so only the end bound cuts
      const i64 last = n + pe - 1 - i0;
      a.count[o] = last < 0 ? 0 : std::min(k, last / d + 1);
    } else {
      a.count[o] = a.hi[o] - a.lo[o];
    }
  }
  return a;
}

// 1 / divisor of every output pixel (oh x ow), for averages.
std::vector<float> inverse_divisors(const AxisPlan& ph, const AxisPlan& pw) {
  std::vector<float> inv(static_cast<std::size_t>(ph.out * pw.out));
  for (i64 y = 0; y < ph.out; ++y)
    for (i64 x = 0; x < pw.out; ++x)
      inv[y * pw.out + x] = 1.0f / static_cast<float>(ph.count[y] * pw.count[x]);
  return inv;
}

template <bool IsMax>
inline float fold(float acc, float v) {
  if constexpr (IsMax)
    return acc > v || acc != acc ? acc : v;  // a NaN in the window propagates
  else
    return acc + v;
}

// 128-bit pieces: GCC expands a select (a > b ? a : b) on a generic vector wider than the
// target's registers lane by lane (scalar maxss on the baseline build, 10x slower than the
// sums); on 128-bit pieces it is one maxps each.
typedef float v4f __attribute__((vector_size(16)));

template <class V>
inline V vec_max(const V& a, const V& b) {
  constexpr int kPieces = sizeof(V) / sizeof(v4f);
  v4f x[kPieces], y[kPieces];
  std::memcpy(x, &a, sizeof a);
  std::memcpy(y, &b, sizeof b);
  // NaN-propagating: once the running max is NaN it stays NaN (maxps alone would drop it)
  for (int i = 0; i < kPieces; ++i) x[i] = (x[i] > y[i]) | (x[i] != x[i]) ? x[i] : y[i];
  V r;
  std::memcpy(&r, x, sizeof r);
  return r;
}

template <bool IsMax, class V>
inline V fold_vec(const V& acc, const V& v) {
  if constexpr (IsMax)
    return vec_max(acc, v);
  else
    return acc + v;
}

// ---- nchw -------------------------------------------------------------------------------------

// yrow[o] = fold(yrow[o], xrow[o * S + a]) for o in [lo, hi); S > 0 is a compile-time stride,
// S == 0 reads the stride from `s`.
template <bool IsMax, int S>
inline void fold_tap(float* __restrict yrow, const float* __restrict xrow, i64 a, i64 s, i64 lo,
                     i64 hi) {
  const i64 st = S > 0 ? S : s;
  for (i64 o = lo; o < hi; ++o) yrow[o] = fold<IsMax>(yrow[o], xrow[o * st + a]);
}

template <bool IsMax, int S>
void pool_nchw_impl(const float* x, float* y, i64 planes, i64 h, i64 w, const Pool2dParams& p) {
  const AxisPlan ph = plan_axis(p, 0, h), pw = plan_axis(p, 1, w);
  const i64 oh = ph.out, ow = pw.out, kw = p.kernel[1];
  const i64 sw = p.stride[1], dh = p.dilation[0], dw = p.dilation[1];
  // per kernel column: offset into the input row and the output columns it may touch
  std::vector<i64> a(kw), lo(kw), hi(kw);
  for (i64 kx = 0; kx < kw; ++kx) {
    a[kx] = kx * dw - p.pad_begin[1];
    lo[kx] = a[kx] >= 0 ? 0 : std::min(ow, cdiv(-a[kx], sw));
    hi[kx] = w - 1 - a[kx] < 0 ? 0 : std::min(ow, (w - 1 - a[kx]) / sw + 1);
    hi[kx] = std::max(hi[kx], lo[kx]);
  }
  const std::vector<float> inv = IsMax ? std::vector<float>() : inverse_divisors(ph, pw);
  const float init = IsMax ? kNegInf : 0.0f;
  const i64 taps = p.kernel[0] * kw;
  for_items(planes, planes * oh * ow * taps, [&](i64 t) {
    const float* xp = x + t * h * w;
    float* yp = y + t * oh * ow;
    for (i64 oy = 0; oy < oh; ++oy) {
      float* yrow = yp + oy * ow;
      std::fill(yrow, yrow + ow, init);
      for (i64 ky = ph.lo[oy]; ky < ph.hi[oy]; ++ky) {
        const float* xrow = xp + (ph.start[oy] + ky * dh) * w;
        for (i64 kx = 0; kx < kw; ++kx) fold_tap<IsMax, S>(yrow, xrow, a[kx], sw, lo[kx], hi[kx]);
      }
      if constexpr (!IsMax) {
        const float* irow = inv.data() + oy * ow;
        for (i64 o = 0; o < ow; ++o) yrow[o] *= irow[o];
      }
    }
  });
}

template <bool IsMax>
void pool_nchw_stride(const float* x, float* y, i64 planes, i64 h, i64 w, const Pool2dParams& p) {
  switch (p.stride[1]) {
    case 1: pool_nchw_impl<IsMax, 1>(x, y, planes, h, w, p); break;
    case 2: pool_nchw_impl<IsMax, 2>(x, y, planes, h, w, p); break;
    default: pool_nchw_impl<IsMax, 0>(x, y, planes, h, w, p); break;
  }
}

// ---- nhwc -------------------------------------------------------------------------------------

template <bool IsMax>
void pool_nhwc_impl(const float* x, float* y, i64 n, i64 c, i64 h, i64 w, const Pool2dParams& p) {
  const AxisPlan ph = plan_axis(p, 0, h), pw = plan_axis(p, 1, w);
  const i64 oh = ph.out, ow = pw.out, dh = p.dilation[0], dw = p.dilation[1];
  const std::vector<float> inv = IsMax ? std::vector<float>() : inverse_divisors(ph, pw);
  const float init = IsMax ? kNegInf : 0.0f;
  const i64 taps = p.kernel[0] * p.kernel[1];
  for_items(n * oh, n * oh * ow * c * taps, [&](i64 t) {
    const i64 b = t / oh, oy = t % oh;
    const float* xb = x + b * h * w * c;
    for (i64 ox = 0; ox < ow; ++ox) {
      float* __restrict dst = y + (t * ow + ox) * c;
      std::fill(dst, dst + c, init);
      for (i64 ky = ph.lo[oy]; ky < ph.hi[oy]; ++ky) {
        const float* xrow = xb + (ph.start[oy] + ky * dh) * w * c;
        for (i64 kx = pw.lo[ox]; kx < pw.hi[ox]; ++kx) {
          const float* __restrict src = xrow + (pw.start[ox] + kx * dw) * c;
          for (i64 i = 0; i < c; ++i) dst[i] = fold<IsMax>(dst[i], src[i]);
        }
      }
      if constexpr (!IsMax) {
        const float f = inv[oy * ow + ox];
        for (i64 i = 0; i < c; ++i) dst[i] *= f;
      }
    }
  });
}

// ---- nchw{B}c ---------------------------------------------------------------------------------

// yrow[o] = fold(yrow[o], xrow[o * S + a]) for pixels o in [lo, hi) of B channels each; S > 0
// is a compile-time stride (S == 1: one contiguous loop over the row), S == 0 reads `s`.
template <bool IsMax, int B, int S>
inline void fold_tap_blocked(float* __restrict yrow, const float* __restrict xrow, i64 a, i64 s,
                             i64 lo, i64 hi) {
  if constexpr (S == 1) {
    const float* src = xrow + a * B;
    for (i64 i = lo * B; i < hi * B; ++i) yrow[i] = fold<IsMax>(yrow[i], src[i]);
  } else {
    const i64 st = S > 0 ? S : s;
    for (i64 o = lo; o < hi; ++o) {
      float* __restrict dst = yrow + o * B;
      const float* __restrict src = xrow + (o * st + a) * B;
      for (int j = 0; j < B; ++j) dst[j] = fold<IsMax>(dst[j], src[j]);
    }
  }
}

template <bool IsMax, int B, int S>
void pool_blocked_impl(const float* x, float* y, i64 n, i64 c, i64 h, i64 w,
                       const Pool2dParams& p) {
  const AxisPlan ph = plan_axis(p, 0, h), pw = plan_axis(p, 1, w);
  const i64 oh = ph.out, ow = pw.out, kw = p.kernel[1];
  const i64 sw = p.stride[1], dh = p.dilation[0], dw = p.dilation[1];
  const i64 cb = cdiv(c, B), tail = c % B;
  // per kernel column: offset (in pixels) into the input row and the output pixels it touches
  std::vector<i64> a(kw), lo(kw), hi(kw);
  for (i64 kx = 0; kx < kw; ++kx) {
    a[kx] = kx * dw - p.pad_begin[1];
    lo[kx] = a[kx] >= 0 ? 0 : std::min(ow, cdiv(-a[kx], sw));
    hi[kx] = w - 1 - a[kx] < 0 ? 0 : std::min(ow, (w - 1 - a[kx]) / sw + 1);
    hi[kx] = std::max(hi[kx], lo[kx]);
  }
  const std::vector<float> inv = IsMax ? std::vector<float>() : inverse_divisors(ph, pw);
  const float init = IsMax ? kNegInf : 0.0f;
  const i64 taps = p.kernel[0] * kw;
  for_items(n * cb * oh, n * cb * oh * ow * B * taps, [&](i64 t) {
    const i64 bk = t / oh, oy = t % oh;  // bk = batch * cb + channel block
    const float* plane = x + bk * h * w * B;
    float* yrow = y + t * ow * B;
    std::fill(yrow, yrow + ow * B, init);
    for (i64 ky = ph.lo[oy]; ky < ph.hi[oy]; ++ky) {
      const float* xrow = plane + (ph.start[oy] + ky * dh) * w * B;
      for (i64 kx = 0; kx < kw; ++kx)
        fold_tap_blocked<IsMax, B, S>(yrow, xrow, a[kx], sw, lo[kx], hi[kx]);
    }
    if constexpr (!IsMax) {
      const float* irow = inv.data() + oy * ow;
      for (i64 o = 0; o < ow; ++o)
        for (int j = 0; j < B; ++j) yrow[o * B + j] *= irow[o];
    }
    // a window entirely in the padding yields -inf / NaN; the padding channels stay zero
    if (tail && bk % cb == cb - 1)
      for (i64 o = 0; o < ow; ++o)
        if (ph.lo[oy] == ph.hi[oy] || pw.lo[o] == pw.hi[o])
          std::fill(yrow + o * B + tail, yrow + (o + 1) * B, 0.0f);
  });
}

template <bool IsMax, int B>
void pool_blocked_stride(const float* x, float* y, i64 n, i64 c, i64 h, i64 w,
                         const Pool2dParams& p) {
  switch (p.stride[1]) {
    case 1: pool_blocked_impl<IsMax, B, 1>(x, y, n, c, h, w, p); break;
    case 2: pool_blocked_impl<IsMax, B, 2>(x, y, n, c, h, w, p); break;
    default: pool_blocked_impl<IsMax, B, 0>(x, y, n, c, h, w, p); break;
  }
}

// ---- global pooling ---------------------------------------------------------------------------

template <bool IsMax>
inline float hreduce(const v8f& v) {
  float r = v[0];
  for (int i = 1; i < 8; ++i) r = fold<IsMax>(r, v[i]);
  return r;
}

// max / sum of p[0..len) with four vector accumulators.
template <bool IsMax>
float reduce_plane(const float* p, i64 len) {
  const v8f init = splat<v8f>(IsMax ? kNegInf : 0.0f);
  v8f a0 = init, a1 = init, a2 = init, a3 = init;
  i64 i = 0;
  for (; i + 32 <= len; i += 32) {
    a0 = fold_vec<IsMax>(a0, load<v8f>(p + i));
    a1 = fold_vec<IsMax>(a1, load<v8f>(p + i + 8));
    a2 = fold_vec<IsMax>(a2, load<v8f>(p + i + 16));
    a3 = fold_vec<IsMax>(a3, load<v8f>(p + i + 24));
  }
  for (; i + 8 <= len; i += 8) a0 = fold_vec<IsMax>(a0, load<v8f>(p + i));
  float r = hreduce<IsMax>(fold_vec<IsMax>(fold_vec<IsMax>(a0, a1), fold_vec<IsMax>(a2, a3)));
  for (; i < len; ++i) r = fold<IsMax>(r, p[i]);
  return r;
}

template <bool IsMax>
void global_nchw_impl(const float* x, float* y, i64 planes, i64 spatial) {
  const float scale = 1.0f / static_cast<float>(spatial);
  const i64 grain = std::max<i64>(1, kMinParallelWork / spatial);
  for_chunks(planes, grain, [&](i64 b, i64 e) {
    for (i64 t = b; t < e; ++t) {
      const float r = reduce_plane<IsMax>(x + t * spatial, spatial);
      y[t] = IsMax ? r : r * scale;
    }
  });
}

template <bool IsMax>
void global_nhwc_impl(const float* x, float* y, i64 n, i64 c, i64 spatial) {
  constexpr i64 kChunk = 256;  // channels per work item
  const i64 chunks = cdiv(c, kChunk);
  const float scale = 1.0f / static_cast<float>(spatial);
  for_items(n * chunks, n * c * spatial, [&](i64 t) {
    const i64 b = t / chunks, c0 = (t % chunks) * kChunk, cn = std::min(kChunk, c - c0);
    float* __restrict acc = y + b * c + c0;
    const float* xb = x + b * spatial * c + c0;
    std::copy(xb, xb + cn, acc);
    for (i64 s = 1; s < spatial; ++s) {
      const float* __restrict src = xb + s * c;
      for (i64 i = 0; i < cn; ++i) acc[i] = fold<IsMax>(acc[i], src[i]);
    }
    if constexpr (!IsMax)
      for (i64 i = 0; i < cn; ++i) acc[i] *= scale;
  });
}

template <bool IsMax, int B, class V>
void global_blocked_impl(const float* x, float* y, i64 n, i64 c, i64 spatial) {
  const i64 items = n * cdiv(c, B);
  const V init = splat<V>(IsMax ? kNegInf : 0.0f);
  const float scale = 1.0f / static_cast<float>(spatial);
  for_items(items, items * spatial * B, [&](i64 t) {
    const float* p = x + t * spatial * B;
    V a0 = init, a1 = init;
    i64 s = 0;
    for (; s + 2 <= spatial; s += 2) {
      a0 = fold_vec<IsMax>(a0, load<V>(p + s * B));
      a1 = fold_vec<IsMax>(a1, load<V>(p + (s + 1) * B));
    }
    if (s < spatial) a0 = fold_vec<IsMax>(a0, load<V>(p + s * B));
    V r = fold_vec<IsMax>(a0, a1);
    if constexpr (!IsMax) r *= splat<V>(scale);
    store(y + t * B, r);
  });
}

void check_global(i64 n, i64 c, i64 spatial) {
  if (n < 0 || c < 0 || spatial < 1)
    throw std::invalid_argument("global pool: expected N, C >= 0 and a spatial size >= 1, "
                                "received N=" + std::to_string(n) + " C=" + std::to_string(c) +
                                " spatial=" + std::to_string(spatial));
}

}  // namespace

void check_pool_params(const Pool2dParams& p) {
  static const char* axes[2] = {"height", "width"};
  for (int i = 0; i < 2; ++i) {
    auto bad = [&](const char* what, i64 v, const char* expected) {
      throw std::invalid_argument(std::string("pool: ") + what + " along the " + axes[i] +
                                  " axis must be " + expected + ", received " +
                                  std::to_string(v));
    };
    if (p.kernel[i] < 1) bad("kernel size", p.kernel[i], ">= 1");
    if (p.stride[i] < 1) bad("stride", p.stride[i], ">= 1");
    if (p.dilation[i] < 1) bad("dilation", p.dilation[i], ">= 1");
    if (p.pad_begin[i] < 0) bad("leading pad", p.pad_begin[i], ">= 0");
    if (p.pad_end[i] < 0) bad("trailing pad", p.pad_end[i], ">= 0");
  }
}

i64 pool_output_size(const Pool2dParams& p, int axis, i64 n) {
  check_pool_params(p);
  const i64 s = p.stride[axis], pb = p.pad_begin[axis];
  const i64 extent = (p.kernel[axis] - 1) * p.dilation[axis] + 1;
  const i64 span = n + pb + p.pad_end[axis] - extent;
  // floor division (span may be negative: a window longer than the padded input)
  auto floordiv = [](i64 a, i64 b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  i64 out = -1;
  if (p.ceil_mode) {
    // ceil(span / s) + 1: with -s < span < 0 one window still starts inside the input and
    // runs past the end padding (ONNX, onnxruntime and PyTorch agree)
    out = floordiv(span + s - 1, s) + 1;
    if (out > 0 && (out - 1) * s >= n + pb) --out;  // the last window must start inside the input
  } else if (span >= 0) {
    out = span / s + 1;
  }
  if (out < 1)
    throw std::invalid_argument(
        std::string("pool: the window (dilated extent ") + std::to_string(extent) +
        ") does not fit the padded input along the " + (axis == 0 ? "height" : "width") +
        " axis (size " + std::to_string(n) + " + pads " + std::to_string(pb) + ", " +
        std::to_string(p.pad_end[axis]) + "): the output would be empty");
  return out;
}

void pool2d_nchw(const float* x, float* y, i64 n, i64 c, i64 h, i64 w, const Pool2dParams& p) {
  check_dims(n, c, h, w);
  if (p.kind == PoolKind::max)
    pool_nchw_stride<true>(x, y, n * c, h, w, p);
  else
    pool_nchw_stride<false>(x, y, n * c, h, w, p);
}

void pool2d_nhwc(const float* x, float* y, i64 n, i64 c, i64 h, i64 w, const Pool2dParams& p) {
  check_dims(n, c, h, w);
  if (p.kind == PoolKind::max)
    pool_nhwc_impl<true>(x, y, n, c, h, w, p);
  else
    pool_nhwc_impl<false>(x, y, n, c, h, w, p);
}

void pool2d_blocked(const float* x, float* y, i64 n, i64 c, i64 h, i64 w, const Pool2dParams& p,
                    int block) {
  check_block(block);
  check_dims(n, c, h, w);
  const bool mx = p.kind == PoolKind::max;
  if (block == 8)
    mx ? pool_blocked_stride<true, 8>(x, y, n, c, h, w, p)
       : pool_blocked_stride<false, 8>(x, y, n, c, h, w, p);
  else
    mx ? pool_blocked_stride<true, 16>(x, y, n, c, h, w, p)
       : pool_blocked_stride<false, 16>(x, y, n, c, h, w, p);
}

void global_pool_nchw(PoolKind kind, const float* x, float* y, i64 n, i64 c, i64 spatial) {
  check_global(n, c, spatial);
  if (kind == PoolKind::max)
    global_nchw_impl<true>(x, y, n * c, spatial);
  else
    global_nchw_impl<false>(x, y, n * c, spatial);
}

void global_pool_nhwc(PoolKind kind, const float* x, float* y, i64 n, i64 c, i64 spatial) {
  check_global(n, c, spatial);
  if (kind == PoolKind::max)
    global_nhwc_impl<true>(x, y, n, c, spatial);
  else
    global_nhwc_impl<false>(x, y, n, c, spatial);
}

void global_pool_blocked(PoolKind kind, const float* x, float* y, i64 n, i64 c, i64 spatial,
                         int block) {
  check_block(block);
  check_global(n, c, spatial);
  const bool mx = kind == PoolKind::max;
  if (block == 8)
    mx ? global_blocked_impl<true, 8, v8f>(x, y, n, c, spatial)
       : global_blocked_impl<false, 8, v8f>(x, y, n, c, spatial);
  else
    mx ? global_blocked_impl<true, 16, v16f>(x, y, n, c, spatial)
       : global_blocked_impl<false, 16, v16f>(x, y, n, c, spatial);
}

}  // namespace opd
