// The ISA-independent part of the packed SGEMM (see opdispatch/gemm.h): packing of B and of
// Conv weights, the choice of blocks and their distribution over threads, and the Conv drivers
// built on the GEMM.
#include "opdispatch/gemm.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "opdispatch/parallel.h"

namespace opd {
namespace {

using gemm_detail::GemmProblem;

// Rows per A panel of the active ISA's micro-kernel.
int active_mr() {
  switch (active_isa()) {
#if OPD_HAVE_X86
    case Isa::avx512: return avx512::gemm_mr();
    case Isa::avx2: return avx2::gemm_mr();
#endif
    default: return generic::gemm_mr();
  }
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// How C is cut into tasks: mb x nb blocks of mc rows and ncp 16-column panels.
struct BlockPlan {
  std::int64_t mc = 0, mb = 1, ncp = 0, nb = 1, kc = 256;
};

// Cache blocking, measured on AVX2 (2048^3 and ResNet-50 shapes): K blocks of up to 512 (B's
// micro-panel then stays in L1/L2 while the A panels sweep it), M blocks of up to 512 rows.
constexpr std::int64_t kKcMax = 512;
constexpr int kMcMax = 512;
constexpr std::int64_t kMinParallelMacs = 1 << 16;

// K block: whole K up to kKcMax, else K split evenly into blocks of at most kKcMax.
std::int64_t choose_kc(std::int64_t k) {
  if (k <= kKcMax) return std::max<std::int64_t>(k, 1);
  const std::int64_t blocks = ceil_div(k, kKcMax);
  return ceil_div(ceil_div(k, blocks), 8) * 8;
}

// Picks the blocks that minimise a simple cost model of the slowest thread: each task costs
// its multiply-adds plus packing its A rows (per task, so a task with few columns pays
// relatively more) plus streaming its B panels through the caches (per task, so short M
// blocks pay relatively more: measured ~15% at 128 rows on 2048^3) plus a fixed overhead.
BlockPlan plan_blocks(std::int64_t m, std::int64_t n, std::int64_t k, int mr, int threads) {
  BlockPlan best;
  // one row panel: nothing reuses a B panel, so B streams through once over the whole K
  best.kc = m <= mr ? std::max<std::int64_t>(k, 1) : choose_kc(k);
  const std::int64_t panels = gemm_panels(n);
  const std::int64_t mc_max = mr * std::max(1, kMcMax / mr);
  const std::int64_t mb0 = ceil_div(m, mc_max);
  const std::int64_t mb_cap = std::max<std::int64_t>(1, ceil_div(m, mr));
  const std::int64_t nb_cap = std::min<std::int64_t>(panels, 8 * threads);
  // M block counts tried: multiples of the smallest, and the thread multiples around it
  // (rows per block may then exceed mc_max by up to a quarter)
  std::vector<std::int64_t> mbs;
  for (std::int64_t mult = 1; mult <= 4; ++mult) mbs.push_back(std::min(mb0 * mult, mb_cap));
  for (std::int64_t t : {mb0 / threads * threads, ceil_div(mb0, threads) * threads})
    if (t >= 1 && t <= mb_cap && ceil_div(m, t) * 4 <= mc_max * 5) mbs.push_back(t);
  double best_cost = -1.0;
  for (std::int64_t nb_try = 1; nb_try <= std::max<std::int64_t>(nb_cap, 1); ++nb_try) {
    const std::int64_t ncp = ceil_div(panels, nb_try);
    const std::int64_t nb = ceil_div(panels, std::max<std::int64_t>(ncp, 1));
    for (const std::int64_t mb_try : mbs) {
      const std::int64_t mc = ceil_div(ceil_div(m, mb_try), mr) * mr;
      const std::int64_t mb = ceil_div(m, mc);
      const std::int64_t tasks = mb * nb;
      const std::int64_t rounds = threads > 1 ? ceil_div(tasks, threads) : tasks;
      const double task = static_cast<double>(mc) * ncp * kGemmNR * k + 8.0 * mc * k +
                          16.0 * ncp * kGemmNR * k + 2000.0;
      const double cost = rounds * task;
      if (best_cost < 0 || cost < best_cost * 0.999) {
        best_cost = cost;
        best.mc = mc;
        best.mb = mb;
        best.ncp = ncp;
        best.nb = nb;
      }
    }
  }
  return best;
}

void run_block(const GemmProblem& p, std::int64_t m0, std::int64_t m1, std::int64_t n0,
               std::int64_t n1) {
  OPD_ISA_CALL(gemm_block, p, m0, m1, n0, n1);
}

// Packs panels [p0, p1) of B (see pack_b) on the calling thread.
void pack_b_panels(const float* b, std::int64_t k, std::int64_t n, std::int64_t rs,
                   std::int64_t cs, float* dst, std::int64_t p0, std::int64_t p1) {
  for (std::int64_t p = p0; p < p1; ++p) {
    float* d = dst + p * k * kGemmNR;
    const std::int64_t j0 = p * kGemmNR, nn = std::min(kGemmNR, n - j0);
    if (nn < kGemmNR) std::fill(d, d + k * kGemmNR, 0.0f);
    if (cs == 1) {  // rows of B contiguous
      for (std::int64_t r = 0; r < k; ++r)
        std::memcpy(d + r * kGemmNR, b + r * rs + j0, sizeof(float) * nn);
    } else {  // columns of B contiguous (transposed) or general strides
      for (std::int64_t j = 0; j < nn; ++j) {
        const float* src = b + (j0 + j) * cs;
        for (std::int64_t r = 0; r < k; ++r) d[r * kGemmNR + j] = src[r * rs];
      }
    }
  }
}

void check_nonneg(std::int64_t v, const char* what) {
  if (v < 0)
    throw std::invalid_argument(std::string("gemm: ") + what + " must be >= 0, received " +
                                std::to_string(v));
}

}  // namespace

void pack_b(const float* b, std::int64_t k, std::int64_t n, std::int64_t rs, std::int64_t cs,
            float* dst) {
  parallel_chunks(gemm_panels(n), std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(k, 1)),
                  [&](std::int64_t p0, std::int64_t p1) {
                    pack_b_panels(b, k, n, rs, cs, dst, p0, p1);
                  });
}

void unpack_b(const float* packed, std::int64_t k, std::int64_t n, std::int64_t rs,
              std::int64_t cs, float* dst) {
  parallel_chunks(gemm_panels(n), 1, [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      const float* s = packed + p * k * kGemmNR;
      const std::int64_t j0 = p * kGemmNR, nn = std::min(kGemmNR, n - j0);
      for (std::int64_t r = 0; r < k; ++r)
        for (std::int64_t j = 0; j < nn; ++j) dst[r * rs + (j0 + j) * cs] = s[r * kGemmNR + j];
    }
  });
}

