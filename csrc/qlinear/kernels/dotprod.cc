// ARMv8.2 dot-product kernels over the nr8_kr4 layout (compiled with -march=armv8.2-a+dotprod in
// this file only; dispatch calls them only when getauxval reports asimddp). Integer core with
// SDOT by element: a 16-byte half chunk (4 rows x 4 k) against 4 activation bytes chosen by lane
// from a 16-byte load, 16 products per instruction into one s32 per row. int4 nibbles 0..15 and
// int8 codes flipped to code - 128 are both valid s8 operands. The level implies FP16 arithmetic
// (cpu.h), so fp16 activations take kernels/fp16.cc's float path.
#define QLINEAR_ARM_LEVEL dotprod
#include "neon_common.h"

namespace qlinear {

using arm::SdotBlockDot;

const KernelTable& dotprod_kernels() {
  static const KernelTable table = with_fp16_float_path(arm::make_table<SdotBlockDot, SdotBlockDot, 8>(
      Isa::dotprod, "gemv_w4a8_nr8_kr4_1x8_dotprod", "gemv_w8a8_nr8_kr4_1x8_dotprod",
      "gemm_w4a8_nr8_kr4_8x8_dotprod", "gemm_w8a8_nr8_kr4_8x8_dotprod"));
  return table;
}

}  // namespace qlinear
