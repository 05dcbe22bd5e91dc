// Per-channel affine kernels on float32 tensors in the native activation layouts:
// y = x * scale[c] + bias[c]. They run BatchNormalization in inference form (its constants
// folded into scale and bias, see fold_batchnorm) and Mul / Add by a per-channel constant.
//
// Layouts: nchw (any rank: (N, C, spatial...) flattened to (N, C, S)), nhwc ((N, S, C)) and
// nchw{B}c ((N, ceil(C/B), S, B); the padding channels of the output are written as zero).
// `scale` or `bias` may be null (scale 1, bias 0). y must not overlap x.
#pragma once

#include <cstdint>

namespace opd {

// a[c] = scale[c] / sqrt(var[c] + eps), b[c] = bias[c] - mean[c] * a[c], computed in double.
void fold_batchnorm(const float* scale, const float* bias, const float* mean, const float* var,
                    std::int64_t c, double eps, float* a, float* b);

// y (N, C, S) = x * scale[c] + bias[c]; threads over chunks of the flattened (plane, cell) range.
void channel_affine_nchw(const float* x, float* y, const float* scale, const float* bias,
                         std::int64_t n, std::int64_t c, std::int64_t spatial);

// y (N, S, C) = x * scale[c] + bias[c]; vectorised over channels, threads over pixels.
void channel_affine_nhwc(const float* x, float* y, const float* scale, const float* bias,
                         std::int64_t n, std::int64_t c, std::int64_t spatial);

// y (N, CB, S, B) = x * scale[c] + bias[c] with `scale` / `bias` of c entries; one vector of B
// channels per pixel; the padding channels of y are zero whatever x holds there.
void channel_affine_blocked(const float* x, float* y, const float* scale, const float* bias,
                            std::int64_t n, std::int64_t c, std::int64_t spatial, int block);

}  // namespace opd
