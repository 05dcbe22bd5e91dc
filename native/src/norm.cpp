// Per-channel affine kernels (see opdispatch/norm.h). All three are streaming kernels: one read
// and one write per element, so they are split into equal chunks of the flattened tensor across
// the threads (even a single image with few channels keeps every thread busy).
// Wide vectors (v8f, v16f) only pass between inlined helpers of this file; the baseline build
// notes that their ABI differs from AVX builds, which never matters here.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "opdispatch/norm.h"

#include <algorithm>
#include <cstring>
#include <cmath>
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

// Elements per thread below which the threads are not woken.
constexpr i64 kGrain = i64{1} << 14;

i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }

void check_dims(i64 n, i64 c, i64 spatial) {
  if (n < 0 || c < 0 || spatial < 0)
    throw std::invalid_argument("channel_affine: expected non-negative N, C and spatial size, "
                                "received N=" + std::to_string(n) + " C=" + std::to_string(c) +
                                " spatial=" + std::to_string(spatial));
}

// Runs fn(begin, end) over chunks of [0, items), each at least `grain` items long.
template <class Fn>
void for_chunks(i64 items, i64 grain, Fn&& fn) {
  if (items <= grain) {
    if (items > 0) fn(i64{0}, items);
    return;
  }
  parallel_chunks(items, grain, fn);
}

template <bool HasScale, bool HasBias>
inline void affine_row(const float* __restrict x, float* __restrict y, float a, float b, i64 len) {
  for (i64 i = 0; i < len; ++i) {
    float v = x[i];
    if constexpr (HasScale) v *= a;
    if constexpr (HasBias) v += b;
    y[i] = v;
  }
}

template <bool HasScale, bool HasBias>
inline void affine_vec_row(const float* __restrict x, float* __restrict y,
                           const float* __restrict a, const float* __restrict b, i64 len) {
  for (i64 i = 0; i < len; ++i) {
    float v = x[i];
    if constexpr (HasScale) v *= a[i];
    if constexpr (HasBias) v += b[i];
    y[i] = v;
  }
}

template <bool HasScale, bool HasBias>
void nchw_impl(const float* x, float* y, const float* scale, const float* bias, i64 n, i64 c,
               i64 spatial) {
  // chunks of the flattened (plane, cell) range; a chunk may span several planes
  for_chunks(n * c * spatial, kGrain, [&](i64 b, i64 e) {
    while (b < e) {
      const i64 plane = b / spatial, s0 = b % spatial;
      const i64 len = std::min(spatial - s0, e - b);
      const i64 ch = plane % c;
      affine_row<HasScale, HasBias>(x + b, y + b, HasScale ? scale[ch] : 1.0f,
                                    HasBias ? bias[ch] : 0.0f, len);
      b += len;
    }
  });
}

template <bool HasScale, bool HasBias>
void nhwc_impl(const float* x, float* y, const float* scale, const float* bias, i64 n, i64 c,
               i64 spatial) {
  const i64 grain = std::max<i64>(1, kGrain / std::max<i64>(c, 1));
  for_chunks(n * spatial, grain, [&](i64 b, i64 e) {
    for (i64 p = b; p < e; ++p)
      affine_vec_row<HasScale, HasBias>(x + p * c, y + p * c, scale, bias, c);
  });
}

