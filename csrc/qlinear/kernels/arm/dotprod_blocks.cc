// The block formats' kernels of the dot-product levels (neon_blocks.h with SDOT by element;
// compiled with -march=armv8.2-a+dotprod in this file only). The i8mm level takes them too: its
// CPUs have SDOT, and SMMLA's 2 x 8 operands would need the codes in another order than the
// file's chunks.
#define QLINEAR_ARM_LEVEL dotprod
#include "qlinear/kernels/arm/neon_blocks.h"

namespace qlinear {

void add_dotprod_block_kernels(KernelTable& t) { arm::add_block_kernels<arm::blocks::SdotDot>(t, "dotprod"); }

}  // namespace qlinear
