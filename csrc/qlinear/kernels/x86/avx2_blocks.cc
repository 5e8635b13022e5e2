// The block formats' kernels at the AVX2 level (x86_blocks.h with VPMADDUBSW + VPMADDWD; compiled
// with -mavx2 -mfma -mf16c in this file only).
#include "qlinear/kernels/x86/x86_blocks.h"

namespace qlinear {

void add_avx2_block_kernels(KernelTable& t) { x86::add_block_kernels<x86::BlockDot<x86::Ymm, false>>(t, "avx2"); }

}  // namespace qlinear
