// Per-ISA part of the packed SGEMM (see opdispatch/gemm.h): the register-blocked micro-kernels,
// the packing of A, the write-back epilogue and the loop over one block of C.
//
// Micro-kernel: an MR x 16 tile of C lives in registers (AVX-512: 14 x 1 zmm; AVX2: 6 x 2 ymm;
// portable: 3 x 4 xmm) while it runs over kc rows of a B panel (kc x 16 floats): per k, 16 / W
// vector loads of B, MR scalar loads of A broadcast, MR * 16 / W fused multiply-adds. Two ways
// to read A:
// - packed: A's rows of the block are copied once per K block into MR-row panels (kc x MR,
//   k-major), from a dense matrix of any strides or from an nhwc image (implicit im2col). It
//   pays off when many B panels reuse each A panel (wide blocks of C);
// - direct ("rows"): the kernel reads each A row in place through a pointer per row and K
//   segment (a dense row-major A: one segment; a convolution: one per kernel tap, or per kernel
//   row when the taps of a row are contiguous; padding taps point at zeros) — no copy at all,
//   which wins for narrow C (few output channels) and for convolutions with enough channels.
// Blocking (BLIS order): per K block, A is prepared once for the block's rows, then for each B
// panel (kept in L1) every A panel is swept; C tiles accumulate across K blocks and get the
// epilogue after the last one.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "opdispatch/gemm.h"
#include "opdispatch/vec.h"

namespace opd {
namespace OPD_ISA {
namespace {

#if defined(__AVX512F__)
typedef v16f V;
constexpr int kW = 16;
constexpr int kMR = 14;
#elif defined(__AVX2__)
typedef v8f V;
constexpr int kW = 8;
constexpr int kMR = 6;
#else
typedef float v4f __attribute__((vector_size(16)));
typedef v4f V;
constexpr int kW = 4;
constexpr int kMR = 3;
#endif
constexpr int kNR = static_cast<int>(kGemmNR);
constexpr int kNV = kNR / kW;  // vectors per tile row

using gemm_detail::GemmProblem;

// Asks for the C tile's cache lines early: the write-back then does not wait for them.
template <int M>
inline void prefetch_tile(float* c, std::int64_t ldc) {
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + kNR - 1, 1, 3);
  }
}

// c[0:M, 0:16] (+)= a_panel . b_panel over kc steps. a: kc x kMR (k-major), b: kc x 16.
// Split: two accumulator sets for even / odd k, so short tiles (few rows) still keep enough
// independent FMA chains in flight.
template <int M, bool Split>
inline void micro(std::int64_t kc, const float* __restrict a, const float* __restrict b,
                  float* __restrict c, std::int64_t ldc, bool accumulate) {
  constexpr int S = Split ? 2 : 1;
  prefetch_tile<M>(c, ldc);
  V acc[S][M][kNV];
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[s][i][v] = V{};
  std::int64_t k = 0;
  if (Split) {
    for (; k + 1 < kc; k += 2) {
#pragma GCC unroll 2
      for (int s = 0; s < S; ++s) {
        V bv[kNV];
#pragma GCC unroll 4
        for (int v = 0; v < kNV; ++v) bv[v] = vload<V>(b + (k + s) * kNR + v * kW);
#pragma GCC unroll 16
        for (int i = 0; i < M; ++i) {
          const float av = a[(k + s) * kMR + i];  // scalar operand: a broadcast
#pragma GCC unroll 4
          for (int v = 0; v < kNV; ++v) acc[s][i][v] += bv[v] * av;
        }
      }
    }
  }
  for (; k < kc; ++k) {
    V bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) bv[v] = vload<V>(b + k * kNR + v * kW);
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) {
      const float av = a[k * kMR + i];
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[0][i][v] += bv[v] * av;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) {
      V r = acc[0][i][v];
      if (Split) r += acc[S - 1][i][v];
      float* p = c + i * ldc + v * kW;
      if (accumulate) r += vload<V>(p);
      vstore(p, r);
    }
  }
}

using MicroFn = void (*)(std::int64_t, const float*, const float*, float*, std::int64_t, bool);

