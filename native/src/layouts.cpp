// Activation layout converters (see opdispatch/layouts.h). Transposes go through small tiles so
// that both the reads and the writes stay in cache lines.
#include "opdispatch/layouts.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "opdispatch/parallel.h"

namespace opd {
namespace {

constexpr std::int64_t kTile = 16;

// dst[j * ld_dst + i] = src[i * ld_src + j] for an r x c tile
inline void transpose_tile(const float* src, std::int64_t ld_src, float* dst, std::int64_t ld_dst,
                           std::int64_t r, std::int64_t c) {
  if (r == kTile && c == kTile) {  // full tile: fixed trip counts, unrolled by the compiler
    for (std::int64_t j = 0; j < kTile; ++j)
      for (std::int64_t i = 0; i < kTile; ++i) dst[j * ld_dst + i] = src[i * ld_src + j];
    return;
  }
  for (std::int64_t j = 0; j < c; ++j)
    for (std::int64_t i = 0; i < r; ++i) dst[j * ld_dst + i] = src[i * ld_src + j];
}

// Transposes a rows x cols matrix into cols x rows, tile by tile. Threads split the
// destination's rows, so each thread writes one contiguous range (no shared cache lines).
void transpose(const float* src, float* dst, std::int64_t rows, std::int64_t cols) {
  const std::int64_t col_tiles = (cols + kTile - 1) / kTile;
  const std::int64_t grain = std::max<std::int64_t>(1, (1 << 14) / std::max<std::int64_t>(rows * kTile, 1));
  parallel_chunks(col_tiles, grain, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t j0 = t * kTile;
      const std::int64_t c = std::min(kTile, cols - j0);
      for (std::int64_t i0 = 0; i0 < rows; i0 += kTile) {
        const std::int64_t r = std::min(kTile, rows - i0);
        transpose_tile(src + i0 * cols + j0, cols, dst + j0 * rows + i0, rows, r, c);
      }
    }
  });
}

void check_block(int block) {
  if (block != 8 && block != 16)
    throw std::invalid_argument("channel block must be 8 or 16, received " +
                                std::to_string(block));
}

}  // namespace

void nchw_to_nhwc(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t h,
                  std::int64_t w) {
  const std::int64_t hw = h * w;
  for (std::int64_t b = 0; b < n; ++b) transpose(src + b * c * hw, dst + b * c * hw, c, hw);
}

void nhwc_to_nchw(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t h,
                  std::int64_t w) {
  const std::int64_t hw = h * w;
  for (std::int64_t b = 0; b < n; ++b) transpose(src + b * c * hw, dst + b * c * hw, hw, c);
}

void nchw_to_blocked(const float* src, float* dst, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w, int block) {
  check_block(block);
  const std::int64_t hw = h * w, cb = (c + block - 1) / block;
  parallel_for(n * cb, [&](std::int64_t t) {
    const std::int64_t b = t / cb, k = t % cb;
    const std::int64_t c0 = k * block, cn = std::min<std::int64_t>(block, c - c0);
    const float* s = src + (b * c + c0) * hw;
    float* d = dst + t * hw * block;
    for (std::int64_t p0 = 0; p0 < hw; p0 += kTile) {
      const std::int64_t pn = std::min(kTile, hw - p0);
      for (std::int64_t p = 0; p < pn; ++p) {
        float* dp = d + (p0 + p) * block;
        for (std::int64_t i = 0; i < cn; ++i) dp[i] = s[i * hw + p0 + p];
        for (std::int64_t i = cn; i < block; ++i) dp[i] = 0.0f;
      }
    }
  });
}

void blocked_to_nchw(const float* src, float* dst, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w, int block) {
  check_block(block);
  const std::int64_t hw = h * w, cb = (c + block - 1) / block;
  parallel_for(n * cb, [&](std::int64_t t) {
    const std::int64_t b = t / cb, k = t % cb;
    const std::int64_t c0 = k * block, cn = std::min<std::int64_t>(block, c - c0);
    const float* s = src + t * hw * block;
    float* d = dst + (b * c + c0) * hw;
    for (std::int64_t p0 = 0; p0 < hw; p0 += kTile) {
      const std::int64_t pn = std::min(kTile, hw - p0);
      for (std::int64_t i = 0; i < cn; ++i) {
        float* di = d + i * hw + p0;
        const float* si = s + p0 * block + i;
        for (std::int64_t p = 0; p < pn; ++p) di[p] = si[p * block];
      }
    }
  });
}

void nhwc_to_blocked(const float* src, float* dst, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w, int block) {
  check_block(block);
  const std::int64_t hw = h * w, cb = (c + block - 1) / block;
  parallel_for(n * cb, [&](std::int64_t t) {
    const std::int64_t b = t / cb, k = t % cb;
    const std::int64_t c0 = k * block, cn = std::min<std::int64_t>(block, c - c0);
    const float* s = src + b * hw * c + c0;
    float* d = dst + t * hw * block;
    for (std::int64_t p = 0; p < hw; ++p) {
      std::memcpy(d + p * block, s + p * c, sizeof(float) * cn);
      for (std::int64_t i = cn; i < block; ++i) d[p * block + i] = 0.0f;
    }
  });
}

void blocked_to_nhwc(const float* src, float* dst, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w, int block) {
  check_block(block);
  const std::int64_t hw = h * w, cb = (c + block - 1) / block;
  parallel_for(n * cb, [&](std::int64_t t) {
    const std::int64_t b = t / cb, k = t % cb;
    const std::int64_t c0 = k * block, cn = std::min<std::int64_t>(block, c - c0);
    const float* s = src + t * hw * block;
    float* d = dst + b * hw * c + c0;
    for (std::int64_t p = 0; p < hw; ++p) std::memcpy(d + p * c, s + p * block, sizeof(float) * cn);
  });
}

void zero_block_tail(float* data, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                     int block) {
  check_block(block);
  const std::int64_t cb = (c + block - 1) / block, hw = h * w, rem = c % block;
  if (rem == 0) return;
  parallel_for(n, [&](std::int64_t b) {
    float* d = data + ((b * cb) + cb - 1) * hw * block;
    for (std::int64_t p = 0; p < hw; ++p)
      for (std::int64_t i = rem; i < block; ++i) d[p * block + i] = 0.0f;
  });
}

void copy_floats(const float* src, float* dst, std::int64_t count) {
  parallel_chunks(count, 1 << 16, [&](std::int64_t b, std::int64_t e) {
    std::memcpy(dst + b, src + b, sizeof(float) * (e - b));
  });
}

}  // namespace opd
