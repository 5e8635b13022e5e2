// ARMv8.2 FP16-arithmetic kernels: the float path for float16 activations (compiled with
// -march=armv8.2-a+fp16 in this file only; dispatch calls them only when getauxval reports fphp
// and asimdhp). The weights stay packed and are dequantized to fp16 in registers, 8 output rows
// per vector; products are summed with FMLA on float16x8_t over chunks of 32 k and flushed into
// float32 (fp16_path.h: normalization, error bound; scalar.cc: the bit-identical twin). The fp16
// level takes the neon level's int8 kernels and float32-activation path; the dotprod and i8mm
// levels add these kernels to theirs (with_fp16_float_path).
#include <arm_neon.h>

#include <algorithm>

#include "../fp16_path.h"
#include "../kernels.h"

#if !defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
#error "kernels/fp16.cc must be compiled with -march=armv8.2-a+fp16"
#endif

namespace qlinear {
namespace {

using namespace fp16_path;

// The normalized dequantization constants of one block (8 rows), and 2^-ew per row.
struct BlockConstants {
  float16x8_t scale, offset;
  float32x4_t unscale[2];
};

template <int BITS>
inline BlockConstants block_constants(const WeightGeometry& g, const uint8_t* block) {
  constexpr int qmax = BITS == 4 ? 15 : 255;
  const auto* s16 = reinterpret_cast<const uint16_t*>(block + g.code_bytes);
  float scale[8], offset[8];
  for (int r = 0; r < 8; ++r) {
    scale[r] = half_to_float(s16[r]);
    offset[r] = g.symmetric ? -float(g.zero_point()) * scale[r] : half_to_float(s16[8 + r]);
  }
  float sc[8], of[8], un[8];
  for (int r = 0; r < 8; ++r) {
    const float norm = pow2_normalizer(weight_bound(offset[r], scale[r], qmax), kWeightTop);
    sc[r] = scale[r] * norm;
    of[r] = offset[r] * norm;
    un[r] = 1.f / norm;
  }
  BlockConstants c;
  c.scale = vcombine_f16(vcvt_f16_f32(vld1q_f32(sc)), vcvt_f16_f32(vld1q_f32(sc + 4)));
  c.offset = vcombine_f16(vcvt_f16_f32(vld1q_f32(of)), vcvt_f16_f32(vld1q_f32(of + 4)));
  c.unscale[0] = vld1q_f32(un);
  c.unscale[1] = vld1q_f32(un + 4);
  return c;
}

// w~[k][8 rows] of one block in fp16: a byte table lookup gathers the 8 rows' codes of two k
// (row r's kr = 4 consecutive k sit at bytes 4r .. 4r + 3 of a chunk), then u8 -> u16 -> f16 and
// one FMA with the block's constants.
template <int BITS>
inline void dequantize_block(const WeightGeometry& g, const uint8_t* block, const BlockConstants& c,
                             float16_t* out) {
  static const uint8_t kIdx[2][16] = {{0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29},
                                      {2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31}};
  const uint8x16_t idx01 = vld1q_u8(kIdx[0]), idx23 = vld1q_u8(kIdx[1]);
  const auto emit = [&](uint8x16_t two_k, float16_t* dst) {  // k and k + 1, 8 rows each
    const float16x8_t q0 = vcvtq_f16_u16(vmovl_u8(vget_low_u8(two_k)));
    const float16x8_t q1 = vcvtq_f16_u16(vmovl_high_u8(two_k));
    vst1q_f16(dst, vfmaq_f16(c.offset, q0, c.scale));
    vst1q_f16(dst + 8, vfmaq_f16(c.offset, q1, c.scale));
  };
  if constexpr (BITS == 4) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    for (int64_t kk = 0; kk < g.block; kk += 8, block += 32, out += 64) {  // one chunk: 8 k
      const uint8x16x2_t v = {{vld1q_u8(block), vld1q_u8(block + 16)}};
      const uint8x16_t b01 = vqtbl2q_u8(v, idx01), b23 = vqtbl2q_u8(v, idx23);
      emit(vandq_u8(b01, low4), out);            // k 0, 1 (low nibbles)
      emit(vandq_u8(b23, low4), out + 16);       // k 2, 3
      emit(vshrq_n_u8(b01, 4), out + 32);        // k 4, 5 (high nibbles)
      emit(vshrq_n_u8(b23, 4), out + 48);        // k 6, 7
    }
  } else {
    for (int64_t kk = 0; kk < g.block; kk += 4, block += 32, out += 32) {  // one chunk: 4 k
      const uint8x16x2_t v = {{vld1q_u8(block), vld1q_u8(block + 16)}};
      emit(vqtbl2q_u8(v, idx01), out);
      emit(vqtbl2q_u8(v, idx23), out + 16);
    }
  }
}

// acc + w * x[L] by one FMLA (by element). Written as assembly: GCC 12 turns vfmaq_laneq_f16 in
// these unrolled loops into a DUP of the lane and a vector FMLA (the same fused operation, one more
// instruction). The indexed operand must be in v0-v15 ("x").
template <int L>
inline float16x8_t fmla_lane(float16x8_t acc, float16x8_t w, float16x8_t x) {
  asm("fmla %0.8h, %1.8h, %2.h[%3]" : "+w"(acc) : "w"(w), "x"(x), "i"(L));
  return acc;
}

// One activation row against one dequantized block: fp16 chunk sums flushed into fp32.
inline void block_row(const float16_t* w, const float16_t* x, int64_t block, float32x4_t (&sum)[2]) {
  sum[0] = sum[1] = vdupq_n_f32(0.f);
  for (int64_t c = 0; c < block; c += kChunk) {
    float16x8_t a0 = vdupq_n_f16(0), a1 = a0, a2 = a0, a3 = a0;  // k mod 4
    for (int j = 0; j < kChunk; j += 8, w += 64) {
      const float16x8_t xv = vld1q_f16(x + c + j);
      a0 = fmla_lane<0>(a0, vld1q_f16(w), xv);
      a1 = fmla_lane<1>(a1, vld1q_f16(w + 8), xv);
      a2 = fmla_lane<2>(a2, vld1q_f16(w + 16), xv);
      a3 = fmla_lane<3>(a3, vld1q_f16(w + 24), xv);
      a0 = fmla_lane<4>(a0, vld1q_f16(w + 32), xv);
      a1 = fmla_lane<5>(a1, vld1q_f16(w + 40), xv);
      a2 = fmla_lane<6>(a2, vld1q_f16(w + 48), xv);
      a3 = fmla_lane<7>(a3, vld1q_f16(w + 56), xv);
    }
    const float16x8_t s = vaddq_f16(vaddq_f16(a0, a1), vaddq_f16(a2, a3));
    sum[0] = vaddq_f32(sum[0], vcvt_f32_f16(vget_low_f16(s)));
    sum[1] = vaddq_f32(sum[1], vcvt_high_f32_f16(s));
  }
}

// Every block of a panel is dequantized once and used by all rows of x (GEMV: one row).
template <int BITS>
void half_matmul(const HalfMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  static_assert(kChunk % 8 == 0 && kAccs == 4, "block_row's shape");
  const WeightGeometry& g = *a.w;
  alignas(16) float16_t wbuf[256 * 8];  // one block (block <= 256)
  const auto* xs = reinterpret_cast<const float16_t*>(a.x);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = a.packed + p * g.panel_bytes;
    const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
    for (int64_t b = 0; b < g.nblocks; ++b) {
      const uint8_t* block = panel + b * g.block_bytes;
      const BlockConstants c = block_constants<BITS>(g, block);
      dequantize_block<BITS>(g, block, c, wbuf);
      const bool last = b + 1 == g.nblocks;
      for (int64_t m = m0; m < m1; ++m) {
        float32x4_t sum[2];
        block_row(wbuf, xs + m * a.ldx + b * g.block, g.block, sum);
        const float xun = a.xunscale[m * g.nblocks + b];
        float* out = a.y + m * a.ldy + n0;
        float y[8] = {};
        if (b > 0) std::copy(out, out + rows, y);
        vst1q_f32(y, vfmaq_f32(vld1q_f32(y), sum[0], vmulq_n_f32(c.unscale[0], xun)));
        vst1q_f32(y + 4, vfmaq_f32(vld1q_f32(y + 4), sum[1], vmulq_n_f32(c.unscale[1], xun)));
        for (int64_t r = 0; r < rows; ++r) out[r] = last && a.bias ? y[r] + a.bias[n0 + r] : y[r];
      }
    }
  }
}

}  // namespace

KernelTable with_fp16_float_path(KernelTable t) {
  t.float16 = {
      {"gemv_w4f16_nr8_kr4_1x8_fp16", half_matmul<4>, 4, 1, 1, 1, 1},
      {"gemm_w4f16_nr8_kr4_1x8_fp16", half_matmul<4>, 4, 1, 1, 2},
      {"gemv_w8f16_nr8_kr4_1x8_fp16", half_matmul<8>, 8, 1, 1, 1, 1},
      {"gemm_w8f16_nr8_kr4_1x8_fp16", half_matmul<8>, 8, 1, 1, 2},
  };
  return t;
}

const KernelTable& fp16_kernels() {
  static const KernelTable table = [] {
    KernelTable t = with_fp16_float_path(neon_kernels());
    t.isa = Isa::fp16;
    return t;
  }();
  return table;
}

}  // namespace qlinear
