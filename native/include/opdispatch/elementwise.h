// Elementwise kernels on float32 buffers. They work on physical buffers, so the same kernel
// serves every layout; callers keep the zero padding of blocked layouts (see zero_block_tail).
#pragma once

#include <cstdint>
#include <vector>

namespace opd {

enum class BinaryOp { add = 0, sub = 1, mul = 2, div = 3, max = 4, min = 5 };

// y = max(x, 0); x and y may alias.
void relu(const float* x, float* y, std::int64_t count);

// y = min(max(x, lo), hi); x and y may alias.
void clip(const float* x, float* y, std::int64_t count, float lo, float hi);

// y = a op b elementwise over `count` items, then max(y, 0) when `relu` is set.
void binary_same(BinaryOp op, const float* a, const float* b, float* y, std::int64_t count,
                 bool relu);

// numpy-style broadcasting: `out_shape` is the result shape; `a_strides`/`b_strides` are the
// inputs' element strides aligned to out_shape (0 on broadcast dimensions).
void binary_broadcast(BinaryOp op, const float* a, const std::vector<std::int64_t>& a_strides,
                      const float* b, const std::vector<std::int64_t>& b_strides, float* y,
                      const std::vector<std::int64_t>& out_shape);

// y = sum of the `inputs` (all `count` items long).
void sum_n(const std::vector<const float*>& inputs, float* y, std::int64_t count);

}  // namespace opd
