// Portable SIMD vectors through GCC/Clang vector extensions. The same source compiles to
// AVX-512, AVX2 or SSE2/NEON code depending on the flags of the translation unit (see the
// per-ISA object libraries in CMakeLists.txt).
#pragma once

#include <cstring>

namespace opd {

typedef float v8f __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));

template <class V>
inline V vload(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <class V>
inline void vstore(float* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

template <class V>
inline V vbroadcast(float x) {
  V v;
  for (unsigned i = 0; i < sizeof(V) / sizeof(float); ++i) v[i] = x;
  return v;
}

// max / min propagate NaN from either operand (as numpy's maximum / minimum and the ONNX
// reference): a bare select (a > b ? a : b) drops a NaN in `a`, so a Relu or Clip epilogue
// turned NaN into 0 or the bound while the scalar path of the same kernel kept it.
template <class V>
inline V vmax(V a, V b) {
  return (a > b) | (a != a) ? a : b;
}

template <class V>
inline V vmin(V a, V b) {
  return (a < b) | (a != a) ? a : b;
}

}  // namespace opd
