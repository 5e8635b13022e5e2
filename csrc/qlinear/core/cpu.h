// CPU feature detection (cpuid/xgetbv on x86, getauxval on Linux/Android ARM) and the ISA
// levels kernels are built for. QLINEAR_ISA=<level> caps the level, so that every level can be
// exercised on one machine.
#pragma once

#include <string>
#include <vector>

namespace qlinear {

// x86-64 levels are not a chain: avx2 is implied by the others, but avxvnni (VEX VPDPBUSD, e.g.
// Alder Lake) and avx512vnni (e.g. Ice Lake) each exist without the other; amx implies
// avx512vnni (its GEMV and row tails are avx512vnni kernels). Each x86 level checks its own
// features; QLINEAR_ISA caps by number and picks the highest supported level at or below it.
// On aarch64 levels are ordered: a higher level implies the lower ones. On aarch64, FEAT_FP16 and
// FEAT_DotProd are separate options of ARMv8.2, but every core that ships SDOT also has FP16
// arithmetic (Cortex-A55/A75 and later, Neoverse, Apple, ...), so the chain is
// neon < fp16 < dotprod < i8mm; a core with SDOT but without FP16 runs at the neon level.
enum class Isa : int {
  scalar = 0,
  // x86-64
  avx2 = 10,        // AVX2 + FMA + F16C
  avxvnni = 11,     // + AVX-VNNI (VEX VPDPBUSD on ymm)
  avx512vnni = 12,  // + AVX-512 F/BW/VL + AVX512-VNNI (EVEX VPDPBUSD on zmm), OS-enabled ZMM state
  amx = 13,         // + AMX-TILE + AMX-INT8 (GEMM on tiles), OS-enabled and permitted tile state
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
  std::vector<Isa> supported;        // levels with kernels in this build that this CPU runs
  std::vector<Isa> emulated;         // of those, levels run by emulated intrinsics (QLINEAR_EMULATE_X86)
};

const CpuFeatures& cpu_features();
bool cpu_supports(Isa isa);
// True for levels whose kernels run on emulated intrinsics (a QLINEAR_EMULATE_X86 build).
bool cpu_emulates(Isa isa);
// Levels usable on this machine, lowest first (scalar always included).
std::vector<Isa> available_isas();

}  // namespace qlinear
