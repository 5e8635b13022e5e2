// The block formats' kernels at the plain NEON level (neon_blocks.h with SMULL and pairwise adds).
#define QLINEAR_ARM_LEVEL neon
#include "qlinear/kernels/arm/neon_blocks.h"

namespace qlinear {

void add_neon_block_kernels(KernelTable& t) { arm::add_block_kernels<arm::blocks::SmullDot>(t, "neon"); }

}  // namespace qlinear