void gemm_packed(std::int64_t m, std::int64_t n, std::int64_t k, const GemmA& a,
                 const float* b_packed, float* c, std::int64_t ldc, const GemmEpilogue& ep,
                 bool threaded) {
  check_nonneg(m, "m");
  check_nonneg(n, "n");
  check_nonneg(k, "k");
  if (ldc < n) throw std::invalid_argument("gemm: ldc must be >= n");
  if (m == 0 || n == 0) return;
  // below ~64K multiply-adds, waking the other threads costs more than it saves
  const int threads = threaded && m * n * k >= kMinParallelMacs ? num_threads() : 1;
  const BlockPlan bp = plan_blocks(m, n, k, active_mr(), threads);
  GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = a;
  p.b = b_packed;
  p.c = c;
  p.ldc = ldc;
  p.ep = ep;
  p.kc = bp.kc;
  const std::int64_t tasks = bp.mb * bp.nb;
  auto task = [&](std::int64_t t) {
    // task order: N block major, so consecutive tasks (one thread's share) reuse B panels
    const std::int64_t nj = t / bp.mb, mi = t % bp.mb;
    const std::int64_t m0 = mi * bp.mc, m1 = std::min(m, m0 + bp.mc);
    const std::int64_t n0 = nj * bp.ncp * kGemmNR, n1 = std::min(n, n0 + bp.ncp * kGemmNR);
    run_block(p, m0, m1, n0, n1);
  };
  if (threads > 1 && tasks > 1) {
    parallel_for(tasks, task);
  } else {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
  }
}

void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const DenseA& a, const float* b,
          std::int64_t b_rs, std::int64_t b_cs, float* c, std::int64_t ldc,
          const GemmEpilogue& ep, bool threaded) {
  check_nonneg(m, "m");
  check_nonneg(n, "n");
  check_nonneg(k, "k");
  std::vector<float> packed(static_cast<std::size_t>(packed_b_size(k, n)));
  if (threaded)
    pack_b(b, k, n, b_rs, b_cs, packed.data());
  else  // the caller parallelises over independent GEMMs
    pack_b_panels(b, k, n, b_rs, b_cs, packed.data(), 0, gemm_panels(n));
  GemmA ga;
  ga.dense = a;
  gemm_packed(m, n, k, ga, packed.data(), c, ldc, ep, threaded);
}

