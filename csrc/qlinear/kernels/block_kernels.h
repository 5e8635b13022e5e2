// The block formats' kernels (block_format.h) as the levels list them in KernelTable::blocks /
// blocks_float.
#pragma once

#include <string>

#include "qlinear/core/kernels.h"

namespace qlinear {

// A kernel name that lives as long as the program: "<scheme>_<format>_<what>_<level>", e.g.
// gemv_q6_k_a8_1x8_avx2 (format in lower case).
const char* block_kernel_name(const char* scheme, Format f, const char* what, const char* level);

// The scalar kernels of every block format (every M): the scalar level's, and the fallback of
// the levels that lack a format.
void add_scalar_block_kernels(KernelTable& t);

#if defined(__x86_64__) || defined(_M_X64)
// Each level's kernels of every format, replacing the table's (kernels/<level>_blocks.cc).
void add_avx2_block_kernels(KernelTable& t);
void add_avxvnni_block_kernels(KernelTable& t);
void add_avx512vnni_block_kernels(KernelTable& t);
#endif
#if defined(__aarch64__)
// The same on aarch64: plain NEON (SMULL) and the dot-product levels' (SDOT; i8mm takes these),
// kernels/arm/<level>_blocks.cc.
void add_neon_block_kernels(KernelTable& t);
void add_dotprod_block_kernels(KernelTable& t);
#endif

}  // namespace qlinear
