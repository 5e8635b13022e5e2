// The block formats' kernels at the AVX512-VNNI level (x86_blocks.h with AVX512-VL's VPDPBUSD on
// ymm: one panel per register, as the level's GEMVs; compiled with the level's flags in this
// file only).
#include "qlinear/kernels/x86/x86_blocks.h"

namespace qlinear {
namespace {

struct YmmEvexVnni : x86::Ymm {
  static __m256i dpbusd(__m256i acc, __m256i a, __m256i b) { return _mm256_dpbusd_epi32(acc, a, b); }
};

}  // namespace

void add_avx512vnni_block_kernels(KernelTable& t) {
  x86::add_block_kernels<x86::BlockDot<YmmEvexVnni, true>>(t, "avx512vnni");
}

}  // namespace qlinear
