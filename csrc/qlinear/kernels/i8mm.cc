// ARMv8.6 int8 matrix-multiply kernels over the nr8_kr4 layout (compiled with
// -march=armv8.2-a+dotprod+i8mm in this file only; dispatch calls them only when getauxval
// reports i8mm and asimddp). GEMM: SMMLA multiplies a 2 x 8 block of activations (two rows of x,
// 8 consecutive k) by an 8 x 2 block of weights (two rows of W) into a 2 x 2 int32 tile. Zipping
// the 32-bit lanes of a chunk's two k halves (int4: low and high nibbles; int8: two consecutive
// chunks) gives exactly those weight operands, rows (0,1) (2,3) (4,5) (6,7). GEMV stays on SDOT
// (a 2-row SMMLA would waste half of every product at M = 1). fp16 activations take
// kernels/fp16.cc's float path, as on the dotprod level.
#define QLINEAR_ARM_LEVEL i8mm
#include "neon_common.h"

namespace qlinear {
namespace {

template <int BITS, int MR>
struct SmmlaBlockDot {
  static constexpr int kPairs = (MR + 1) / 2;  // an odd last row is paired with itself

  static inline void run(const uint8_t* w, int64_t block, const int8_t* const* xq, int32x4_t (*acc)[2]) {
    int32x4_t tile[kPairs][4];  // [m pair][n pair]: (m n0, m n1, m' n0, m' n1)
    for (int i = 0; i < kPairs; ++i)
      for (int j = 0; j < 4; ++j) tile[i][j] = vdupq_n_s32(0);
    const int8_t* x[2 * kPairs];
    for (int i = 0; i < 2 * kPairs; ++i) x[i] = xq[std::min(i, MR - 1)];
    const auto mma = [&](const int8x16_t (&b)[4], int64_t k) {
      for (int i = 0; i < kPairs; ++i) {
        const int8x16_t a = vcombine_s8(vld1_s8(x[2 * i] + k), vld1_s8(x[2 * i + 1] + k));
        for (int j = 0; j < 4; ++j) tile[i][j] = vmmlaq_s32(tile[i][j], a, b[j]);
      }
    };
    // Weight operands of 8 k from the two k halves of rows 0-3 (h0) and 4-7 (h1).
    const auto operands = [](int8x16_t a03, int8x16_t b03, int8x16_t a47, int8x16_t b47, int8x16_t (&b)[4]) {
      const auto zip = [](int8x16_t lo, int8x16_t hi, bool second) {
        const uint32x4_t l = vreinterpretq_u32_s8(lo), h = vreinterpretq_u32_s8(hi);
        return vreinterpretq_s8_u32(second ? vzip2q_u32(l, h) : vzip1q_u32(l, h));
      };
      b[0] = zip(a03, b03, false);
      b[1] = zip(a03, b03, true);
      b[2] = zip(a47, b47, false);
      b[3] = zip(a47, b47, true);
    };
    int8x16_t b[4];
    if constexpr (BITS == 4) {
      const uint8x16_t low4 = vdupq_n_u8(0x0F);
      for (int64_t kk = 0; kk < block; kk += 8, w += 32) {
        const uint8x16_t v0 = vld1q_u8(w), v1 = vld1q_u8(w + 16);
        operands(vreinterpretq_s8_u8(vandq_u8(v0, low4)), vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)),
                 vreinterpretq_s8_u8(vandq_u8(v1, low4)), vreinterpretq_s8_u8(vshrq_n_u8(v1, 4)), b);
        mma(b, kk);
      }
    } else {
      const uint8x16_t flip = vdupq_n_u8(0x80);
      const auto load = [&](const uint8_t* p) { return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p), flip)); };
      for (int64_t kk = 0; kk < block; kk += 8, w += 64) {  // chunks c (k 0-3) and c + 1 (k 4-7)
        operands(load(w), load(w + 32), load(w + 16), load(w + 48), b);
        mma(b, kk);
      }
    }
    for (int i = 0; i < MR; ++i) {  // row 2p: low 64 bits of each tile, row 2p + 1: high
      const int p = i / 2;
      const auto pick = [&](int32x4_t t01, int32x4_t t23) {
        const int64x2_t a = vreinterpretq_s64_s32(t01), c = vreinterpretq_s64_s32(t23);
        return vreinterpretq_s32_s64(i % 2 ? vzip2q_s64(a, c) : vzip1q_s64(a, c));
      };
      acc[i][0] = pick(tile[p][0], tile[p][1]);
      acc[i][1] = pick(tile[p][2], tile[p][3]);
    }
  }
};

}  // namespace

const KernelTable& i8mm_kernels() {
  static const KernelTable table = with_fp16_float_path(arm::make_table<arm::SdotBlockDot, SmmlaBlockDot, 4>(
      Isa::i8mm, "gemv_w4a8_nr8_kr4_1x8_dotprod", "gemv_w8a8_nr8_kr4_1x8_dotprod",
      "gemm_w4a8_nr8_kr4_4x8_i8mm", "gemm_w8a8_nr8_kr4_4x8_i8mm"));
  return table;
}

}  // namespace qlinear
