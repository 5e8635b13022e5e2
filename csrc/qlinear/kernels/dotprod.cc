// ARMv8.2 dot-product kernels over the nr8_kr4 layout (compiled with -march=armv8.2-a+dotprod in
// this file only; dispatch calls them only when getauxval reports asimddp). Integer core with
// SDOT by element: a 16-byte half chunk (4 rows x 4 k) against 4 activation bytes chosen by lane
// from a 16-byte load, 16 products per instruction into one s32 per row. int4 nibbles 0..15 and
// int8 codes flipped to code - 128 are both valid s8 operands.
#include "neon_common.h"

namespace qlinear {
namespace {

template <int BITS, int MR>
struct SdotBlockDot {
  static inline void run(const uint8_t* w, int64_t block, const int8_t* const* xq, int32x4_t (*acc)[2]) {
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vdupq_n_s32(0);
    if constexpr (BITS == 4) {
      const uint8x16_t low4 = vdupq_n_u8(0x0F);
      for (int64_t kk = 0; kk < block; kk += 16, w += 64) {  // two chunks: 16 k
        int8x16_t lo[2][2], hi[2][2];
        for (int c = 0; c < 2; ++c) {
          const uint8x16_t v0 = vld1q_u8(w + 32 * c), v1 = vld1q_u8(w + 32 * c + 16);
          lo[c][0] = vreinterpretq_s8_u8(vandq_u8(v0, low4));
          lo[c][1] = vreinterpretq_s8_u8(vandq_u8(v1, low4));
          hi[c][0] = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4));
          hi[c][1] = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
        }
        for (int i = 0; i < MR; ++i) {
          const int8x16_t x = vld1q_s8(xq[i] + kk);
          for (int h = 0; h < 2; ++h) {
            acc[i][h] = vdotq_laneq_s32(acc[i][h], lo[0][h], x, 0);
            acc[i][h] = vdotq_laneq_s32(acc[i][h], hi[0][h], x, 1);
            acc[i][h] = vdotq_laneq_s32(acc[i][h], lo[1][h], x, 2);
            acc[i][h] = vdotq_laneq_s32(acc[i][h], hi[1][h], x, 3);
          }
        }
      }
    } else {
      const uint8x16_t flip = vdupq_n_u8(0x80);
      for (int64_t kk = 0; kk < block; kk += 16, w += 128) {  // four chunks: 16 k
        int8x16_t c[4][2];
        for (int j = 0; j < 4; ++j)
          for (int h = 0; h < 2; ++h) c[j][h] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + 32 * j + 16 * h), flip));
        for (int i = 0; i < MR; ++i) {
          const int8x16_t x = vld1q_s8(xq[i] + kk);
          for (int h = 0; h < 2; ++h) {
            acc[i][h] = vdotq_laneq_s32(acc[i][h], c[0][h], x, 0);
            acc[i][h] = vdotq_laneq_s32(acc[i][h], c[1][h], x, 1);
            acc[i][h] = vdotq_laneq_s32(acc[i][h], c[2][h], x, 2);
            acc[i][h] = vdotq_laneq_s32(acc[i][h], c[3][h], x, 3);
          }
        }
      }
    }
  }
};

}  // namespace

const KernelTable& dotprod_kernels() {
  static const KernelTable table = {
      Isa::dotprod,
      arm::quantize_acts, "quantize_acts_absmax_neon",
      {arm::gemv<SdotBlockDot, 4>, arm::gemv<SdotBlockDot, 8>},
      {"gemv_w4a8_nr8_kr4_dotprod", "gemv_w8a8_nr8_kr4_dotprod"},
      {arm::gemm<SdotBlockDot, 4>, arm::gemm<SdotBlockDot, 8>},
      {"gemm_w4a8_nr8_kr4_4x8_dotprod", "gemm_w8a8_nr8_kr4_4x8_dotprod"},
      {0, 128},
      arm::prepare_float_acts,
      {arm::float_matmul<4>, arm::float_matmul<8>}, {"gemv_w4f32_nr8_kr4_neon", "gemv_w8f32_nr8_kr4_neon"},
      {arm::float_matmul<4>, arm::float_matmul<8>}, {"gemm_w4f32_nr8_kr4_neon", "gemm_w8f32_nr8_kr4_neon"},
      LayoutId::nr8_kr4,
  };
  return table;
}

}  // namespace qlinear
