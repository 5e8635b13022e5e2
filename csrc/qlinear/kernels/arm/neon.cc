// ARMv8.0 Advanced SIMD kernels over the nr8_kr4 (int4) and nr8_kr4_s8 (int8) layouts (no extension
// needed: NEON is part of every aarch64 CPU). Integer core with SMULL (s8 x s8 -> s16, 8 products),
// SMLAL (8 more products added to them, s16) and SADALP (pairs into s32): per 8 k (two k-quads) and
// activation row, 4 SMULL + 4 SMLAL + 4 SADALP for 128 products. A pair of rows shares an
// accumulator ([row a k0+k1, a k2+k3, row b ..]); blocks end with ADDP. int4 nibbles are 0..15
// (|product| <= 1905), int8 codes are stored as code - 128 (nr8_kr4_s8; |product| <= 16256): the
// sum of two products (<= 32512) is exact in s16.
#define QLINEAR_ARM_LEVEL neon
#include "qlinear/kernels/arm/neon_table.h"
#include "qlinear/kernels/block_kernels.h"

namespace qlinear {
namespace {

inline int8x16_t dup4(const int8_t* x) {  // the 4 bytes at x in every 32-bit lane (LD1R)
  return vreinterpretq_s8_s32(vld1q_dup_s32(reinterpret_cast<const int32_t*>(x)));
}

template <int BITS, int MR>
struct SmullBlockDot {
  static inline void run(const uint8_t* w, int64_t block, const int8_t* const* xq, int32x4_t (*acc)[2]) {
    int32x4_t pair[MR][4];  // rows (0,1) (2,3) (4,5) (6,7)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < 4; ++j) pair[i][j] = vdupq_n_s32(0);
    // Two k-quads (a: x, b: y) of a row: pair += pairwise(a * x + b * y), the s16 sums exact.
    // (x and y hold their 4 bytes in every lane, so the high halves need no extraction: SMULL2.)
    const auto mac2 = [&](int i, int8x16_t a03, int8x16_t a47, int8x16_t b03, int8x16_t b47, int8x16_t x,
                          int8x16_t y) {
      const int8x8_t xl = vget_low_s8(x), yl = vget_low_s8(y);
      pair[i][0] = vpadalq_s16(pair[i][0], vmlal_s8(vmull_s8(vget_low_s8(a03), xl), vget_low_s8(b03), yl));
      pair[i][1] = vpadalq_s16(pair[i][1], vmlal_high_s8(vmull_high_s8(a03, x), b03, y));
      pair[i][2] = vpadalq_s16(pair[i][2], vmlal_s8(vmull_s8(vget_low_s8(a47), xl), vget_low_s8(b47), yl));
      pair[i][3] = vpadalq_s16(pair[i][3], vmlal_high_s8(vmull_high_s8(a47, x), b47, y));
    };
    if constexpr (BITS == 4) {
      const uint8x16_t low4 = vdupq_n_u8(0x0F);
      for (int64_t kk = 0; kk < block; kk += 8, w += 32) {
        const uint8x16_t v0 = vld1q_u8(w), v1 = vld1q_u8(w + 16);
        const int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(v0, low4)), lo1 = vreinterpretq_s8_u8(vandq_u8(v1, low4));
        const int8x16_t hi0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
        for (int i = 0; i < MR; ++i) mac2(i, lo0, lo1, hi0, hi1, dup4(xq[i] + kk), dup4(xq[i] + kk + 4));
      }
    } else {
      const auto load = [&](const uint8_t* p) { return vld1q_s8(reinterpret_cast<const int8_t*>(p)); };
      for (int64_t kk = 0; kk < block; kk += 8, w += 64) {  // chunks of k 0-3 and k 4-7
        const int8x16_t a0 = load(w), a1 = load(w + 16), b0 = load(w + 32), b1 = load(w + 48);
        for (int i = 0; i < MR; ++i) mac2(i, a0, a1, b0, b1, dup4(xq[i] + kk), dup4(xq[i] + kk + 4));
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
  static const KernelTable table = [] {
    KernelTable t = arm::make_table<SmullBlockDot, SmullBlockDot, 4>(
        Isa::neon, "gemv_w4a8_nr8_kr4_1x8_neon", "gemv_w8a8_nr8_kr4_s8_1x8_neon", "gemm_w4a8_nr8_kr4_4x8_neon",
        "gemm_w8a8_nr8_kr4_s8_4x8_neon");
    add_neon_block_kernels(t);
    return t;
  }();
  return table;
}

}  // namespace qlinear
