// CPU feature detection (cpuid/xgetbv on x86, getauxval on Linux/Android ARM) and the ISA
// levels kernels are built for. QLINEAR_ISA=<level> caps the level, so that every level can be
// exercised on one machine.
#pragma once

#include <string>
#include <vector>

namespace qlinear {

// Ordered within a family: a higher level implies the lower ones. On aarch64, FEAT_FP16 and
// FEAT_DotProd are separate options of ARMv8.2, but every core that ships SDOT also has FP16
// arithmetic (Cortex-A55/A75 and later, Neoverse, Apple, ...), so the chain is
// neon < fp16 < dotprod < i8mm; a core with SDOT but without FP16 runs at the neon level.
enum class Isa : int {
  scalar = 0,
  // x86-64
  avx2 = 10,        // AVX2 + FMA + F16C
  // aarch64
  neon = 20,        // ARMv8.0 Advanced SIMD (SMULL / SADALP int8 products)
  fp16 = 21,        // + ARMv8.2 FP16 arithmetic (the float path for fp16 activations)
  dotprod = 22,     // + ARMv8.2 SDOT
  i8mm = 23,        // + ARMv8.6 SMMLA (GEMM; GEMV stays on SDOT)
};

const char* isa_name(Isa isa);
bool parse_isa(const std::string& name, Isa* out);

struct CpuFeatures {
  std::string arch;                  // "x86_64", "aarch64" or "unknown"
  std::vector<std::string> flags;    // detected features, e.g. "avx2", "f16c", "asimddp", "i8mm"
  Isa best = Isa::scalar;            // best level with kernels in this build
  int physical_cores = 1;            // fast cores only on big.LITTLE (cpufreq max)
};

const CpuFeatures& cpu_features();
bool cpu_supports(Isa isa);
// Levels usable on this machine, lowest first (scalar always included).
std::vector<Isa> available_isas();

}  // namespace qlinear
