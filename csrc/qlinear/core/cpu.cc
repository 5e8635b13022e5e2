#include "qlinear/core/cpu.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#define QLINEAR_X86 1
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#define QLINEAR_ARM64_LINUX 1
#include <sys/auxv.h>
#endif

namespace qlinear {

namespace {
constexpr Isa kAllIsas[] = {Isa::scalar, Isa::avx2, Isa::avxvnni, Isa::avx512vnni, Isa::amx, Isa::neon, Isa::fp16, Isa::dotprod, Isa::i8mm};
}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avxvnni: return "avxvnni";
    case Isa::avx512vnni: return "avx512vnni";
    case Isa::amx: return "amx";
    case Isa::neon: return "neon";
    case Isa::fp16: return "fp16";
    case Isa::dotprod: return "dotprod";
    case Isa::i8mm: return "i8mm";
  }
  return "unknown";
}

bool parse_isa(const std::string& name, Isa* out) {
  for (Isa isa : kAllIsas) {
    if (name == isa_name(isa)) { *out = isa; return true; }
  }
  return false;
}

namespace {

#ifdef QLINEAR_X86
bool request_amx_permission() {
#if defined(__linux__) && defined(QLINEAR_HAVE_AMX)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

void detect_x86(CpuFeatures& f) {
  f.arch = "x86_64";
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  const bool osxsave = c & (1u << 27);
  const bool fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
  unsigned long long xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool ymm_state = (xcr0 & 0x6) == 0x6;              // SSE + AVX state enabled by the OS
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;            // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;     // AMX TILECFG + TILEDATA
  unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b7, c7, d7);
    unsigned t1, t2, t3;
    __cpuid_count(7, 1, a71, t1, t2, t3);
  }
  auto add = [&](bool cond, const char* name) { if (cond) f.flags.emplace_back(name); };
  add(avx && ymm_state, "avx");
  add((b7 & (1u << 5)) && ymm_state, "avx2");
  add(fma && ymm_state, "fma");
  add(f16c && ymm_state, "f16c");
  add((a71 & (1u << 4)) && ymm_state, "avxvnni");
  add((b7 & (1u << 16)) && zmm_state, "avx512f");
  add((b7 & (1u << 30)) && zmm_state, "avx512bw");
  add((b7 & (1u << 31)) && zmm_state, "avx512vl");
  add((c7 & (1u << 11)) && zmm_state, "avx512vnni");
  add((d7 & (1u << 25)) && tile_state, "amx-int8");
  add((d7 & (1u << 24)) && tile_state, "amx-tile");
  const auto has = [&](const char* n) {
    return std::find(f.flags.begin(), f.flags.end(), n) != f.flags.end();
  };
  const bool avx2 = has("avx2") && has("fma") && has("f16c");
  const bool avx512vnni = avx2 && has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512vnni");
  bool amx = avx512vnni && has("amx-tile") && has("amx-int8");
#if defined(QLINEAR_EMULATE_X86)
  // Emulated build: the kernels of the levels beyond AVX2 run on emulated intrinsics built from
  // AVX2 / FMA / F16C (kernels/x86/x86_simd.h), so any AVX2 CPU runs them; cpu_info()["emulated"]
  // lists them.
  const bool emulate = avx2;
#else
  const bool emulate = false;
#endif
  // Linux hands out the AMX tile data state only on request (once per process, for every
  // thread); refused (or an older kernel), the amx level is not supported and avx512vnni runs.
  if (amx && !emulate) amx = request_amx_permission();
  if (avx2) f.supported.push_back(Isa::avx2);
  const auto level = [&](bool present, Isa isa) {
    if (emulate) f.emulated.push_back(isa);
    if (present || emulate) f.supported.push_back(isa);
  };
#if defined(QLINEAR_HAVE_AVXVNNI)
  level(avx2 && has("avxvnni"), Isa::avxvnni);
#endif
#if defined(QLINEAR_HAVE_AVX512VNNI)
  level(avx512vnni, Isa::avx512vnni);
#endif
#if defined(QLINEAR_HAVE_AMX)
  level(amx, Isa::amx);
#endif
  (void)level;
}
#endif

