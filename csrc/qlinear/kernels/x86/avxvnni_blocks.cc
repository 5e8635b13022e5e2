// The block formats' kernels at the AVX-VNNI level (x86_blocks.h with the VEX-encoded VPDPBUSD;
// compiled with the level's flags in this file only).
#include "qlinear/kernels/x86/x86_blocks.h"

namespace qlinear {
namespace {

struct YmmVnni : x86::Ymm {
  static __m256i dpbusd(__m256i acc, __m256i a, __m256i b) { return _mm256_dpbusd_avx_epi32(acc, a, b); }
};

}  // namespace

void add_avxvnni_block_kernels(KernelTable& t) { x86::add_block_kernels<x86::BlockDot<YmmVnni, true>>(t, "avxvnni"); }

}  // namespace qlinear