template <bool HasScale, bool HasBias, int B, class V>
void blocked_impl(const float* x, float* y, const float* scale, const float* bias, i64 n, i64 c,
                  i64 spatial) {
  const i64 cb = cdiv(c, B);
  // per-block parameter vectors; zero in the padding channels so the padding of y is zero
  std::vector<float> a(static_cast<std::size_t>(cb * B), 0.0f), bb(a.size(), 0.0f);
  if (HasScale) std::copy(scale, scale + c, a.begin());
  if (HasBias) std::copy(bias, bias + c, bb.begin());
  const bool zero_tail = !HasScale && c % B != 0;  // bias alone keeps x's padding: force zero
  const i64 grain = std::max<i64>(1, kGrain / B);
  // chunks of the flattened (batch * block, pixel) range
  for_chunks(n * cb * spatial, grain, [&](i64 b, i64 e) {
    while (b < e) {
      const i64 item = b / spatial, s0 = b % spatial;
      const i64 len = std::min(spatial - s0, e - b);
      const i64 k = item % cb;
      const V va = load<V>(a.data() + k * B), vb = load<V>(bb.data() + k * B);
      V mask = splat<V>(1.0f);
      if (zero_tail && k == cb - 1)
        for (int i = static_cast<int>(c % B); i < B; ++i) mask[i] = 0.0f;
      const float* src = x + b * B;
      float* dst = y + b * B;
      for (i64 s = 0; s < len; ++s) {
        V v = load<V>(src + s * B);
        if constexpr (HasScale) v *= va;
        if constexpr (!HasScale) v *= mask;
        if constexpr (HasBias) v += vb;
        store(dst + s * B, v);
      }
      b += len;
    }
  });
}

template <template <bool, bool> class Run, class... Args>
void dispatch(const float* scale, const float* bias, Args... args) {
  if (scale && bias)
    Run<true, true>::run(scale, bias, args...);
  else if (scale)
    Run<true, false>::run(scale, bias, args...);
  else if (bias)
    Run<false, true>::run(scale, bias, args...);
  else
    Run<false, false>::run(scale, bias, args...);
}

template <bool S, bool B>
struct NchwRun {
  static void run(const float* scale, const float* bias, const float* x, float* y, i64 n, i64 c,
                  i64 sp) {
    nchw_impl<S, B>(x, y, scale, bias, n, c, sp);
  }
};

template <bool S, bool B>
struct NhwcRun {
  static void run(const float* scale, const float* bias, const float* x, float* y, i64 n, i64 c,
                  i64 sp) {
    nhwc_impl<S, B>(x, y, scale, bias, n, c, sp);
  }
};

template <bool S, bool B>
struct BlockedRun {
  static void run(const float* scale, const float* bias, const float* x, float* y, i64 n, i64 c,
                  i64 sp, int block) {
    if (block == 8)
      blocked_impl<S, B, 8, v8f>(x, y, scale, bias, n, c, sp);
    else
      blocked_impl<S, B, 16, v16f>(x, y, scale, bias, n, c, sp);
  }
};

}  // namespace

void fold_batchnorm(const float* scale, const float* bias, const float* mean, const float* var,
                    i64 c, double eps, float* a, float* b) {
  if (c < 0) throw std::invalid_argument("fold_batchnorm: negative channel count");
  for (i64 i = 0; i < c; ++i) {
    const double s = static_cast<double>(scale[i]) / std::sqrt(static_cast<double>(var[i]) + eps);
    a[i] = static_cast<float>(s);
    b[i] = static_cast<float>(static_cast<double>(bias[i]) - static_cast<double>(mean[i]) * s);
  }
}

void channel_affine_nchw(const float* x, float* y, const float* scale, const float* bias, i64 n,
                         i64 c, i64 spatial) {
  check_dims(n, c, spatial);
  dispatch<NchwRun>(scale, bias, x, y, n, c, spatial);
}

void channel_affine_nhwc(const float* x, float* y, const float* scale, const float* bias, i64 n,
                         i64 c, i64 spatial) {
  check_dims(n, c, spatial);
  dispatch<NhwcRun>(scale, bias, x, y, n, c, spatial);
}

void channel_affine_blocked(const float* x, float* y, const float* scale, const float* bias,
                            i64 n, i64 c, i64 spatial, int block) {
  if (block != 8 && block != 16)
    throw std::invalid_argument("channel_affine: channel block must be 8 or 16, received " +
                                std::to_string(block));
  check_dims(n, c, spatial);
  dispatch<BlockedRun>(scale, bias, x, y, n, c, spatial, block);
}

}  // namespace opd