template <std::size_t... I>
constexpr auto micro_table(std::index_sequence<I...>) {
  // entry M - 1 runs an M-row tile; short tiles (M <= kMR / 2) split their accumulators
  return std::array<MicroFn, sizeof...(I)>{
      {&micro<static_cast<int>(I) + 1, (static_cast<int>(I) + 1) * 2 <= kMR>...}};
}

const auto kMicro = micro_table(std::make_index_sequence<kMR>{});

// The same tile computed straight from A's rows, without packing: the K block is a list of
// `nseg` segments; in segment s, row i's elements are rows[s * kMR + i][0 : lens[s]] (a dense
// row-major A: one segment per block; a convolution: one per kernel tap, the pointer at the
// input pixel the tap reads, or at zeros in the padding). b: the block's rows of a B panel.
template <int M, bool Split>
void micro_rows(std::int64_t nseg, const float* const* rows, const std::int64_t* lens,
                const float* __restrict b, float* __restrict c, std::int64_t ldc,
                bool accumulate) {
  constexpr int S = Split ? 2 : 1;
  prefetch_tile<M>(c, ldc);
  V acc[S][M][kNV];
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[s][i][v] = V{};
  for (std::int64_t sg = 0; sg < nseg; ++sg) {
    const float* p[M];
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) p[i] = rows[sg * kMR + i];
    const std::int64_t len = lens[sg];
    std::int64_t k = 0;
    if (Split) {
      for (; k + 1 < len; k += 2) {
#pragma GCC unroll 2
        for (int s = 0; s < S; ++s) {
          V bv[kNV];
#pragma GCC unroll 4
          for (int v = 0; v < kNV; ++v) bv[v] = vload<V>(b + (k + s) * kNR + v * kW);
#pragma GCC unroll 16
          for (int i = 0; i < M; ++i) {
            const float av = p[i][k + s];
#pragma GCC unroll 4
            for (int v = 0; v < kNV; ++v) acc[s][i][v] += bv[v] * av;
          }
        }
      }
    }
    for (; k < len; ++k) {
      V bv[kNV];
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) bv[v] = vload<V>(b + k * kNR + v * kW);
#pragma GCC unroll 16
      for (int i = 0; i < M; ++i) {
        const float av = p[i][k];
#pragma GCC unroll 4
        for (int v = 0; v < kNV; ++v) acc[0][i][v] += bv[v] * av;
      }
    }
    b += len * kNR;
  }
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) {
      V r = acc[0][i][v];
      if (Split) r += acc[S - 1][i][v];
      float* q = c + i * ldc + v * kW;
      if (accumulate) r += vload<V>(q);
      vstore(q, r);
    }
  }
}

using RowsFn = void (*)(std::int64_t, const float* const*, const std::int64_t*, const float*,
                        float*, std::int64_t, bool);

template <std::size_t... I>
constexpr auto rows_table(std::index_sequence<I...>) {
  return std::array<RowsFn, sizeof...(I)>{
      {&micro_rows<static_cast<int>(I) + 1, (static_cast<int>(I) + 1) * 2 <= kMR>...}};
}

const auto kMicroRows = rows_table(std::make_index_sequence<kMR>{});

// Columns a task may have and still read A unpacked (packing pays off over more panels).
constexpr std::int64_t kDirectMaxCols = 128;
// Channels per kernel tap from which a convolution reads its input unpacked.
constexpr std::int64_t kDirectMinChannels = 16;

// Packs rows [i0, i0 + mm) and columns [k0, k0 + kb) of a dense A into one kMR-row panel
// (kb x kMR, k-major), rows past mm zero.
void pack_dense_panel(const DenseA& a, std::int64_t i0, std::int64_t mm, std::int64_t k0,
                      std::int64_t kb, float* __restrict dst) {
  if (a.cs == 1) {
    for (std::int64_t i = 0; i < mm; ++i) {
      const float* src = a.a + (i0 + i) * a.rs + k0;
      for (std::int64_t r = 0; r < kb; ++r) dst[r * kMR + i] = src[r];
    }
  } else if (a.rs == 1) {
    for (std::int64_t r = 0; r < kb; ++r) {
      const float* src = a.a + (k0 + r) * a.cs + i0;
      for (std::int64_t i = 0; i < mm; ++i) dst[r * kMR + i] = src[i];
    }
  } else {
    for (std::int64_t i = 0; i < mm; ++i)
      for (std::int64_t r = 0; r < kb; ++r)
        dst[r * kMR + i] = a.a[(i0 + i) * a.rs + (k0 + r) * a.cs];
  }
  for (std::int64_t i = mm; i < kMR; ++i)
    for (std::int64_t r = 0; r < kb; ++r) dst[r * kMR + i] = 0.0f;
}

