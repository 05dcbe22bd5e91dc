// Activation layout converters for rank-4 float32 tensors.
//
// Standard layout: nchw, row-major. Channels-last: nhwc. Blocked: nchw{B}c for B in {8, 16},
// physical shape (N, ceil(C/B), H, W, B) with the channels past C zero-filled, so kernels may
// read whole blocks. All functions write every element of `dst` (padding included).
#pragma once

#include <cstdint>

namespace opd {

void nchw_to_nhwc(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t h,
                  std::int64_t w);
void nhwc_to_nchw(const float* src, float* dst, std::int64_t n, std::int64_t c, std::int64_t h,
                  std::int64_t w);
void nchw_to_blocked(const float* src, float* dst, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w, int block);
void blocked_to_nchw(const float* src, float* dst, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w, int block);
void nhwc_to_blocked(const float* src, float* dst, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w, int block);
void blocked_to_nhwc(const float* src, float* dst, std::int64_t n, std::int64_t c,
                     std::int64_t h, std::int64_t w, int block);

// Zeroes the channels past `c` in the last block of a blocked tensor (after an op that may
// have written non-zero values there, e.g. Clip with min > 0).
void zero_block_tail(float* data, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                     int block);

// A plain parallel copy of `count` floats: the bandwidth baseline the converters are
// measured against.
void copy_floats(const float* src, float* dst, std::int64_t count);

}  // namespace opd
