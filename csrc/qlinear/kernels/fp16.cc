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

// Four activation rows against one dequantized block: block_row's operations for each row, in
// its order, the rows sharing the weight loads. One row is 4 chains of 8 dependent FMLAs per chunk
// (latency-bound); four rows are 16 chains, enough to keep two FMLA pipes busy. Written as
// assembly per chunk of 32 k, registers explicit: accumulators v16-v31 (row i, k mod 4 = l in
// v(16 + 4i + l)), the rows' 8 k in v0-v3 (the by-element operand must be in v0-v15), the 8 weight
// vectors of those k in v4-v7 (two loads of four), and the fp32 block sums in the 8 operands
// (v8-v15, what is left). Per chunk: 128 FMLAs, then per row (a0 + a1) + (a2 + a3), FCVTL / FCVTL2
// and two FADDs into the block sums. The accumulators start from zeros loaded from memory (the
// load pipes have room; MOVI would take a vector slot).
inline void block_rows4(const float16_t* w, const float16_t* const* x, int64_t block, float32x4_t (&sum)[4][2]) {
  alignas(16) static const float16_t kZero[8] = {};
  float32x4_t s00 = vdupq_n_f32(0.f), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00, s31 = s00;
#define H4_Z(A) "ldr q" #A ", [%[z]]\n\t"
#define H4_X(J) "ldr q0, [%[x0], #" #J "*16]\n\tldr q1, [%[x1], #" #J "*16]\n\t"  \
                "ldr q2, [%[x2], #" #J "*16]\n\tldr q3, [%[x3], #" #J "*16]\n\t"
#define H4_W(OFF) "ldr q4, [%[w], #" #OFF "]\n\tldr q5, [%[w], #" #OFF "+16]\n\t" \
                  "ldr q6, [%[w], #" #OFF "+32]\n\tldr q7, [%[w], #" #OFF "+48]\n\t"
#define H4_F1(A, W, X, H) "fmla v" #A ".8h, v" #W ".8h, v" #X ".h[" #H "]\n\t"
#define H4_F(A, B, C, D, W, H) H4_F1(A, W, 0, H) H4_F1(B, W, 1, H) H4_F1(C, W, 2, H) H4_F1(D, W, 3, H)
#define H4_K8(J, OFF, OFF2)                                                                    \
  H4_X(J) H4_W(OFF) H4_F(16, 20, 24, 28, 4, 0) H4_F(17, 21, 25, 29, 5, 1)                      \
  H4_F(18, 22, 26, 30, 6, 2) H4_F(19, 23, 27, 31, 7, 3)                                         \
  H4_W(OFF2) H4_F(16, 20, 24, 28, 4, 4) H4_F(17, 21, 25, 29, 5, 5)                             \
  H4_F(18, 22, 26, 30, 6, 6) H4_F(19, 23, 27, 31, 7, 7)
#define H4_FLUSH(A, B, C, D, S0, S1)                                                         \
  "fadd v" #A ".8h, v" #A ".8h, v" #B ".8h\n\tfadd v" #C ".8h, v" #C ".8h, v" #D ".8h\n\t" \
  "fadd v" #A ".8h, v" #A ".8h, v" #C ".8h\n\t"                                          \
  "fcvtl v" #B ".4s, v" #A ".4h\n\tfcvtl2 v" #D ".4s, v" #A ".8h\n\t"                    \
  "fadd %[" #S0 "].4s, %[" #S0 "].4s, v" #B ".4s\n\tfadd %[" #S1 "].4s, %[" #S1 "].4s, v" #D ".4s\n\t"
  const float16_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
  using Chunk = const float16_t(*)[kChunk];
  for (int64_t c = 0; c < block; c += kChunk, w += 8 * kChunk, x0 += kChunk, x1 += kChunk, x2 += kChunk, x3 += kChunk) {
    asm(H4_Z(16) H4_Z(17) H4_Z(18) H4_Z(19) H4_Z(20) H4_Z(21) H4_Z(22) H4_Z(23)
        H4_Z(24) H4_Z(25) H4_Z(26) H4_Z(27) H4_Z(28) H4_Z(29) H4_Z(30) H4_Z(31)
        H4_K8(0, 0, 64) H4_K8(1, 128, 192) H4_K8(2, 256, 320) H4_K8(3, 384, 448)
        H4_FLUSH(16, 17, 18, 19, s00, s01) H4_FLUSH(20, 21, 22, 23, s10, s11)
        H4_FLUSH(24, 25, 26, 27, s20, s21) H4_FLUSH(28, 29, 30, 31, s30, s31)
        : [s00] "+w"(s00), [s01] "+w"(s01), [s10] "+w"(s10), [s11] "+w"(s11),
          [s20] "+w"(s20), [s21] "+w"(s21), [s30] "+w"(s30), [s31] "+w"(s31)
        : [w] "r"(w), [x0] "r"(x0), [x1] "r"(x1), [x2] "r"(x2), [x3] "r"(x3), [z] "r"(kZero),
          "m"(*reinterpret_cast<const float16_t(*)[8 * kChunk]>(w)), "m"(*Chunk(x0)), "m"(*Chunk(x1)),
          "m"(*Chunk(x2)), "m"(*Chunk(x3)), "m"(kZero)
        : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v20", "v21",
          "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31");
  }
  sum[0][0] = s00, sum[0][1] = s01, sum[1][0] = s10, sum[1][1] = s11;
  sum[2][0] = s20, sum[2][1] = s21, sum[3][0] = s30, sum[3][1] = s31;
#undef H4_Z
#undef H4_X
#undef H4_W
#undef H4_F1
#undef H4_F
#undef H4_K8
#undef H4_FLUSH
}

// Every block of a panel is dequantized once and used by all rows of x, four at a time (block_rows4),
// the rows left one at a time (GEMV: one row).
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
      const float* xun = a.xunscale + b;
      const auto flush = [&](int64_t m, const float32x4_t (&sum)[2]) {
        float* out = a.y + m * a.ldy + n0;
        float y[8] = {};
        if (b > 0) std::copy(out, out + rows, y);
        vst1q_f32(y, vfmaq_f32(vld1q_f32(y), sum[0], vmulq_n_f32(c.unscale[0], xun[m * g.nblocks])));
        vst1q_f32(y + 4, vfmaq_f32(vld1q_f32(y + 4), sum[1], vmulq_n_f32(c.unscale[1], xun[m * g.nblocks])));
        for (int64_t r = 0; r < rows; ++r) out[r] = last && a.bias ? y[r] + a.bias[n0 + r] : y[r];
      };
      int64_t m = m0;
      for (; m + 4 <= m1; m += 4) {
        const float16_t* x[4];
        for (int i = 0; i < 4; ++i) x[i] = xs + (m + i) * a.ldx + b * g.block;
        float32x4_t sum[4][2];
        block_rows4(wbuf, x, g.block, sum);
        for (int i = 0; i < 4; ++i) flush(m + i, sum[i]);
      }
      for (; m < m1; ++m) {
        float32x4_t sum[2];
        block_row(wbuf, xs + m * a.ldx + b * g.block, g.block, sum);
        flush(m, sum);
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