// Same for a convolution's implicit im2col matrix (see ConvA): each row is one output pixel,
// read as runs of channels per kernel tap (zeros where the tap falls in the padding).
void pack_conv_panel(const ConvA& a, std::int64_t i0, std::int64_t mm, std::int64_t k0,
                     std::int64_t kb, float* __restrict dst) {
  const std::int64_t plane = a.oh * a.ow;
  const std::int64_t end = k0 + kb;
  for (std::int64_t i = 0; i < mm; ++i) {
    const std::int64_t row = i0 + i;
    const std::int64_t b = row / plane, rem = row % plane;
    const std::int64_t iy0 = (rem / a.ow) * a.sh - a.pt, ix0 = (rem % a.ow) * a.sw - a.pl;
    const float* img = a.x + b * a.h * a.w * a.c + a.c0;
    std::int64_t r = k0, t = k0 / a.cg, ch = k0 % a.cg;
    while (r < end) {
      const std::int64_t iy = iy0 + (t / a.kw) * a.dh, ix = ix0 + (t % a.kw) * a.dw;
      const std::int64_t len = std::min(a.cg - ch, end - r);
      float* d = dst + (r - k0) * kMR + i;
      if (iy >= 0 && iy < a.h && ix >= 0 && ix < a.w) {
        const float* src = img + (iy * a.w + ix) * a.c + ch;
        for (std::int64_t l = 0; l < len; ++l) d[l * kMR] = src[l];
      } else {
        for (std::int64_t l = 0; l < len; ++l) d[l * kMR] = 0.0f;
      }
      r += len;
      ch = 0;
      ++t;
    }
  }
  for (std::int64_t i = mm; i < kMR; ++i)
    for (std::int64_t r = 0; r < kb; ++r) dst[r * kMR + i] = 0.0f;
}

void pack_panel(const GemmA& a, std::int64_t i0, std::int64_t mm, std::int64_t k0,
                std::int64_t kb, float* dst) {
  if (a.kind == GemmA::Kind::conv_nhwc)
    pack_conv_panel(a.conv, i0, mm, k0, kb, dst);
  else
    pack_dense_panel(a.dense, i0, mm, k0, kb, dst);
}

// The epilogue (see GemmEpilogue) on rows [i0, i0 + mm) x columns [j0, j0 + NN) of C at c.
// NN = 0: the column count is nn (a partial panel).
template <int NN>
void epilogue(const GemmEpilogue& ep, float* c, std::int64_t ldc, std::int64_t i0,
              std::int64_t mm, std::int64_t j0, std::int64_t nn_dyn) {
  const std::int64_t nn = NN ? NN : nn_dyn;
  for (std::int64_t i = 0; i < mm; ++i) {
    float* __restrict row = c + i * ldc;
    const std::int64_t gi = i0 + i;
    if (ep.alpha != 1.0f)
      for (std::int64_t j = 0; j < nn; ++j) row[j] *= ep.alpha;
    if (ep.bias) {
      const float* bp = ep.bias + gi * ep.bias_rs;
      const float beta = ep.beta;
      if (ep.bias_cs == 1) {
        for (std::int64_t j = 0; j < nn; ++j) row[j] += beta * bp[j0 + j];
      } else if (ep.bias_cs == 0) {
        const float bv = beta * bp[0];
        for (std::int64_t j = 0; j < nn; ++j) row[j] += bv;
      } else {
        for (std::int64_t j = 0; j < nn; ++j) row[j] += beta * bp[(j0 + j) * ep.bias_cs];
      }
    }
    if (ep.residual) {
      const float* rp = ep.residual + gi * ep.residual_ld + j0;
      for (std::int64_t j = 0; j < nn; ++j) row[j] += rp[j];
    }
    if (ep.act == Activation::relu) {
      for (std::int64_t j = 0; j < nn; ++j) row[j] = row[j] < 0.0f ? 0.0f : row[j];  // NaN stays
    } else if (ep.act == Activation::clip) {
      const float lo = ep.lo, hi = ep.hi;
      for (std::int64_t j = 0; j < nn; ++j) {
        const float v = row[j] < lo ? lo : row[j];
        row[j] = v > hi ? hi : v;
      }
    }
  }
}

