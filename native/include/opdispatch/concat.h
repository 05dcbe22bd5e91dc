// Concatenation kernels: pure data movement, so they work on bytes where they can.
//
// concat_rows: the general form of Concat in a row-major layout. With `outer` the product of
// the dimensions before the axis, input i is `outer` rows of row_bytes[i] bytes (its extent
// along the axis times everything after it) and the output row is the inputs' rows side by
// side. This covers Concat along any axis in the standard layout (any dtype), channel Concat
// in nhwc (outer = N*H*W, rows of C_i floats) and channel Concat in nchw{B}c when every input
// but the last fills whole blocks (outer = N, rows of the whole image).
//
// concat_blocked_channels: channel Concat in nchw{B}c for any channel counts.
#pragma once

#include <cstdint>
#include <vector>

namespace opd {

// out[o] = inputs[0][o] ++ inputs[1][o] ++ ... for each of `outer` rows (row_bytes[i] bytes of
// input i per row). Threads split the output into equal byte ranges.
void concat_rows(const std::vector<const void*>& inputs, const std::vector<std::int64_t>& row_bytes,
                 void* out, std::int64_t outer);

// Channel Concat of blocked tensors: input i is (n, ceil(channels[i]/B), hw, B) with zero
// padding channels, out is (n, ceil(sum(channels)/B), hw, B) with zero padding channels. When
// every input but the last has a multiple of B channels the blocks are copied whole
// (concat_rows); otherwise channels are re-packed across blocks pixel by pixel.
void concat_blocked_channels(const std::vector<const float*>& inputs,
                             const std::vector<std::int64_t>& channels, float* out,
                             std::int64_t n, std::int64_t hw, int block);

}  // namespace opd
