// ARMv8.2 FP16-arithmetic kernels: the float path for float16 activations (compiled with
// -march=armv8.2-a+fp16 in this file only; dispatch calls them only when getauxval reports fphp and
// asimdhp). The weights (int4 nr8_kr4, int8 nr8_kr4_s8; nr8_kr8 / nr8_kr8_s8 on the i8mm level) stay
// packed and are dequantized to fp16 in registers, 8 output rows per vector; products are summed
// with FMLA on float16x8_t over chunks of 64 k (32 at the end of an odd block) and flushed into
// float32 (fp16_path.h: normalization, error bound; scalar.cc: the bit-identical twin). The fp16
// level takes the neon level's int8 kernels and float32-activation path; the dotprod and i8mm
// levels add these kernels to theirs (with_fp16_float_path).
#include <arm_neon.h>

#include <algorithm>

#include "qlinear/core/fp16_path.h"
#include "qlinear/core/kernels.h"
#include "qlinear/core/layout_access.h"  // kKr8Gather

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
// one FMA with the block's constants. Not inlined: inlined into half_matmul (two blocks' constants
// live), GCC 12 passes the table lookup's register pair through the stack.
template <int BITS, int KR>
__attribute__((noinline)) void dequantize_block(const WeightGeometry& g, const uint8_t* block,
                                                const BlockConstants& c, float16_t* out) {
  static const uint8_t kIdx[2][16] = {{0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29},
                                      {2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31}};
  const uint8x16_t idx01 = vld1q_u8(kIdx[0]), idx23 = vld1q_u8(kIdx[1]);
  // Copies: the stores to out might alias c and g, which would be reloaded after each.
  const float16x8_t scale = c.scale, offset = c.offset;
  const int64_t len = g.block;
  const auto emit = [&](uint8x16_t two_k, float16_t* dst) {  // k and k + 1, 8 rows each
    const float16x8_t q0 = vcvtq_f16_u16(vmovl_u8(vget_low_u8(two_k)));
    const float16x8_t q1 = vcvtq_f16_u16(vmovl_high_u8(two_k));
    vst1q_f16(dst, vfmaq_f16(offset, q0, scale));
    vst1q_f16(dst + 8, vfmaq_f16(offset, q1, scale));
  };
  if constexpr (KR == 8) {  // nr8_kr8_s8 / nr8_kr8 (the i8mm level's): 8 k of 8 rows per 64 bytes
    const uint8x16_t flip = vdupq_n_u8(g.code_xor);
    const auto step8 = [&](const uint8x16x4_t& v, float16_t* dst) {
      for (int t = 0; t < 4; ++t) emit(veorq_u8(vqtbl4q_u8(v, vld1q_u8(kKr8Gather[t])), flip), dst + 16 * t);
    };
    if constexpr (BITS == 8) {
      for (int64_t kk = 0; kk < len; kk += 8, block += 64, out += 64) step8(vld1q_u8_x4(block), out);
    } else {  // int4: a 64-byte chunk's low nibbles are k 0-7, its high nibbles k 8-15
      for (int64_t kk = 0; kk < len; kk += 16, block += 64, out += 128) {
        uint8x16x4_t lo = vld1q_u8_x4(block), hi;
        for (int j = 0; j < 4; ++j) hi.val[j] = vshrq_n_u8(lo.val[j], 4), lo.val[j] = vandq_u8(lo.val[j], vdupq_n_u8(0x0F));
        step8(lo, out);
        step8(hi, out + 64);
      }
    }
  } else if constexpr (BITS == 4) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    for (int64_t kk = 0; kk < len; kk += 8, block += 32, out += 64) {  // one chunk: 8 k
      const uint8x16x2_t v = {{vld1q_u8(block), vld1q_u8(block + 16)}};
      const uint8x16_t b01 = vqtbl2q_u8(v, idx01), b23 = vqtbl2q_u8(v, idx23);
      emit(vandq_u8(b01, low4), out);            // k 0, 1 (low nibbles)
      emit(vandq_u8(b23, low4), out + 16);       // k 2, 3
      emit(vshrq_n_u8(b01, 4), out + 32);        // k 4, 5 (high nibbles)
      emit(vshrq_n_u8(b23, 4), out + 48);        // k 6, 7
    }
  } else {
    const uint8x16_t flip = vdupq_n_u8(g.code_xor);  // the stored bytes back to codes (nr8_kr4_s8)
    for (int64_t kk = 0; kk < len; kk += 4, block += 32, out += 32) {  // one chunk: 4 k
      const uint8x16x2_t v = {{vld1q_u8(block), vld1q_u8(block + 16)}};
      emit(veorq_u8(vqtbl2q_u8(v, idx01), flip), out);
      emit(veorq_u8(vqtbl2q_u8(v, idx23), flip), out + 16);
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

// One activation row, one chunk of LEN k of two blocks (w, x and w2, x2) at once: per block
// LEN / kChain FMA chains (k mod 4 or 2), added pairwise into s, s2. The blocks' chains are
// interleaved so that twice as many are in flight (one row alone is latency-bound). Unrolled by
// 16 k: unrolled further, GCC 12 hoists the weight loads and spills them.
template <int LEN>
inline void row_chunk_pair(const float16_t* w, const float16_t* w2, const float16_t* x, const float16_t* x2,
                           float16x8_t& s, float16x8_t& s2) {
  constexpr int C = LEN / kChain;
  static_assert(C == 4 || C == 2, "fp16_path.h's chains");
  float16x8_t a[4], b[4];
  for (int l = 0; l < 4; ++l) a[l] = b[l] = vdupq_n_f16(0);
#pragma GCC unroll 2
  for (int j = 0; j < LEN; j += 8, w += 64, w2 += 64) {
    const float16x8_t xv = vld1q_f16(x + j), xu = vld1q_f16(x2 + j);
    a[0 % C] = fmla_lane<0>(a[0 % C], vld1q_f16(w), xv);
    b[0 % C] = fmla_lane<0>(b[0 % C], vld1q_f16(w2), xu);
    a[1 % C] = fmla_lane<1>(a[1 % C], vld1q_f16(w + 8), xv);
    b[1 % C] = fmla_lane<1>(b[1 % C], vld1q_f16(w2 + 8), xu);
    a[2 % C] = fmla_lane<2>(a[2 % C], vld1q_f16(w + 16), xv);
    b[2 % C] = fmla_lane<2>(b[2 % C], vld1q_f16(w2 + 16), xu);
    a[3 % C] = fmla_lane<3>(a[3 % C], vld1q_f16(w + 24), xv);
    b[3 % C] = fmla_lane<3>(b[3 % C], vld1q_f16(w2 + 24), xu);
    a[4 % C] = fmla_lane<4>(a[4 % C], vld1q_f16(w + 32), xv);
    b[4 % C] = fmla_lane<4>(b[4 % C], vld1q_f16(w2 + 32), xu);
    a[5 % C] = fmla_lane<5>(a[5 % C], vld1q_f16(w + 40), xv);
    b[5 % C] = fmla_lane<5>(b[5 % C], vld1q_f16(w2 + 40), xu);
    a[6 % C] = fmla_lane<6>(a[6 % C], vld1q_f16(w + 48), xv);
    b[6 % C] = fmla_lane<6>(b[6 % C], vld1q_f16(w2 + 48), xu);
    a[7 % C] = fmla_lane<7>(a[7 % C], vld1q_f16(w + 56), xv);
    b[7 % C] = fmla_lane<7>(b[7 % C], vld1q_f16(w2 + 56), xu);
  }
  if constexpr (C == 4) {
    s = vaddq_f16(vaddq_f16(a[0], a[1]), vaddq_f16(a[2], a[3]));
    s2 = vaddq_f16(vaddq_f16(b[0], b[1]), vaddq_f16(b[2], b[3]));
  } else {
    s = vaddq_f16(a[0], a[1]);
    s2 = vaddq_f16(b[0], b[1]);
  }
}

// The flush: a chunk sum converted to fp32 and added to the block sum.
inline void flush_chunk(float16x8_t s, float32x4_t (&sum)[2]) {
  sum[0] = vaddq_f32(sum[0], vcvt_f32_f16(vget_low_f16(s)));
  sum[1] = vaddq_f32(sum[1], vcvt_high_f32_f16(s));
}

// One activation row against one or two consecutive dequantized blocks (w: one after the other;
// x: the row at the first; two: sum[1] is the second's): fp16 chunk sums flushed into fp32.
inline void block_rows1(const float16_t* w, const float16_t* x, int64_t block, bool two, float32x4_t (&sum)[2][2]) {
  sum[0][0] = sum[0][1] = sum[1][0] = sum[1][1] = vdupq_n_f32(0.f);
  // A lone block is computed twice (its second copy discarded) rather than by another code path.
  const float16_t *w2 = two ? w + 8 * block : w, *x2 = two ? x + block : x;
  int64_t c = 0;
  for (; c + kChunk <= block; c += kChunk, w += 8 * kChunk, w2 += 8 * kChunk) {
    float16x8_t s, s2;
    row_chunk_pair<kChunk>(w, w2, x + c, x2 + c, s, s2);
    flush_chunk(s, sum[0]);
    flush_chunk(s2, sum[1]);
  }
  if (c < block) {
    float16x8_t s, s2;
    row_chunk_pair<kShortChunk>(w, w2, x + c, x2 + c, s, s2);
    flush_chunk(s, sum[0]);
    flush_chunk(s2, sum[1]);
  }
}

// Four activation rows against one dequantized block: block_rows1's operations for each row, in
// its order, the rows sharing the weight loads. One row is 4 (2) chains of dependent FMLAs per
// chunk of 64 (32) k, latency-bound; four rows are 16 (8) chains, enough to keep two FMLA pipes
// busy. Written as assembly per chunk, registers explicit: accumulators v16-v31 (row i, chain l
// in v(16 + 4i + l)), the rows' 8 k in v0-v3 (the by-element operand must be in v0-v15), the 8
// weight vectors of those k in v4-v7 (two loads of four), and the fp32 block sums in the 8
// operands (v8-v15, what is left). Per chunk of 64 k: 256 FMLAs, then per row (a0 + a1) +
// (a2 + a3), FCVTL / FCVTL2 and two FADDs into the block sums (none for a block's first chunk:
// its sum is the block sum so far; the twin's 0 + s differs from s only in the sign of a zero,
// which y = fma(sum, unscale, y) does not keep, y never being -0). Per row that flush is 7 (5) instructions per 64 FMLAs; with
// the former chunks of 32 k in 4 chains it was 7 per 32 and capped the loop at ~78% of the FMLA
// rate. The accumulators start from zeros loaded from memory (the load pipes have room; MOVI would
// take a vector slot).
template <int LEN>
using Chunk = const float16_t(*)[LEN];

inline void block_rows4(const float16_t* w, const float16_t* const* x, int64_t block, float32x4_t (&sum)[4][2]) {
  alignas(16) static const float16_t kZero[8] = {};
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
#define H4_K8_2(J, OFF, OFF2) /* 2 chains: k mod 2 */                                          \
  H4_X(J) H4_W(OFF) H4_F(16, 20, 24, 28, 4, 0) H4_F(17, 21, 25, 29, 5, 1)                      \
  H4_F(16, 20, 24, 28, 6, 2) H4_F(17, 21, 25, 29, 7, 3)                                         \
  H4_W(OFF2) H4_F(16, 20, 24, 28, 4, 4) H4_F(17, 21, 25, 29, 5, 5)                             \
  H4_F(16, 20, 24, 28, 6, 6) H4_F(17, 21, 25, 29, 7, 7)
// Per row (chains in A, B, C, D; 2 chains: A, B, with C, D free): the chains' sum, converted, added
// to the block sums S0, S1 (FLUSH*) or written to them (*_FIRST).
#define H4_FLUSH4(A, B, C, D, S0, S1)                                                        \
  "fadd v" #A ".8h, v" #A ".8h, v" #B ".8h\n\tfadd v" #C ".8h, v" #C ".8h, v" #D ".8h\n\t" \
  "fadd v" #A ".8h, v" #A ".8h, v" #C ".8h\n\t"                                          \
  "fcvtl v" #B ".4s, v" #A ".4h\n\tfcvtl2 v" #D ".4s, v" #A ".8h\n\t"                    \
  "fadd %[" #S0 "].4s, %[" #S0 "].4s, v" #B ".4s\n\tfadd %[" #S1 "].4s, %[" #S1 "].4s, v" #D ".4s\n\t"
#define H4_FLUSH4_FIRST(A, B, C, D, S0, S1)                                                  \
  "fadd v" #A ".8h, v" #A ".8h, v" #B ".8h\n\tfadd v" #C ".8h, v" #C ".8h, v" #D ".8h\n\t" \
  "fadd v" #A ".8h, v" #A ".8h, v" #C ".8h\n\t"                                          \
  "fcvtl %[" #S0 "].4s, v" #A ".4h\n\tfcvtl2 %[" #S1 "].4s, v" #A ".8h\n\t"
#define H4_FLUSH2(A, B, C, D, S0, S1)                                                        \
  "fadd v" #A ".8h, v" #A ".8h, v" #B ".8h\n\t"                                          \
  "fcvtl v" #B ".4s, v" #A ".4h\n\tfcvtl2 v" #D ".4s, v" #A ".8h\n\t"                    \
  "fadd %[" #S0 "].4s, %[" #S0 "].4s, v" #B ".4s\n\tfadd %[" #S1 "].4s, %[" #S1 "].4s, v" #D ".4s\n\t"
#define H4_FLUSH2_FIRST(A, B, C, D, S0, S1)                                                  \
  "fadd v" #A ".8h, v" #A ".8h, v" #B ".8h\n\t"                                          \
  "fcvtl %[" #S0 "].4s, v" #A ".4h\n\tfcvtl2 %[" #S1 "].4s, v" #A ".8h\n\t"
#define H4_ZERO4 H4_Z(16) H4_Z(17) H4_Z(18) H4_Z(19) H4_Z(20) H4_Z(21) H4_Z(22) H4_Z(23) \
                 H4_Z(24) H4_Z(25) H4_Z(26) H4_Z(27) H4_Z(28) H4_Z(29) H4_Z(30) H4_Z(31)
#define H4_ZERO2 H4_Z(16) H4_Z(17) H4_Z(20) H4_Z(21) H4_Z(24) H4_Z(25) H4_Z(28) H4_Z(29)
  // One chunk of LEN k: ZERO the chains, BODY the FMLAs, FLUSH per row; SUM: the block sums' operand
  // constraint (read and written, or written by a block's first chunk).
#define H4_CHUNK(LEN, ZERO, BODY, FLUSH, SUM)                                                        \
  asm(ZERO BODY                                                                                    \
      FLUSH(16, 17, 18, 19, s00, s01) FLUSH(20, 21, 22, 23, s10, s11)                              \
      FLUSH(24, 25, 26, 27, s20, s21) FLUSH(28, 29, 30, 31, s30, s31)                              \
      : [s00] SUM(s00), [s01] SUM(s01), [s10] SUM(s10), [s11] SUM(s11),                            \
        [s20] SUM(s20), [s21] SUM(s21), [s30] SUM(s30), [s31] SUM(s31)                             \
      : [w] "r"(w), [x0] "r"(x0), [x1] "r"(x1), [x2] "r"(x2), [x3] "r"(x3), [z] "r"(kZero),       \
        "m"(*reinterpret_cast<const float16_t(*)[8 * LEN]>(w)), "m"(*Chunk<LEN>(x0)),              \
        "m"(*Chunk<LEN>(x1)), "m"(*Chunk<LEN>(x2)), "m"(*Chunk<LEN>(x3)), "m"(kZero)               \
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v20", "v21",  \
        "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31")
#define H4_ADD(S) "+w"(S)
#define H4_SET(S) "=w"(S)
#define H4_BODY32 H4_K8_2(0, 0, 64) H4_K8_2(1, 128, 192) H4_K8_2(2, 256, 320) H4_K8_2(3, 384, 448)
#define H4_BODY64 H4_K8(0, 0, 64) H4_K8(1, 128, 192) H4_K8(2, 256, 320) H4_K8(3, 384, 448) \
                  H4_K8(4, 512, 576) H4_K8(5, 640, 704) H4_K8(6, 768, 832) H4_K8(7, 896, 960)
  static_assert(kChunk == 64 && kShortChunk == 32, "block_rows4's chunk bodies");
  float32x4_t s00, s01, s10, s11, s20, s21, s30, s31;
  const float16_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
  const auto next = [&](int64_t len) { w += 8 * len, x0 += len, x1 += len, x2 += len, x3 += len; };
  if (block < kChunk) {  // a block of 32: one chunk
    H4_CHUNK(32, H4_ZERO2, H4_BODY32, H4_FLUSH2_FIRST, H4_SET);
  } else {
    H4_CHUNK(64, H4_ZERO4, H4_BODY64, H4_FLUSH4_FIRST, H4_SET);
    next(kChunk);
    for (int64_t c = kChunk; c + kChunk <= block; c += kChunk, next(kChunk)) {
      H4_CHUNK(64, H4_ZERO4, H4_BODY64, H4_FLUSH4, H4_ADD);
    }
    if (block % kChunk) H4_CHUNK(32, H4_ZERO2, H4_BODY32, H4_FLUSH2, H4_ADD);
  }
  sum[0][0] = s00, sum[0][1] = s01, sum[1][0] = s10, sum[1][1] = s11;
  sum[2][0] = s20, sum[2][1] = s21, sum[3][0] = s30, sum[3][1] = s31;
#undef H4_Z
#undef H4_X
#undef H4_W
#undef H4_F1
#undef H4_F
#undef H4_K8
#undef H4_K8_2
#undef H4_FLUSH4
#undef H4_FLUSH4_FIRST
#undef H4_FLUSH2
#undef H4_FLUSH2_FIRST
#undef H4_ZERO4
#undef H4_ZERO2
#undef H4_CHUNK
#undef H4_ADD
#undef H4_SET
#undef H4_BODY32
#undef H4_BODY64
}

// Every block of a panel is dequantized once and used by all rows of x, four at a time (block_rows4),
// the rows left one at a time (GEMV: one row), two blocks at a time (block_rows1).
template <int BITS, int KR>
void half_matmul(const HalfMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& g = *a.w;
  alignas(16) float16_t wbuf[2 * 256 * 8];  // two blocks (block <= 256)
  const auto* xs = reinterpret_cast<const float16_t*>(a.x);
  const int64_t m4 = m0 + (m1 - m0) / 4 * 4;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = a.packed + p * g.panel_bytes;
    const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
    for (int64_t b = 0, nb; b < g.nblocks; b += nb) {
      nb = b + 1 < g.nblocks ? 2 : 1;
      BlockConstants c[2];
      for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* block = panel + (b + i) * g.block_bytes;
        c[i] = block_constants<BITS>(g, block);
        dequantize_block<BITS, KR>(g, block, c[i], wbuf + i * 8 * g.block);
      }
      const auto flush = [&](int64_t i, int64_t m, const float32x4_t (&sum)[2]) {  // block b + i, row m
        const int64_t bi = b + i;
        const float xun = a.xunscale[m * g.nblocks + bi];
        float* out = a.y + m * a.ldy + n0;
        float y[8] = {};
        if (bi > 0) std::copy(out, out + rows, y);
        vst1q_f32(y, vfmaq_f32(vld1q_f32(y), sum[0], vmulq_n_f32(c[i].unscale[0], xun)));
        vst1q_f32(y + 4, vfmaq_f32(vld1q_f32(y + 4), sum[1], vmulq_n_f32(c[i].unscale[1], xun)));
        const bool last = bi + 1 == g.nblocks;
        for (int64_t r = 0; r < rows; ++r) out[r] = last && a.bias ? y[r] + a.bias[n0 + r] : y[r];
      };
      for (int64_t i = 0; i < nb; ++i) {
        for (int64_t m = m0; m < m4; m += 4) {
          const float16_t* x[4];
          for (int r = 0; r < 4; ++r) x[r] = xs + (m + r) * a.ldx + (b + i) * g.block;
          float32x4_t sum[4][2];
          block_rows4(wbuf + i * 8 * g.block, x, g.block, sum);
          for (int r = 0; r < 4; ++r) flush(i, m + r, sum[r]);
        }
      }
      for (int64_t m = m4; m < m1; ++m) {
        const float16_t* x = xs + m * a.ldx + b * g.block;
        float32x4_t sum[2][2];
        block_rows1(wbuf, x, g.block, nb == 2, sum);
        for (int64_t i = 0; i < nb; ++i) flush(i, m, sum[i]);
      }
    }
  }
}

}  // namespace