// Segments of the K block [k0, k0 + kb) and, per A panel of rows [m0, m1), the row pointers of
// each segment (see micro_rows); rows past m1 point at zeros.
std::int64_t build_rows(const GemmA& a, std::int64_t m0, std::int64_t m1, std::int64_t k0,
                        std::int64_t kb, const float* zeros, std::vector<const float*>& rows,
                        std::vector<std::int64_t>& lens) {
  const std::int64_t panels = (m1 - m0 + kMR - 1) / kMR;
  lens.clear();
  if (a.kind == GemmA::Kind::dense) {
    lens.push_back(kb);
    rows.resize(static_cast<std::size_t>(panels * kMR));
    for (std::int64_t i = 0; i < panels * kMR; ++i)
      rows[static_cast<std::size_t>(i)] =
          m0 + i < m1 ? a.dense.a + (m0 + i) * a.dense.rs + k0 : zeros;
    return 1;
  }
  const ConvA& cv = a.conv;
  // a segment: kernel tap t (kx = 0 for a whole contiguous kernel row), from offset `chans`
  const std::int64_t run = cv.rows_contiguous ? cv.kw * cv.cg : cv.cg;
  std::vector<std::int64_t> taps, chans;
  for (std::int64_t r = k0; r < k0 + kb;) {
    const std::int64_t t = r / run, ch = r % run;
    const std::int64_t len = std::min(run - ch, k0 + kb - r);
    taps.push_back(cv.rows_contiguous ? t * cv.kw : t);
    chans.push_back(ch);
    lens.push_back(len);
    r += len;
  }
  const std::int64_t nseg = static_cast<std::int64_t>(lens.size());
  rows.resize(static_cast<std::size_t>(panels * nseg * kMR));
  const std::int64_t plane = cv.oh * cv.ow;
  for (std::int64_t q = 0; q < panels; ++q) {
    for (std::int64_t i = 0; i < kMR; ++i) {
      const std::int64_t row = m0 + q * kMR + i;
      const float** out = rows.data() + q * nseg * kMR + i;
      if (row >= m1) {
        for (std::int64_t sg = 0; sg < nseg; ++sg) out[sg * kMR] = zeros;
        continue;
      }
      const std::int64_t b = row / plane, rem = row % plane;
      const std::int64_t iy0 = (rem / cv.ow) * cv.sh - cv.pt, ix0 = (rem % cv.ow) * cv.sw - cv.pl;
      const float* img = cv.x + b * cv.h * cv.w * cv.c + cv.c0;
      for (std::int64_t sg = 0; sg < nseg; ++sg) {
        const std::int64_t t = taps[static_cast<std::size_t>(sg)];
        const std::int64_t iy = iy0 + (t / cv.kw) * cv.dh, ix = ix0 + (t % cv.kw) * cv.dw;
        out[sg * kMR] = iy >= 0 && iy < cv.h && ix >= 0 && ix < cv.w
                            ? img + (iy * cv.w + ix) * cv.c + chans[static_cast<std::size_t>(sg)]
                            : zeros;
      }
    }
  }
  return nseg;
}

// K == 0: C is the epilogue applied to zeros.
void empty_k(const GemmProblem& p, std::int64_t m0, std::int64_t m1, std::int64_t n0,
             std::int64_t n1) {
  for (std::int64_t i = m0; i < m1; ++i)
    std::fill(p.c + i * p.ldc + n0, p.c + i * p.ldc + n1, 0.0f);
  if (!p.ep.trivial()) epilogue<0>(p.ep, p.c + m0 * p.ldc + n0, p.ldc, m0, m1 - m0, n0, n1 - n0);
}

}  // namespace

