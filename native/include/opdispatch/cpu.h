// CPU feature detection and the instruction set the kernels dispatch to at run time.
#pragma once

#include <string>
#include <vector>

namespace opd {

enum class Isa { generic = 0, avx2 = 1, avx512 = 2 };

// Name of an instruction-set level ("generic", "avx2", "avx512").
const char* isa_name(Isa isa);

// Parses a name produced by isa_name; throws std::invalid_argument listing the known names.
Isa isa_from_name(const std::string& name);

// Whether this CPU (and this build) can run the kernels compiled for `isa`.
bool isa_supported(Isa isa);

// Every level this machine and build can run, lowest first.
std::vector<Isa> supported_isas();

// The level kernels use now: the best supported one unless set_isa chose another.
Isa active_isa();

// Force a level (e.g. to test the portable fallback); throws std::invalid_argument when this
// CPU or build cannot run it.
void set_isa(Isa isa);

// CPU feature flags relevant to the kernels ("avx2", "fma", "avx512f", ...), as detected.
std::vector<std::string> cpu_flags();

}  // namespace opd
