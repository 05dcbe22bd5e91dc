// Concatenation kernels (see opdispatch/concat.h).
#include "opdispatch/concat.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "opdispatch/parallel.h"

namespace opd {
namespace {

using i64 = std::int64_t;

// Bytes per thread below which the copy stays on the calling thread.
constexpr i64 kGrainBytes = i64{1} << 16;

i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }

// One run of channels that stays inside one input block and one output block.
struct Segment {
  std::size_t input;  // which input
  i64 in_block;       // block of that input
  i64 in_off;         // first channel inside the input block
  i64 out_off;        // first channel inside the output block
  i64 len;            // channels
};

// Segments of each output block, in channel order.
std::vector<std::vector<Segment>> plan_segments(const std::vector<i64>& channels, i64 block) {
  i64 total = 0;
  for (i64 c : channels) total += c;
  std::vector<std::vector<Segment>> segs(static_cast<std::size_t>(cdiv(total, block)));
  i64 oc = 0;
  for (std::size_t j = 0; j < channels.size(); ++j) {
    for (i64 ch = 0; ch < channels[j];) {
      const i64 len = std::min({block - oc % block, block - ch % block, channels[j] - ch});
      segs[oc / block].push_back({j, ch / block, ch % block, oc % block, len});
      oc += len;
      ch += len;
    }
  }
  return segs;
}

// General blocked channel Concat: every output pixel vector is assembled from its segments.
void repack_blocked(const std::vector<const float*>& inputs, const std::vector<i64>& channels,
                    float* out, i64 n, i64 hw, i64 block) {
  const auto segs = plan_segments(channels, block);
  const i64 ocb = static_cast<i64>(segs.size());
  i64 total = 0;
  for (i64 c : channels) total += c;
  const i64 tail = total % block;  // channels in use in the last output block (0: full)
  std::vector<i64> in_blocks(channels.size());
  for (std::size_t j = 0; j < channels.size(); ++j) in_blocks[j] = cdiv(channels[j], block);
  const i64 items = n * ocb * hw;  // output pixel vectors
  const i64 grain = std::max<i64>(1, kGrainBytes / (block * static_cast<i64>(sizeof(float))));
  auto run = [&](i64 b, i64 e) {
    while (b < e) {
      const i64 item = b / hw, p0 = b % hw, len = std::min(hw - p0, e - b);
      const i64 img = item / ocb, ob = item % ocb;
      float* dst = out + b * block;
      if (tail && ob == ocb - 1)
        for (i64 p = 0; p < len; ++p) std::fill(dst + p * block + tail, dst + (p + 1) * block, 0.0f);
      for (const Segment& s : segs[static_cast<std::size_t>(ob)]) {
        const float* src = inputs[s.input] +
                           ((img * in_blocks[s.input] + s.in_block) * hw + p0) * block + s.in_off;
        float* d = dst + s.out_off;
        for (i64 p = 0; p < len; ++p)
          for (i64 k = 0; k < s.len; ++k) d[p * block + k] = src[p * block + k];
      }
      b += len;
    }
  };
  if (items <= grain)
    run(0, items);
  else
    parallel_chunks(items, grain, run);
}

}  // namespace

void concat_rows(const std::vector<const void*>& inputs, const std::vector<i64>& row_bytes,
                 void* out, i64 outer) {
  if (inputs.empty() || inputs.size() != row_bytes.size())
    throw std::invalid_argument("concat_rows: expected one row size per input (at least one), "
                                "received " + std::to_string(inputs.size()) + " inputs and " +
                                std::to_string(row_bytes.size()) + " row sizes");
  if (outer < 0) throw std::invalid_argument("concat_rows: negative row count");
  std::vector<i64> off(row_bytes.size());
  i64 row = 0;
  for (std::size_t i = 0; i < row_bytes.size(); ++i) {
    if (row_bytes[i] < 0) throw std::invalid_argument("concat_rows: negative row size");
    off[i] = row;
    row += row_bytes[i];
  }
  const i64 total = row * outer;
  if (total == 0) return;
  auto* dst = static_cast<unsigned char*>(out);
  // copies output bytes [b, e): walks the (row, input) segments that range crosses
  auto copy_range = [&](i64 b, i64 e) {
    i64 o = b / row, r = b % row;
    std::size_t i = 0;
    while (r >= off[i] + row_bytes[i]) ++i;
    while (b < e) {
      const i64 len = std::min(off[i] + row_bytes[i] - r, e - b);
      const auto* src = static_cast<const unsigned char*>(inputs[i]);
      std::memcpy(dst + b, src + o * row_bytes[i] + (r - off[i]), static_cast<std::size_t>(len));
      b += len;
      r += len;
      if (b >= e) break;
      if (r == row) {
        r = 0;
        ++o;
        i = 0;
      }
      while (r >= off[i] + row_bytes[i]) ++i;
    }
  };
  if (total <= kGrainBytes)
    copy_range(0, total);
  else
    parallel_chunks(total, kGrainBytes, copy_range);
}

void concat_blocked_channels(const std::vector<const float*>& inputs,
                             const std::vector<i64>& channels, float* out, i64 n, i64 hw,
                             int block) {
  if (block != 8 && block != 16)
    throw std::invalid_argument("concat: channel block must be 8 or 16, received " +
                                std::to_string(block));
  if (inputs.empty() || inputs.size() != channels.size())
    throw std::invalid_argument("concat: expected one channel count per input (at least one), "
                                "received " + std::to_string(inputs.size()) + " inputs and " +
                                std::to_string(channels.size()) + " channel counts");
  if (n < 0 || hw < 0) throw std::invalid_argument("concat: negative batch or spatial size");
  bool whole_blocks = true;
  for (std::size_t j = 0; j < channels.size(); ++j) {
    if (channels[j] < 0) throw std::invalid_argument("concat: negative channel count");
    if (j + 1 < channels.size() && channels[j] % block != 0) whole_blocks = false;
  }
  if (whole_blocks) {
    // the last input's padding becomes the output's padding: copy whole images of blocks
    std::vector<const void*> ptrs(inputs.begin(), inputs.end());
    std::vector<i64> rows(channels.size());
    for (std::size_t j = 0; j < channels.size(); ++j)
      rows[j] = cdiv(channels[j], block) * hw * block * static_cast<i64>(sizeof(float));
    concat_rows(ptrs, rows, out, n);
    return;
  }
  repack_blocked(inputs, channels, out, n, hw, block);
}

}  // namespace opd
