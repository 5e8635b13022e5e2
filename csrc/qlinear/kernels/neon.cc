// ARMv8.0 Advanced SIMD kernels over the nr8_kr4 layout (no extension needed: NEON is part of
// every aarch64 CPU). Integer core with SMULL (s8 x s8 -> s16, 8 products) and SADALP (pairs
// into s32): per 32-byte chunk and activation row, 8 SMULL + 8 SADALP for 64 products. A pair of
// rows shares an accumulator ([row a k0+k1, a k2+k3, row b ..]); blocks end with ADDP.
// int4 nibbles are 0..15 (|product| <= 1905), int8 codes are flipped to code - 128 (<= 16256):
// exact in s16.
#define QLINEAR_ARM_LEVEL neon
#include "neon_common.h"

namespace qlinear {
namespace {

inline int8x8_t dup4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return vreinterpret_s8_s32(vdup_n_s32(v));
}

template <int BITS, int MR>
struct SmullBlockDot {
  static inline void run(const uint8_t* w, int64_t block, const int8_t* const* xq, int32x4_t (*acc)[2]) {
    int32x4_t pair[MR][4];  // rows (0,1) (2,3) (4,5) (6,7)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < 4; ++j) pair[i][j] = vdupq_n_s32(0);
    const auto mac = [&](int i, int8x16_t w03, int8x16_t w47, int8x8_t x) {
      pair[i][0] = vpadalq_s16(pair[i][0], vmull_s8(vget_low_s8(w03), x));
      pair[i][1] = vpadalq_s16(pair[i][1], vmull_s8(vget_high_s8(w03), x));
      pair[i][2] = vpadalq_s16(pair[i][2], vmull_s8(vget_low_s8(w47), x));
      pair[i][3] = vpadalq_s16(pair[i][3], vmull_s8(vget_high_s8(w47), x));
    };
    if constexpr (BITS == 4) {
      const uint8x16_t low4 = vdupq_n_u8(0x0F);
      for (int64_t kk = 0; kk < block; kk += 8, w += 32) {
        const uint8x16_t v0 = vld1q_u8(w), v1 = vld1q_u8(w + 16);
        const int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(v0, low4)), lo1 = vreinterpretq_s8_u8(vandq_u8(v1, low4));
        const int8x16_t hi0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
        for (int i = 0; i < MR; ++i) {
          mac(i, lo0, lo1, dup4(xq[i] + kk));
          mac(i, hi0, hi1, dup4(xq[i] + kk + 4));
        }
      }
    } else {
      const uint8x16_t flip = vdupq_n_u8(0x80);
      for (int64_t kk = 0; kk < block; kk += 4, w += 32) {
        const int8x16_t w0 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w), flip));
        const int8x16_t w1 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + 16), flip));
        for (int i = 0; i < MR; ++i) mac(i, w0, w1, dup4(xq[i] + kk));
      }
    }
    for (int i = 0; i < MR; ++i) {
      acc[i][0] = vpaddq_s32(pair[i][0], pair[i][1]);
      acc[i][1] = vpaddq_s32(pair[i][2], pair[i][3]);
    }
  }
};

}  // namespace

const KernelTable& neon_kernels() {
  static const KernelTable table = arm::make_table<SmullBlockDot, SmullBlockDot, 4>(
      Isa::neon, "gemv_w4a8_nr8_kr4_1x8_neon", "gemv_w8a8_nr8_kr4_1x8_neon", "gemm_w4a8_nr8_kr4_4x8_neon",
      "gemm_w8a8_nr8_kr4_4x8_neon");
  return table;
}

}  // namespace qlinear