KernelTable with_fp16_float_path(KernelTable t) {
  // the table's kr (its layouts): the dequantization is compiled for it
  if (layout_info(t.layout).kr == 8)
    t.float16 = {
        {"gemv_w4f16_nr8_kr8_1x8_fp16", half_matmul<4, 8>, 4, 1, 1, 1, 1},
        {"gemm_w4f16_nr8_kr8_1x8_fp16", half_matmul<4, 8>, 4, 1, 1, 2},
        {"gemv_w8f16_nr8_kr8_s8_1x8_fp16", half_matmul<8, 8>, 8, 1, 1, 1, 1},
        {"gemm_w8f16_nr8_kr8_s8_1x8_fp16", half_matmul<8, 8>, 8, 1, 1, 2},
    };
  else
    t.float16 = {
        {"gemv_w4f16_nr8_kr4_1x8_fp16", half_matmul<4, 4>, 4, 1, 1, 1, 1},
        {"gemm_w4f16_nr8_kr4_1x8_fp16", half_matmul<4, 4>, 4, 1, 1, 2},
        {"gemv_w8f16_nr8_kr4_s8_1x8_fp16", half_matmul<8, 4>, 8, 1, 1, 1, 1},
        {"gemm_w8f16_nr8_kr4_s8_1x8_fp16", half_matmul<8, 4>, 8, 1, 1, 2},
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
