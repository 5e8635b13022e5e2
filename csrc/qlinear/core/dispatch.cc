// Picks the kernel table once: the best level this CPU supports, capped by QLINEAR_ISA.
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "qlinear/core/kernels.h"

namespace qlinear {

const KernelTable& kernels_for(Isa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(_M_X64)
    case Isa::avx2: return avx2_kernels();
#if defined(QLINEAR_HAVE_AVXVNNI)
    case Isa::avxvnni: return avxvnni_kernels();
#endif
#if defined(QLINEAR_HAVE_AVX512VNNI)
    case Isa::avx512vnni: return avx512vnni_kernels();
#endif
#if defined(QLINEAR_HAVE_AMX)
    case Isa::amx: return amx_kernels();
#endif
#endif
#if defined(__aarch64__)
    case Isa::neon: return neon_kernels();
    case Isa::fp16: return fp16_kernels();
    case Isa::dotprod: return dotprod_kernels();
    case Isa::i8mm: return i8mm_kernels();
#endif
    default: return scalar_kernels();
  }
}

namespace {

// The highest supported level <= cap (levels of another family are never supported), or scalar.
Isa capped_level(Isa cap) {
  Isa best = Isa::scalar;
  for (Isa isa : available_isas())
    if (static_cast<int>(isa) <= static_cast<int>(cap)) best = isa;
  return best;
}

Isa initial_level() {
  const char* env = std::getenv("QLINEAR_ISA");
  if (env == nullptr || *env == '\0') return cpu_features().best;
  Isa cap;
  if (!parse_isa(env, &cap))
    throw std::invalid_argument(std::string("QLINEAR_ISA=") + env +
                                " is not a known level (scalar, avx2, avxvnni, avx512vnni, amx, neon, fp16, dotprod, i8mm)");
  return capped_level(cap);
}

std::atomic<const KernelTable*>& active() {
  static std::atomic<const KernelTable*> table{&kernels_for(initial_level())};
  return table;
}

}  // namespace

const KernelTable& active_kernels() { return *active().load(std::memory_order_acquire); }

LayoutId native_layout(int bits) { return storage_layout(active_kernels().layout, bits); }

bool set_active_isa(Isa isa) {
  if (!cpu_supports(isa)) return false;
  active().store(&kernels_for(isa), std::memory_order_release);
  return true;
}

}  // namespace qlinear
