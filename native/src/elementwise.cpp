// Elementwise kernels (see opdispatch/elementwise.h). Loops are written so that the compiler
// vectorises them; work is split over threads in chunks of at least kGrain items.
#include "opdispatch/elementwise.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "opdispatch/parallel.h"

namespace opd {
namespace {

constexpr std::int64_t kGrain = 1 << 15;

template <class F>
void chunked(std::int64_t count, F&& f) {
  parallel_chunks(count, kGrain, f);
}

template <BinaryOp Op>
inline float apply(float a, float b) {
  if constexpr (Op == BinaryOp::add) return a + b;
  if constexpr (Op == BinaryOp::sub) return a - b;
  if constexpr (Op == BinaryOp::mul) return a * b;
  if constexpr (Op == BinaryOp::div) return a / b;
  // NaN from either operand propagates (numpy's maximum / minimum)
  if constexpr (Op == BinaryOp::max) return a > b || a != a ? a : b;
  if constexpr (Op == BinaryOp::min) return a < b || a != a ? a : b;
  return 0.0f;
}

template <BinaryOp Op>
void same(const float* a, const float* b, float* y, std::int64_t count, bool relu) {
  chunked(count, [&](std::int64_t s, std::int64_t e) {
    if (relu) {
      for (std::int64_t i = s; i < e; ++i) {
        const float v = apply<Op>(a[i], b[i]);
        y[i] = v < 0.0f ? 0.0f : v;  // NaN stays NaN
      }
    } else {
      for (std::int64_t i = s; i < e; ++i) y[i] = apply<Op>(a[i], b[i]);
    }
  });
}

template <BinaryOp Op>
void broadcast(const float* a, const std::vector<std::int64_t>& as, const float* b,
               const std::vector<std::int64_t>& bs, float* y,
               const std::vector<std::int64_t>& shape) {
  const int rank = static_cast<int>(shape.size());
  if (rank == 0) {
    y[0] = apply<Op>(a[0], b[0]);
    return;
  }
  const std::int64_t inner = shape[rank - 1];
  const std::int64_t sa = as[rank - 1], sb = bs[rank - 1];
  std::int64_t rows = 1;
  for (int d = 0; d < rank - 1; ++d) rows *= shape[d];
  parallel_chunks(rows, std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(inner, 1)),
                  [&](std::int64_t r0, std::int64_t r1) {
                    for (std::int64_t r = r0; r < r1; ++r) {
                      std::int64_t oa = 0, ob = 0, rem = r;
                      for (int d = rank - 2; d >= 0; --d) {
                        const std::int64_t idx = rem % shape[d];
                        rem /= shape[d];
                        oa += idx * as[d];
                        ob += idx * bs[d];
                      }
                      const float* pa = a + oa;
                      const float* pb = b + ob;
                      float* py = y + r * inner;
                      if (sa == 1 && sb == 1) {
                        for (std::int64_t i = 0; i < inner; ++i) py[i] = apply<Op>(pa[i], pb[i]);
                      } else if (sa == 1 && sb == 0) {
                        const float vb = pb[0];
                        for (std::int64_t i = 0; i < inner; ++i) py[i] = apply<Op>(pa[i], vb);
                      } else if (sa == 0 && sb == 1) {
                        const float va = pa[0];
                        for (std::int64_t i = 0; i < inner; ++i) py[i] = apply<Op>(va, pb[i]);
                      } else {
                        for (std::int64_t i = 0; i < inner; ++i)
                          py[i] = apply<Op>(pa[i * sa], pb[i * sb]);
                      }
                    }
                  });
}

}  // namespace

void relu(const float* x, float* y, std::int64_t count) {
  chunked(count, [&](std::int64_t s, std::int64_t e) {
    for (std::int64_t i = s; i < e; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN stays NaN
  });
}

void clip(const float* x, float* y, std::int64_t count, float lo, float hi) {
  chunked(count, [&](std::int64_t s, std::int64_t e) {
    for (std::int64_t i = s; i < e; ++i) {
      const float v = x[i] < lo ? lo : x[i];
      y[i] = v > hi ? hi : v;
    }
  });
}

#define OPD_BINARY_SWITCH(op, fn, ...)                        \
  switch (op) {                                               \
    case BinaryOp::add: fn<BinaryOp::add>(__VA_ARGS__); break; \
    case BinaryOp::sub: fn<BinaryOp::sub>(__VA_ARGS__); break; \
    case BinaryOp::mul: fn<BinaryOp::mul>(__VA_ARGS__); break; \
    case BinaryOp::div: fn<BinaryOp::div>(__VA_ARGS__); break; \
    case BinaryOp::max: fn<BinaryOp::max>(__VA_ARGS__); break; \
    case BinaryOp::min: fn<BinaryOp::min>(__VA_ARGS__); break; \
    default: throw std::invalid_argument("unknown binary op " + std::to_string(int(op))); \
  }

void binary_same(BinaryOp op, const float* a, const float* b, float* y, std::int64_t count,
                 bool relu) {
  OPD_BINARY_SWITCH(op, same, a, b, y, count, relu)
}

void binary_broadcast(BinaryOp op, const float* a, const std::vector<std::int64_t>& a_strides,
                      const float* b, const std::vector<std::int64_t>& b_strides, float* y,
                      const std::vector<std::int64_t>& out_shape) {
  if (a_strides.size() != out_shape.size() || b_strides.size() != out_shape.size())
    throw std::invalid_argument("broadcast strides must have the rank of the output shape");
  OPD_BINARY_SWITCH(op, broadcast, a, a_strides, b, b_strides, y, out_shape)
}

void sum_n(const std::vector<const float*>& inputs, float* y, std::int64_t count) {
  if (inputs.empty()) throw std::invalid_argument("Sum needs at least one input");
  chunked(count, [&](std::int64_t s, std::int64_t e) {
    std::copy(inputs[0] + s, inputs[0] + e, y + s);
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      const float* p = inputs[k];
      for (std::int64_t i = s; i < e; ++i) y[i] += p[i];
    }
  });
}

}  // namespace opd