// ---- convolutions -------------------------------------------------------------------------

void check_conv_geom(const ConvGeom& g, std::int64_t pb, std::int64_t pr) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("conv: " + what); };
  if (g.n < 0 || g.h < 0 || g.w < 0 || g.c < 1 || g.m < 1 || g.oh < 0 || g.ow < 0)
    bad("sizes must be non-negative (channels >= 1)");
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1)
    bad("kernel, strides and dilations must be >= 1");
  if (g.pt < 0 || g.pl < 0 || pb < 0 || pr < 0) bad("pads must be >= 0");
  if (g.group < 1 || g.c % g.group || g.m % g.group)
    bad("group " + std::to_string(g.group) + " must divide input channels " +
        std::to_string(g.c) + " and output channels " + std::to_string(g.m));
  const std::int64_t eh = (g.kh - 1) * g.dh + 1, ew = (g.kw - 1) * g.dw + 1;
  const std::int64_t oh = std::max<std::int64_t>(0, (g.h + g.pt + pb - eh) / g.sh + 1);
  const std::int64_t ow = std::max<std::int64_t>(0, (g.w + g.pl + pr - ew) / g.sw + 1);
  const std::int64_t oh_ok = g.h + g.pt + pb >= eh ? oh : 0;
  const std::int64_t ow_ok = g.w + g.pl + pr >= ew ? ow : 0;
  if (oh_ok != g.oh || ow_ok != g.ow)
    bad("output size (" + std::to_string(g.oh) + ", " + std::to_string(g.ow) +
        ") does not match the geometry, expected (" + std::to_string(oh_ok) + ", " +
        std::to_string(ow_ok) + ")");
}

std::int64_t conv_packed_size(std::int64_t m, std::int64_t cg, std::int64_t kh, std::int64_t kw,
                              std::int64_t group) {
  return group * packed_b_size(kh * kw * cg, m / group);
}

void conv_pack_weight(const float* w, std::int64_t m, std::int64_t cg, std::int64_t kh,
                      std::int64_t kw, std::int64_t group, float* dst) {
  const std::int64_t mg = m / group, kg = kh * kw * cg, taps = kh * kw;
  std::vector<float> mat(static_cast<std::size_t>(kg * mg));
  for (std::int64_t g = 0; g < group; ++g) {
    // B_g[(t * cg + ch), oc] = w[g * mg + oc, ch, t]
    for (std::int64_t oc = 0; oc < mg; ++oc)
      for (std::int64_t ch = 0; ch < cg; ++ch)
        for (std::int64_t t = 0; t < taps; ++t)
          mat[(t * cg + ch) * mg + oc] = w[((g * mg + oc) * cg + ch) * taps + t];
    pack_b(mat.data(), kg, mg, mg, 1, dst + g * packed_b_size(kg, mg));
  }
}

void conv_unpack_weight(const float* packed, std::int64_t m, std::int64_t cg, std::int64_t kh,
                        std::int64_t kw, std::int64_t group, float* dst) {
  const std::int64_t mg = m / group, kg = kh * kw * cg, taps = kh * kw;
  std::vector<float> mat(static_cast<std::size_t>(kg * mg));
  for (std::int64_t g = 0; g < group; ++g) {
    unpack_b(packed + g * packed_b_size(kg, mg), kg, mg, mg, 1, mat.data());
    for (std::int64_t oc = 0; oc < mg; ++oc)
      for (std::int64_t ch = 0; ch < cg; ++ch)
        for (std::int64_t t = 0; t < taps; ++t)
          dst[((g * mg + oc) * cg + ch) * taps + t] = mat[(t * cg + ch) * mg + oc];
  }
}

namespace {

// Input channels below which a group-1 conv with dw == 1 copies its input into a zero-padded
// buffer, so that each kernel row of taps is one contiguous run (kw * c floats) of the GEMM's
// A rows instead of kw runs of c floats (the copy costs one pass over the input).
constexpr std::int64_t kPadBelowChannels = 16;

// x (n, h, w, c) copied into a zero-padded (n, hp, wp, c) buffer at offset (pt, pl).
std::vector<float> pad_nhwc(const float* x, std::int64_t n, std::int64_t h, std::int64_t w,
                            std::int64_t c, std::int64_t hp, std::int64_t wp, std::int64_t pt,
                            std::int64_t pl) {
  std::vector<float> out(static_cast<std::size_t>(n * hp * wp * c));
  parallel_chunks(n * hp, 16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t b = r / hp, y = r % hp - pt;
      float* dst = out.data() + r * wp * c;
      std::fill(dst, dst + wp * c, 0.0f);
      if (y >= 0 && y < h)
        std::memcpy(dst + pl * c, x + (b * h + y) * w * c, sizeof(float) * w * c);
    }
  });
  return out;
}

}  // namespace

