// Helpers for kernels compiled once per instruction set (native/src/isa/*.cpp).
//
// Each such file wraps its functions in `namespace opd { namespace OPD_ISA { ... } }`; the
// CMake build compiles it with OPD_ISA defined as generic, avx2 and avx512. Callers declare the
// functions for every level with OPD_DECLARE_FOR_EACH_ISA and pick one with OPD_ISA_CALL.
#pragma once

#include "opdispatch/cpu.h"

#if OPD_HAVE_X86
#define OPD_DECLARE_FOR_EACH_ISA(decl) \
  namespace generic { decl; }          \
  namespace avx2 { decl; }             \
  namespace avx512 { decl; }
#define OPD_ISA_CALL(fn, ...)                                  \
  do {                                                         \
    switch (::opd::active_isa()) {                             \
      case ::opd::Isa::avx512: ::opd::avx512::fn(__VA_ARGS__); break; \
      case ::opd::Isa::avx2: ::opd::avx2::fn(__VA_ARGS__); break;     \
      default: ::opd::generic::fn(__VA_ARGS__); break;         \
    }                                                          \
  } while (0)
#else
#define OPD_DECLARE_FOR_EACH_ISA(decl) \
  namespace generic { decl; }
#define OPD_ISA_CALL(fn, ...) ::opd::generic::fn(__VA_ARGS__)
#endif