#ifdef QLINEAR_ARM64_LINUX
// Linux / Android report features through the auxiliary vector (not /proc/cpuinfo, which some
// Android kernels restrict and whose format varies). Bits from <asm/hwcap.h>.
void detect_arm64(CpuFeatures& f) {
  f.arch = "aarch64";
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  auto add = [&](bool cond, const char* name) { if (cond) f.flags.emplace_back(name); };
  const bool asimd = hw & (1UL << 1), fphp = hw & (1UL << 9), asimdhp = hw & (1UL << 10);
  const bool asimddp = hw & (1UL << 20), i8mm = hw2 & (1UL << 13);
  add(asimd, "asimd");
  add(fphp && asimdhp, "asimdhp");
  add(asimddp, "asimddp");
  add(i8mm, "i8mm");
  add(hw & (1UL << 22), "sve");
  // FP16 arithmetic needs both the scalar (fphp) and the vector (asimdhp) half of FEAT_FP16.
  // The levels form a chain (cpu.h): dotprod and i8mm require FP16 arithmetic too.
  const bool fp16 = asimd && fphp && asimdhp;
  if (asimd) f.supported.push_back(Isa::neon);
  if (fp16) f.supported.push_back(Isa::fp16);
  if (fp16 && asimddp) f.supported.push_back(Isa::dotprod);
  if (fp16 && asimddp && i8mm) f.supported.push_back(Isa::i8mm);
}
#endif

// Physical cores this process may run on: distinct (package, core) pairs in the affinity mask.
// On big.LITTLE CPUs (cores of different cpuinfo_max_freq) only the fastest cores count: a
// thread on a little core makes every parallel job wait for it.
int count_physical_cores() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    struct Core { int pkg, core; long max_freq; };
    std::vector<Core> cpus;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &set)) continue;
      const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
      Core c{-1, -1, 0};
      std::ifstream(base + "/topology/physical_package_id") >> c.pkg;
      std::ifstream(base + "/topology/core_id") >> c.core;
      std::ifstream(base + "/cpufreq/cpuinfo_max_freq") >> c.max_freq;
      if (c.core < 0) c.core = cpu;
      cpus.push_back(c);
    }
    long fastest = 0;
    for (const Core& c : cpus) fastest = std::max(fastest, c.max_freq);
    std::set<std::pair<int, int>> cores;
    for (const Core& c : cpus)
      if (c.max_freq == fastest) cores.emplace(c.pkg, c.core);  // all equal (or unknown): all
    if (!cores.empty()) return static_cast<int>(cores.size());
  }
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

CpuFeatures detect() {
  CpuFeatures f;
  f.arch = "unknown";
#ifdef QLINEAR_X86
  detect_x86(f);
#endif
#ifdef QLINEAR_ARM64_LINUX
  detect_arm64(f);
#endif
  // The best level: the highest supported one (scalar is always supported).
  f.supported.insert(f.supported.begin(), Isa::scalar);
  f.best = *std::max_element(f.supported.begin(), f.supported.end(),
                             [](Isa a, Isa b) { return static_cast<int>(a) < static_cast<int>(b); });
  f.physical_cores = count_physical_cores();
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool cpu_supports(Isa isa) {
  const std::vector<Isa>& s = cpu_features().supported;
  return std::find(s.begin(), s.end(), isa) != s.end();
}

bool cpu_emulates(Isa isa) {
  const std::vector<Isa>& e = cpu_features().emulated;
  return std::find(e.begin(), e.end(), isa) != e.end();
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa isa : kAllIsas)
    if (cpu_supports(isa)) out.push_back(isa);
  return out;
}

}  // namespace qlinear