void conv_nhwc(const ConvGeom& g, const float* x, const float* w_packed, float* y,
               const float* bias, const float* residual, Activation act, float lo, float hi) {
  const std::int64_t cg = g.c / g.group, mg = g.m / g.group;
  const std::int64_t kg = g.kh * g.kw * cg;
  const std::int64_t rows = g.n * g.oh * g.ow;
  const bool pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 &&
                         g.pl == 0 && g.oh == g.h && g.ow == g.w;
  std::vector<float> padded;
  ConvGeom gp = g;  // geometry over the padded input when there is one
  if (!pointwise && g.group == 1 && g.dw == 1 && g.kw > 1 && g.c < kPadBelowChannels &&
      rows > 0) {
    gp.h = std::max(g.h + g.pt, (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1);
    gp.w = std::max(g.w + g.pl, (g.ow - 1) * g.sw + g.kw);
    gp.pt = gp.pl = 0;
    padded = pad_nhwc(x, g.n, g.h, g.w, g.c, gp.h, gp.w, g.pt, g.pl);
  }
  const float* xin = padded.empty() ? x : padded.data();
  for (std::int64_t grp = 0; grp < g.group; ++grp) {
    GemmA a;
    if (pointwise) {  // X is already the (n*h*w, c) matrix
      a.kind = GemmA::Kind::dense;
      a.dense = DenseA{x + grp * cg, g.c, 1};
    } else {
      a.kind = GemmA::Kind::conv_nhwc;
      a.conv = ConvA{xin, gp.n, gp.h, gp.w, gp.c, gp.oh, gp.ow, gp.kh, gp.kw, gp.sh,
                     gp.sw, gp.dh, gp.dw, gp.pt, gp.pl, grp * cg, cg, !padded.empty()};
    }
    GemmEpilogue ep;
    if (bias) {
      ep.bias = bias + grp * mg;
      ep.bias_cs = 1;
    }
    if (residual) {
      ep.residual = residual + grp * mg;
      ep.residual_ld = g.m;
    }
    ep.act = act;
    ep.lo = lo;
    ep.hi = hi;
    gemm_packed(rows, mg, kg, a, w_packed + grp * packed_b_size(kg, mg), y + grp * mg, g.m, ep);
  }
}

void conv_nhwc_depthwise(const ConvGeom& g, const float* x, const float* w_hwc, float* y,
                         const float* bias, const float* residual, Activation act, float lo,
                         float hi) {
  if (g.group != g.c || g.m != g.c)
    throw std::invalid_argument("conv_nhwc_depthwise: needs group == input channels == output "
                                "channels, received group " + std::to_string(g.group) +
                                ", channels " + std::to_string(g.c) + " -> " +
                                std::to_string(g.m));
  const std::int64_t rows = g.n * g.oh;
  const std::int64_t grain =
      std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, g.ow * g.c * g.kh * g.kw));
  parallel_chunks(rows, grain, [&](std::int64_t r0, std::int64_t r1) {
    OPD_ISA_CALL(depthwise_nhwc_rows, g, x, w_hwc, y, bias, residual, act, lo, hi, r0, r1);
  });
}

void conv_nchw_1x1(std::int64_t n, std::int64_t c, std::int64_t hw, std::int64_t m,
                   const float* x, const float* w, float* y, const float* bias,
                   const float* residual, Activation act, float lo, float hi) {
  GemmEpilogue ep;
  if (bias) {
    ep.bias = bias;
    ep.bias_rs = 1;
  }
  ep.act = act;
  ep.lo = lo;
  ep.hi = hi;
  std::vector<float> packed(static_cast<std::size_t>(packed_b_size(c, hw)));
  GemmA a;
  a.dense = DenseA{w, c, 1};
  for (std::int64_t b = 0; b < n; ++b) {
    pack_b(x + b * c * hw, c, hw, hw, 1, packed.data());
    if (residual) {
      ep.residual = residual + b * m * hw;
      ep.residual_ld = hw;
    }
    gemm_packed(m, hw, c, a, packed.data(), y + b * m * hw, hw, ep);
  }
}

}  // namespace opd