int gemm_mr() { return kMR; }

void gemm_block(const GemmProblem& p, std::int64_t m0, std::int64_t m1, std::int64_t n0,
                std::int64_t n1) {
  if (m1 <= m0 || n1 <= n0) return;
  if (p.k == 0) {
    empty_k(p, m0, m1, n0, n1);
    return;
  }
  const std::int64_t mc = m1 - m0;
  const std::int64_t a_panels = (mc + kMR - 1) / kMR;
  const std::int64_t kc = std::max<std::int64_t>(1, std::min(p.kc, p.k));
  // read A in place (no packing) when few columns reuse each packed panel
  const bool direct =
      p.a.kind == GemmA::Kind::dense
          ? p.a.dense.cs == 1 && n1 - n0 <= kDirectMaxCols
          : p.a.conv.cg >= kDirectMinChannels || p.a.conv.rows_contiguous;
  thread_local std::vector<float> abuf;
  thread_local std::vector<float> zeros;
  thread_local std::vector<const float*> rows;
  thread_local std::vector<std::int64_t> lens;
  if (direct) {
    if (static_cast<std::int64_t>(zeros.size()) < kc) zeros.assign(static_cast<std::size_t>(kc), 0.0f);
  } else if (static_cast<std::int64_t>(abuf.size()) < a_panels * kMR * kc) {
    abuf.resize(static_cast<std::size_t>(a_panels * kMR * kc));
  }
  alignas(64) float tile[kMR * kNR];
  const bool epi = !p.ep.trivial();

  for (std::int64_t k0 = 0; k0 < p.k; k0 += kc) {
    const std::int64_t kb = std::min(kc, p.k - k0);
    const bool first = k0 == 0, last = k0 + kb >= p.k;
    std::int64_t nseg = 0;
    if (direct) {
      nseg = build_rows(p.a, m0, m1, k0, kb, zeros.data(), rows, lens);
    } else {
      for (std::int64_t q = 0; q < a_panels; ++q) {
        const std::int64_t i0 = m0 + q * kMR;
        pack_panel(p.a, i0, std::min<std::int64_t>(kMR, m1 - i0), k0, kb,
                   abuf.data() + q * kMR * kb);
      }
    }
    for (std::int64_t j = n0; j < n1; j += kNR) {
      const float* bp = p.b + (j / kNR) * p.k * kNR + k0 * kNR;
      const std::int64_t nn = std::min<std::int64_t>(kNR, p.n - j);
      for (std::int64_t q = 0; q < a_panels; ++q) {
        const std::int64_t i0 = m0 + q * kMR;
        const std::int64_t mm = std::min<std::int64_t>(kMR, m1 - i0);
        float* cp = p.c + i0 * p.ldc + j;
        float* dst = nn == kNR ? cp : tile;  // partial panel: through a tile, so columns
        const std::int64_t ld = nn == kNR ? p.ldc : kNR;  // past n are never written
        if (nn != kNR && !first)
          for (std::int64_t i = 0; i < mm; ++i)
            std::memcpy(tile + i * kNR, cp + i * p.ldc, sizeof(float) * nn);
        if (direct)
          kMicroRows[mm - 1](nseg, rows.data() + q * nseg * kMR, lens.data(), bp, dst, ld, !first);
        else
          kMicro[mm - 1](kb, abuf.data() + q * kMR * kb, bp, dst, ld, !first);
        if (nn != kNR)
          for (std::int64_t i = 0; i < mm; ++i)
            std::memcpy(cp + i * p.ldc, tile + i * kNR, sizeof(float) * nn);
        if (last && epi) {
          if (nn == kNR)
            epilogue<kNR>(p.ep, cp, p.ldc, i0, mm, j, kNR);
          else
            epilogue<0>(p.ep, cp, p.ldc, i0, mm, j, nn);
        }
      }
    }
  }
}

}  // namespace OPD_ISA
}  // namespace opd
