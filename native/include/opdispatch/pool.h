// Pooling kernels on float32 tensors in the native activation layouts.
//
// Layouts: nchw (row-major, the standard layout), nhwc (channels last), and nchw{B}c for
// B in {8, 16}: physical (N, ceil(C/B), H, W, B) with the channels past C zero. Kernels that
// write a blocked tensor keep those channels zero.
//
// pool2d_*: MaxPool / AveragePool over 2-D windows with ONNX's attributes resolved to explicit
// padding (auto_pad is turned into pad_begin / pad_end by the caller): kernel, strides,
// dilations, pads, ceil_mode and, for averages, count_include_pad. Windows only read the cells
// inside the input: a maximum never sees padding, an average divides its sum by the cells
// inside the input (count_include_pad = false) or inside input + explicit padding (true; the
// cells that ceil_mode windows reach past the end padding are never counted).
//
// global_pool_*: GlobalMaxPool / GlobalAveragePool over every spatial cell.
//
// Invalid parameters throw std::invalid_argument.
#pragma once

#include <cstdint>

namespace opd {

enum class PoolKind { max = 0, avg = 1 };

// One 2-D pooling window: index 0 is the height axis, 1 the width axis.
struct Pool2dParams {
  PoolKind kind = PoolKind::max;
  std::int64_t kernel[2] = {1, 1};
  std::int64_t stride[2] = {1, 1};
  std::int64_t dilation[2] = {1, 1};
  std::int64_t pad_begin[2] = {0, 0};  // top, left
  std::int64_t pad_end[2] = {0, 0};    // bottom, right
  bool ceil_mode = false;
  bool count_include_pad = false;  // AveragePool only
};

// Throws std::invalid_argument unless kernel, stride and dilation are >= 1 and pads >= 0.
void check_pool_params(const Pool2dParams& p);

// Output size along axis `axis` (0: height, 1: width) for an input extent `n`: ONNX's formula
// floor((n + pads - dilated kernel) / stride) + 1, rounded up with ceil_mode as long as the last
// window starts inside the input or its leading padding (with ceil_mode a window longer than the
// padded input by less than a stride still gives one output). Throws std::invalid_argument when
// the output would be empty.
std::int64_t pool_output_size(const Pool2dParams& p, int axis, std::int64_t n);

// y (N, C, OH, OW) = pool of x (N, C, H, W); threads over planes.
void pool2d_nchw(const float* x, float* y, std::int64_t n, std::int64_t c, std::int64_t h,
                 std::int64_t w, const Pool2dParams& p);

// y (N, OH, OW, C) = pool of x (N, H, W, C); vectorised over channels, threads over rows.
void pool2d_nhwc(const float* x, float* y, std::int64_t n, std::int64_t c, std::int64_t h,
                 std::int64_t w, const Pool2dParams& p);

// y (N, CB, OH, OW, B) = pool of x (N, CB, H, W, B), CB = ceil(c / block); runs of B
// channels per pixel, threads over (batch, channel block, output row).
void pool2d_blocked(const float* x, float* y, std::int64_t n, std::int64_t c, std::int64_t h,
                    std::int64_t w, const Pool2dParams& p, int block);

// y (N, C) = max / mean over the `spatial` cells of each plane of x (N, C, spatial).
void global_pool_nchw(PoolKind kind, const float* x, float* y, std::int64_t n, std::int64_t c,
                      std::int64_t spatial);

// y (N, C) = max / mean over the `spatial` pixels of x (N, spatial, C).
void global_pool_nhwc(PoolKind kind, const float* x, float* y, std::int64_t n, std::int64_t c,
                      std::int64_t spatial);

// y (N, CB, B) = max / mean over the `spatial` pixels of x (N, CB, spatial, B).
void global_pool_blocked(PoolKind kind, const float* x, float* y, std::int64_t n,
                         std::int64_t c, std::int64_t spatial, int block);

}  // namespace opd
