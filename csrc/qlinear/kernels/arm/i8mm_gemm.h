// The i8mm level's GEMMs (mmla_gemm_int8, mmla_gemm_int4<kr>: 12-row SMMLA tiles, panels
// staged where it pays); i8mm.cc's only, included there after its level is named (i8mm.cc's
// header describes the method).
#pragma once

#include <vector>

#include "qlinear/kernels/arm/neon_table.h"

namespace qlinear {
namespace {

constexpr int kTileRows = 12;
constexpr int kPanelGroup = 8;  // panels per packed block of activations
constexpr int kStagePanels = 4; // panels staged at a time (the driver's GEMM task): 32 x K bytes

// The row pairs' activations of k [k0, k0 + block) as SMMLA operands: per 8 k, NP operands of
// 16 bytes (row 2i's 8 k, then row 2i + 1's).
template <int NP>
inline void pack_pairs(const int8_t* const* x, int64_t k0, int64_t block, int8_t* out) {
  for (int64_t kk = k0; kk < k0 + block; kk += 16, out += 32 * NP)
    for (int i = 0; i < NP; ++i) {
      const int64x2_t a = vreinterpretq_s64_s8(vld1q_s8(x[2 * i] + kk));
      const int64x2_t b = vreinterpretq_s64_s8(vld1q_s8(x[2 * i + 1] + kk));
      vst1q_s8(out + 16 * i, vreinterpretq_s8_s64(vzip1q_s64(a, b)));
      vst1q_s8(out + 16 * (NP + i), vreinterpretq_s8_s64(vzip2q_s64(a, b)));
    }
}

// The 4 weight operands of 8 k of an int4 nr8_kr4 block (rows (0,1) (2,3) (4,5) (6,7)), w
// advanced past them: the 32-bit lanes (4 k of a row) of the low and high nibbles zipped.
inline void zipped_operands(const uint8_t*& w, uint8x16_t (&b)[4]) {
  const uint8x16x2_t v = vld1q_u8_x2(w);
  w += 32;
  for (int h = 0; h < 2; ++h) {
    const uint32x4_t lo = vreinterpretq_u32_u8(vandq_u8(v.val[h], vdupq_n_u8(0x0F)));
    const uint32x4_t hi = vreinterpretq_u32_u8(vshrq_n_u8(v.val[h], 4));
    b[2 * h] = vreinterpretq_u8_u32(vzip1q_u32(lo, hi));
    b[2 * h + 1] = vreinterpretq_u8_u32(vzip2q_u32(lo, hi));
  }
}

// Panels [p, p + np) of an int4 weight of kr KR as SMMLA operands: per panel (8 x padded K bytes),
// per 8 k, the 4 operands (64 bytes): the order nr8_kr8_s8 stores int8 in. Loads and stores of
// single registers (LDP / STP pairs) and the geometry in locals: in the V1 model LD1 / ST1 of 4
// registers make the nr8_kr4 loop 2.7 cycles per 8 k (3.0 with g.block reloaded each time: out may
// alias it), STPs 2.0. Not inlined: its own symbol, so that bench/arm_kernels.py finds and prices
// its loop.
template <int KR>
__attribute__((noinline)) void stage_panels(const WeightGeometry& g, const uint8_t* packed, int64_t p, int64_t np,
                                            uint8_t* out) {
  const int64_t block = g.block, nb = g.nblocks, panel_bytes = g.panel_bytes, block_bytes = g.block_bytes;
  for (int64_t q = 0; q < np; ++q)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* w = packed + (p + q) * panel_bytes + b * block_bytes;
      const uint8_t* end = out + 8 * block;
      if constexpr (KR == 8) {
        for (; out != end; out += 128) {  // 16 k: the low nibbles are k 0-7, the high k 8-15
          const uint8x16_t v0 = vld1q_u8(w), v1 = vld1q_u8(w + 16), v2 = vld1q_u8(w + 32), v3 = vld1q_u8(w + 48);
          w += 64;
          const uint8x16_t m = vdupq_n_u8(0x0F);
          vst1q_u8(out, vandq_u8(v0, m));
          vst1q_u8(out + 16, vandq_u8(v1, m));
          vst1q_u8(out + 32, vandq_u8(v2, m));
          vst1q_u8(out + 48, vandq_u8(v3, m));
          vst1q_u8(out + 64, vshrq_n_u8(v0, 4));
          vst1q_u8(out + 80, vshrq_n_u8(v1, 4));
          vst1q_u8(out + 96, vshrq_n_u8(v2, 4));
          vst1q_u8(out + 112, vshrq_n_u8(v3, 4));
        }
      } else {
        for (; out != end; out += 64) {
          uint32x4_t c[4];  // low nibbles of rows 0-3 / 4-7, high nibbles
          const uint8x16_t v0 = vld1q_u8(w), v1 = vld1q_u8(w + 16);
          w += 32;
          c[0] = vreinterpretq_u32_u8(vandq_u8(v0, vdupq_n_u8(0x0F)));
          c[1] = vreinterpretq_u32_u8(vandq_u8(v1, vdupq_n_u8(0x0F)));
          c[2] = vreinterpretq_u32_u8(vshrq_n_u8(v0, 4));
          c[3] = vreinterpretq_u32_u8(vshrq_n_u8(v1, 4));
          vst1q_u8(out, vreinterpretq_u8_u32(vzip1q_u32(c[0], c[2])));
          vst1q_u8(out + 16, vreinterpretq_u8_u32(vzip2q_u32(c[0], c[2])));
          vst1q_u8(out + 32, vreinterpretq_u8_u32(vzip1q_u32(c[1], c[3])));
          vst1q_u8(out + 48, vreinterpretq_u8_u32(vzip2q_u32(c[1], c[3])));
        }
      }
    }
}

// One block of one panel against NP packed row pairs: t[i][j] = init[i][j] + the 2 x 2 tile
// (weight rows 2j, 2j + 1) x (activation rows 2i, 2i + 1), lanes (2j 2i, 2j 2i+1, 2j+1 2i, 2j+1 2i+1).
// STAGED: w holds the operands in order, no unpacking: stage_panels' copy of an int4 block, or an
// int8 block as stored (nr8_kr8_s8). Else int4 of kr KR, unpacked in the loop.
template <int BITS, int KR, int NP, bool STAGED>
inline void mma_block(const uint8_t* w, const int8_t* xp, int64_t block, const int32x4_t (&init)[NP][4],
                      int32x4_t (&t)[NP][4]) {
  static_assert(STAGED || BITS == 4, "int8 blocks are operands as stored (STAGED)");
  if constexpr (NP == 6) {
    // The full tile in assembly (GCC 12 spills the intrinsics' 24 accumulators): tile (i, j) in
    // %[tij], 24 of the statement's 30 operands, loaded from init; per 8 k, the 4 weight operands
    // (staged: one load; nr8_kr4: USHR, AND, ZIP) in v28-v31, 3 LDPs of 2 activation pairs, 24
    // SMMLAs (nr8_kr8: per 16 k, below).
#define QLINEAR_MMLA_PAIR(I, A)                                                                 \
    "smmla  %[t" I "0].4s, v30.16b, " A ".16b\n\t"                                               \
    "smmla  %[t" I "1].4s, v28.16b, " A ".16b\n\t"                                               \
    "smmla  %[t" I "2].4s, v31.16b, " A ".16b\n\t"                                               \
    "smmla  %[t" I "3].4s, v29.16b, " A ".16b\n\t"
#define QLINEAR_MMLA_INIT2(I, OFF)                                                              \
    "ldp %q[t" I "0], %q[t" I "1], [%[i], #" OFF "]\n\t"                                         \
    "ldp %q[t" I "2], %q[t" I "3], [%[i], #" OFF " + 32]\n\t"
#define QLINEAR_MMLA_INIT                                                                       \
    QLINEAR_MMLA_INIT2("0", "0") QLINEAR_MMLA_INIT2("1", "64") QLINEAR_MMLA_INIT2("2", "128")    \
    QLINEAR_MMLA_INIT2("3", "192") QLINEAR_MMLA_INIT2("4", "256") QLINEAR_MMLA_INIT2("5", "320")
#define QLINEAR_MMLA_TILE                                                                       \
    "zip1 v30.4s, v26.4s, v28.4s\n\t" /* rows 0, 1 */                                           \
    "zip2 v28.4s, v26.4s, v28.4s\n\t" /* rows 2, 3 */                                           \
    "zip1 v31.4s, v27.4s, v29.4s\n\t" /* rows 4, 5 */                                           \
    "zip2 v29.4s, v27.4s, v29.4s\n\t" /* rows 6, 7 */                                           \
    "ldp q26, q27, [%[x]], #32\n\t"                                                              \
    QLINEAR_MMLA_PAIR("0", "v26") QLINEAR_MMLA_PAIR("1", "v27")                                  \
    "ldp q26, q27, [%[x]], #32\n\t"                                                              \
    QLINEAR_MMLA_PAIR("2", "v26") QLINEAR_MMLA_PAIR("3", "v27")                                  \
    "ldp q26, q27, [%[x]], #32\n\t"                                                              \
    QLINEAR_MMLA_PAIR("4", "v26") QLINEAR_MMLA_PAIR("5", "v27")                                  \
    "cmp %[x], %[e]\n\t"                                                                         \
    "b.ne 1b\n\t"
#define QLINEAR_MMLA_OPERANDS                                                                   \
    : [w] "+r"(w), [x] "+r"(xp),                                                                 \
      [t00] "=w"(t[0][0]), [t01] "=w"(t[0][1]), [t02] "=w"(t[0][2]), [t03] "=w"(t[0][3]),        \
      [t10] "=w"(t[1][0]), [t11] "=w"(t[1][1]), [t12] "=w"(t[1][2]), [t13] "=w"(t[1][3]),        \
      [t20] "=w"(t[2][0]), [t21] "=w"(t[2][1]), [t22] "=w"(t[2][2]), [t23] "=w"(t[2][3]),        \
      [t30] "=w"(t[3][0]), [t31] "=w"(t[3][1]), [t32] "=w"(t[3][2]), [t33] "=w"(t[3][3]),        \
      [t40] "=w"(t[4][0]), [t41] "=w"(t[4][1]), [t42] "=w"(t[4][2]), [t43] "=w"(t[4][3]),        \
      [t50] "=w"(t[5][0]), [t51] "=w"(t[5][1]), [t52] "=w"(t[5][2]), [t53] "=w"(t[5][3])         \
    : [e] "r"(xp + 16 * NP * block / 8), [i] "r"(&init[0][0])                                    \
    : "cc", "memory", "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31"
#define QLINEAR_MMLA_SPAIR(I, A)                                                                \
    "smmla  %[t" I "0].4s, v28.16b, " A ".16b\n\t"                                               \
    "smmla  %[t" I "1].4s, v29.16b, " A ".16b\n\t"                                               \
    "smmla  %[t" I "2].4s, v30.16b, " A ".16b\n\t"                                               \
    "smmla  %[t" I "3].4s, v31.16b, " A ".16b\n\t"
    if constexpr (STAGED) {
      // per 8 k: one 64-byte load of the 4 operands, 3 LDPs of activations, 24 SMMLAs
      asm(QLINEAR_MMLA_INIT
          "1:\n\t"
          "ld1 {v28.16b-v31.16b}, [%[w]], #64\n\t"
          "ldp q26, q27, [%[x]], #32\n\t"
          QLINEAR_MMLA_SPAIR("0", "v26") QLINEAR_MMLA_SPAIR("1", "v27")
          "ldp q26, q27, [%[x]], #32\n\t"
          QLINEAR_MMLA_SPAIR("2", "v26") QLINEAR_MMLA_SPAIR("3", "v27")
          "ldp q26, q27, [%[x]], #32\n\t"
          QLINEAR_MMLA_SPAIR("4", "v26") QLINEAR_MMLA_SPAIR("5", "v27")
          "cmp %[x], %[e]\n\t"
          "b.ne 1b\n\t"
          QLINEAR_MMLA_OPERANDS);
    } else if constexpr (KR == 8) {
      // per 16 k, two row pairs of weights at a time: LDP, AND (k 0-7) and USHR (k 8-15) into
      // v30 v31 / v28 v29, each against the 12 activation operands of the 16 k (6 LDPs; read again
      // for the other two pairs): 48 SMMLAs, 8 unpacking instructions
#define QLINEAR_MMLA_HALF(I, J0, J1, W0, W1, A)                                                 \
    "smmla  %[t" I J0 "].4s, " W0 ".16b, " A ".16b\n\t"                                          \
    "smmla  %[t" I J1 "].4s, " W1 ".16b, " A ".16b\n\t"
#define QLINEAR_MMLA_PAIRS(J0, J1, LDX0, LDX1, LDX2, LDX3, LDX4, LDX5)                         \
    "ldp q28, q29, [%[w]], #32\n\t"                                                             \
    "and  v30.16b, v28.16b, v25.16b\n\t"                                                        \
    "and  v31.16b, v29.16b, v25.16b\n\t"                                                        \
    "ushr v28.16b, v28.16b, #4\n\t"                                                             \
    "ushr v29.16b, v29.16b, #4\n\t"                                                             \
    LDX0 QLINEAR_MMLA_HALF("0", J0, J1, "v30", "v31", "v26") QLINEAR_MMLA_HALF("1", J0, J1, "v30", "v31", "v27") \
    LDX1 QLINEAR_MMLA_HALF("2", J0, J1, "v30", "v31", "v26") QLINEAR_MMLA_HALF("3", J0, J1, "v30", "v31", "v27") \
    LDX2 QLINEAR_MMLA_HALF("4", J0, J1, "v30", "v31", "v26") QLINEAR_MMLA_HALF("5", J0, J1, "v30", "v31", "v27") \
    LDX3 QLINEAR_MMLA_HALF("0", J0, J1, "v28", "v29", "v26") QLINEAR_MMLA_HALF("1", J0, J1, "v28", "v29", "v27") \
    LDX4 QLINEAR_MMLA_HALF("2", J0, J1, "v28", "v29", "v26") QLINEAR_MMLA_HALF("3", J0, J1, "v28", "v29", "v27") \
    LDX5 QLINEAR_MMLA_HALF("4", J0, J1, "v28", "v29", "v26") QLINEAR_MMLA_HALF("5", J0, J1, "v28", "v29", "v27")
#define QLINEAR_LDX(OFF) "ldp q26, q27, [%[x], #" OFF "]\n\t"
#define QLINEAR_LDX_NEXT "ldp q26, q27, [%[x]], #32\n\t"
      asm(QLINEAR_MMLA_INIT
          "movi v25.16b, #0x0f\n\t"
          "1:\n\t"
          QLINEAR_MMLA_PAIRS("0", "1", QLINEAR_LDX_NEXT, QLINEAR_LDX_NEXT, QLINEAR_LDX_NEXT, QLINEAR_LDX_NEXT,
                             QLINEAR_LDX_NEXT, QLINEAR_LDX_NEXT)
          QLINEAR_MMLA_PAIRS("2", "3", QLINEAR_LDX("-192"), QLINEAR_LDX("-160"), QLINEAR_LDX("-128"),
                             QLINEAR_LDX("-96"), QLINEAR_LDX("-64"), QLINEAR_LDX("-32"))
          "cmp %[x], %[e]\n\t"
          "b.ne 1b\n\t"
          QLINEAR_MMLA_OPERANDS);
#undef QLINEAR_LDX_NEXT
#undef QLINEAR_LDX
#undef QLINEAR_MMLA_PAIRS
#undef QLINEAR_MMLA_HALF
    } else {
      asm(QLINEAR_MMLA_INIT
          "movi v25.16b, #0x0f\n\t"
          "1:\n\t"
          "ld1 {v26.16b, v27.16b}, [%[w]], #32\n\t"  // rows 0-3, 4-7: k 0-3 low, k 4-7 high nibbles
          "ushr v28.16b, v26.16b, #4\n\t"
          "ushr v29.16b, v27.16b, #4\n\t"
          "and  v26.16b, v26.16b, v25.16b\n\t"
          "and  v27.16b, v27.16b, v25.16b\n\t"
          QLINEAR_MMLA_TILE QLINEAR_MMLA_OPERANDS);
    }
#undef QLINEAR_MMLA_PAIR
#undef QLINEAR_MMLA_SPAIR
#undef QLINEAR_MMLA_INIT2
#undef QLINEAR_MMLA_INIT
#undef QLINEAR_MMLA_TILE
#undef QLINEAR_MMLA_OPERANDS
  } else {
    for (int i = 0; i < NP; ++i)
      for (int j = 0; j < 4; ++j) t[i][j] = init[i][j];
    const auto step8 = [&](const uint8x16_t (&b)[4]) {  // 8 k: the 4 weight operands, NP activation ones
      for (int i = 0; i < NP; ++i) {
        const int8x16_t a = vld1q_s8(xp + 16 * i);
        for (int j = 0; j < 4; ++j) t[i][j] = vmmlaq_s32(t[i][j], vreinterpretq_s8_u8(b[j]), a);
      }
      xp += 16 * NP;
    };
    for (int64_t kk = 0; kk < block; kk += STAGED || KR == 4 ? 8 : 16) {
      uint8x16_t b[4];
      if constexpr (STAGED) {
        const uint8x16x4_t v = vld1q_u8_x4(w);
        w += 64;
        for (int j = 0; j < 4; ++j) b[j] = v.val[j];
        step8(b);
      } else if constexpr (KR == 8) {
        const uint8x16x4_t v = vld1q_u8_x4(w);
        w += 64;
        for (int j = 0; j < 4; ++j) b[j] = vandq_u8(v.val[j], vdupq_n_u8(0x0F));
        step8(b);
        for (int j = 0; j < 4; ++j) b[j] = vshrq_n_u8(v.val[j], 4);
        step8(b);
      } else {
        zipped_operands(w, b);
        step8(b);
      }
    }
  }
}

// R rows (1..12) from row m against panels [p0, p1): per group of panels, per block, the rows'
// activations packed once, then each panel's block. The float epilogue is panel_tile's, the same
// operations on the same values, computed in the tiles' lane order (row pair x weight row pair)
// and turned into rows at the end: per output, y = fma(y, float(acc + shifted_sum), scale * s_x),
// then (asymmetric) y = fma(y, offset, scaled_sum).
// staged: stage_panels' copy of panels [p0, p1) (int4 STAGED only). KR: the int4 weight's kr.
template <int BITS, int KR, int R, bool STAGED>
void mmla_rows(const Int8MatmulArgs& a, int64_t m, int64_t p0, int64_t p1, const uint8_t* staged) {
  // Row pairs: an odd last row is paired with itself; 9 and 10 rows run the full tile (5 pairs
  // would spill as intrinsics), the rows past R repeating the last.
  constexpr int NP = R > 8 ? 6 : (R + 1) / 2;
  const WeightGeometry& g = *a.w;
  const int64_t nb = g.nblocks;
  // the shifted sums' factor code_shift - zero_point: 0 for asymmetric int4 and symmetric int8
  const bool shifted = (BITS == 8 ? 128 : 0) != g.zero_point();
  const int8_t* x[2 * NP];
  int64_t at[2 * NP];  // the row's (row, block 0) entry of the per-block arrays
  for (int i = 0; i < 2 * NP; ++i) {
    const int64_t r = m + std::min(i, R - 1);
    x[i] = a.act.q + r * a.act.ldq;
    at[i] = r * nb;
  }
  alignas(16) int8_t xp[2 * NP * 256];  // one block (<= 256 k)
  int32x4_t init[NP][4];                // the tiles' initial values: the rows' shifted sums
  float32x4_t sx[NP], sxsum[NP] = {};   // per pair, in lane order
  for (int i = 0; i < NP; ++i)
    for (int j = 0; j < 4; ++j) init[i][j] = vdupq_n_s32(0);
  for (int64_t pg = p0; pg < p1; pg += kPanelGroup) {
    const int64_t np = std::min<int64_t>(kPanelGroup, p1 - pg);
    float32x4_t y[kPanelGroup][NP][4];
    for (int64_t q = 0; q < np; ++q)
      for (int i = 0; i < NP; ++i)
        for (int j = 0; j < 4; ++j) y[q][i][j] = vdupq_n_f32(0.f);
    for (int64_t b = 0; b < nb; ++b) {
      pack_pairs<NP>(x, b * g.block, g.block, xp);
      for (int i = 0; i < NP; ++i) {
        const int64_t r0 = at[2 * i] + b, r1 = at[2 * i + 1] + b;
        const float s[4] = {a.act.scale[r0], a.act.scale[r1], a.act.scale[r0], a.act.scale[r1]};
        sx[i] = vld1q_f32(s);
        if (shifted) {
          const int32_t z[4] = {a.act.shifted_sum[r0], a.act.shifted_sum[r1], a.act.shifted_sum[r0], a.act.shifted_sum[r1]};
          init[i][0] = init[i][1] = init[i][2] = init[i][3] = vld1q_s32(z);
        }
        if (!g.symmetric) {
          const float ss[4] = {a.act.scaled_sum[r0], a.act.scaled_sum[r1], a.act.scaled_sum[r0], a.act.scaled_sum[r1]};
          sxsum[i] = vld1q_f32(ss);
        }
      }
      for (int64_t q = 0; q < np; ++q) {
        const uint8_t* block = a.packed + (pg + q) * g.panel_bytes + b * g.block_bytes;
        int32x4_t t[NP][4];
        // int8 (nr8_kr8_s8): the block's codes are the operands; int4 staged: the copy's
        const uint8_t* w = STAGED && BITS == 4 ? staged + ((pg - p0 + q) * nb + b) * g.block * 8 : block;
        mma_block<BITS, KR, NP, STAGED>(w, xp, g.block, init, t);
        // scales (offsets) in lane order: (s0 s0 s1 s1) (s2 s2 s3 s3) (s4 s4 s5 s5) (s6 s6 s7 s7)
        const auto lanes = [](const uint8_t* p, float32x4_t (&v)[4]) {
          const float32x4_t lo = arm::load_half4(p), hi = arm::load_half4(p + 8);
          v[0] = vzip1q_f32(lo, lo), v[1] = vzip2q_f32(lo, lo), v[2] = vzip1q_f32(hi, hi), v[3] = vzip2q_f32(hi, hi);
        };
        float32x4_t scale[4], offset[4];
        lanes(block + g.code_bytes, scale);
        for (int i = 0; i < NP; ++i)
          for (int j = 0; j < 4; ++j) y[q][i][j] = vfmaq_f32(y[q][i][j], vcvtq_f32_s32(t[i][j]), vmulq_f32(scale[j], sx[i]));
        if (!g.symmetric) {
          lanes(block + g.code_bytes + 16, offset);
          for (int i = 0; i < NP; ++i)
            for (int j = 0; j < 4; ++j) y[q][i][j] = vfmaq_f32(y[q][i][j], offset[j], sxsum[i]);
        }
      }
    }
    for (int64_t q = 0; q < np; ++q) {
      const int64_t n0 = (pg + q) * 8, rows = std::min<int64_t>(8, g.n - n0);
      for (int i = 0; i < R; ++i) {
        const float32x4_t* v = y[q][i / 2];  // row 2p: lanes 0 and 2 of each tile, row 2p + 1: 1 and 3
        float tmp[8];
        vst1q_f32(tmp, i % 2 ? vuzp2q_f32(v[0], v[1]) : vuzp1q_f32(v[0], v[1]));
        vst1q_f32(tmp + 4, i % 2 ? vuzp2q_f32(v[2], v[3]) : vuzp1q_f32(v[2], v[3]));
        float* out = a.y + (m + i) * a.ldy + n0;
        for (int64_t r = 0; r < rows; ++r) out[r] = a.bias ? tmp[r] + a.bias[n0 + r] : tmp[r];
      }
    }
  }
}

// int8: the blocks' codes are the operands (nr8_kr8_s8): the tile loop reads them as stored.
void mmla_gemm_int8(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  for_row_tiles<kTileRows>(m0, m1, [&](auto rows, int64_t m) {
    mmla_rows<8, 8, decltype(rows)::value, true>(a, m, p0, p1, nullptr);
  });
}

// int4 of kr KR: calls of few row tiles unpack the panels' operands in the loop; more tiles share
// staged panels.
template <int KR>
void mmla_gemm_int4(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  // Where staging pays (llvm-mca, V1 / N2, per 8 k of a panel): nr8_kr4: it costs 2.5 / 6.0
  // cycles once and saves 2 / 4 per 12 rows: from ~18 rows on; nr8_kr8: it costs 1.8 / 4.0 and
  // saves 1.0 / 2.0 per 12 rows: from 2 tiles on (break-even at 24 rows).
  constexpr int64_t kStageFrom = KR == 8 ? 2 * kTileRows + 1 : 3 * kTileRows / 2 + 1;
  if (m1 - m0 < kStageFrom) {
    for_row_tiles<kTileRows>(m0, m1, [&](auto rows, int64_t m) {
      mmla_rows<4, KR, decltype(rows)::value, false>(a, m, p0, p1, nullptr);
    });
    return;
  }
  const WeightGeometry& g = *a.w;
  thread_local std::vector<uint8_t> buf;  // kStagePanels x 8 x padded K bytes, kept between calls
  const size_t need = kStagePanels * 8 * g.padded_k() + 64;
  if (buf.size() < need) buf.resize(need);
  uint8_t* staged = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
  for (int64_t ps = p0; ps < p1; ps += kStagePanels) {
    const int64_t pe = std::min<int64_t>(p1, ps + kStagePanels);
    stage_panels<KR>(g, a.packed, ps, pe - ps, staged);
    for_row_tiles<kTileRows>(m0, m1, [&](auto rows, int64_t m) {
      mmla_rows<4, KR, decltype(rows)::value, true>(a, m, ps, pe, staged);
    });
  }
}

}  // namespace
}  // namespace qlinear
