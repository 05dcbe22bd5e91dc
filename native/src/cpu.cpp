// CPU feature detection and run-time choice of the kernels' instruction set.
#include "opdispatch/cpu.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

namespace opd {
namespace {

bool detect(Isa isa) {
  if (isa == Isa::generic) return true;
#if OPD_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (isa == Isa::avx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == Isa::avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma");
#endif
  return false;
}

Isa best() {
  Isa b = Isa::generic;
  for (Isa i : {Isa::avx2, Isa::avx512})
    if (detect(i)) b = i;
  // OPDISPATCH_NATIVE_ISA caps the level (e.g. "generic" to test the portable path).
  if (const char* env = std::getenv("OPDISPATCH_NATIVE_ISA")) {
    try {
      Isa want = isa_from_name(env);
      if (static_cast<int>(want) < static_cast<int>(b)) b = want;
    } catch (const std::invalid_argument&) {
      // an unknown name is ignored here; the Python layer reports it
    }
  }
  return b;
}

std::atomic<int>& current() {
  static std::atomic<int> isa{static_cast<int>(best())};
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "generic";
  }
}

Isa isa_from_name(const std::string& name) {
  if (name == "generic") return Isa::generic;
  if (name == "avx2") return Isa::avx2;
  if (name == "avx512") return Isa::avx512;
  throw std::invalid_argument("unknown instruction set '" + name +
                              "'; known: generic, avx2, avx512");
}

bool isa_supported(Isa isa) { return detect(isa); }

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::generic, Isa::avx2, Isa::avx512})
    if (detect(i)) out.push_back(i);
  return out;
}

Isa active_isa() { return static_cast<Isa>(current().load(std::memory_order_relaxed)); }

void set_isa(Isa isa) {
  if (!detect(isa)) {
    std::string have;
    for (Isa i : supported_isas()) have += std::string(have.empty() ? "" : ", ") + isa_name(i);
    throw std::invalid_argument(std::string("instruction set '") + isa_name(isa) +
                                "' is not supported by this CPU or build; supported: " + have);
  }
  current().store(static_cast<int>(isa));
}

std::vector<std::string> cpu_flags() {
  std::vector<std::string> out;
#if OPD_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
#define OPD_FLAG(f) \
  if (__builtin_cpu_supports(f)) out.emplace_back(f);
  OPD_FLAG("sse4.2") OPD_FLAG("avx") OPD_FLAG("avx2") OPD_FLAG("fma") OPD_FLAG("avx512f")
  OPD_FLAG("avx512vl") OPD_FLAG("avx512bw") OPD_FLAG("avx512dq") OPD_FLAG("avx512vnni")
#undef OPD_FLAG
#endif
  return out;
}

}  // namespace opd
