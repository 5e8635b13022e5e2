// The dot-product levels' integer core (dotprod.cc, i8mm.cc): SDOT block dots for the row
// tiles and the SDOT GEMV. Compiled in each including level's namespace, as neon_common.h.
#pragma once

#include "qlinear/kernels/arm/neon_common.h"

namespace qlinear::arm {
inline namespace QLINEAR_ARM_LEVEL {

#if defined(__ARM_FEATURE_DOTPROD)
// SDOT by element: a 16-byte half chunk (4 rows x 4 k) against 4 activation bytes chosen by lane,
// 16 products per instruction into one s32 per row. int4 nibbles 0..15 and int8 codes as stored in
// nr8_kr4_s8 (code - 128) are both valid s8 operands. The integer sums are exact, so the order in which the
// kernels add them (several accumulators, summed at the end) does not change a bit of the result.
//
// GEMV (MR = 1): sdot_gemv below, 32 k per step (int4: 128 bytes, int8: 256 bytes of weights,
// loaded 64 at a time) into four accumulators (even / odd k-quad lane x half).
//
// GEMM (MR rows): 8 k per iteration; each weight operand (int4: 2 per 32-byte chunk half, 1 AND
// or USHR each; int8: loaded as it is) serves all MR rows, and each row's 8 activation bytes are
// one 64-bit load used by lane: int4 4 * MR SDOTs per 4 unpacking instructions, int8 SDOTs and
// loads only.
template <int BITS, int MR>
struct SdotBlockDot {
  static inline void run(const uint8_t* w, int64_t block, const int8_t* const* xq, int32x4_t (*acc)[2]) {
    if constexpr (MR == 1) {
      gemv(w, block, xq[0], acc[0]);
    } else {
      for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vdupq_n_s32(0);
      for (int64_t kk = 0; kk < block; kk += 8) {
        int8x16_t op[2][2];  // [k half (lane)][rows 0-3, 4-7]
        if constexpr (BITS == 4) {
          const uint8x16x2_t v = vld1q_u8_x2(w);
          w += 32;
          const uint8x16_t low4 = vdupq_n_u8(0x0F);
          for (int h = 0; h < 2; ++h) {
            op[0][h] = vreinterpretq_s8_u8(vandq_u8(v.val[h], low4));  // k 0-3
            op[1][h] = vreinterpretq_s8_u8(vshrq_n_u8(v.val[h], 4));   // k 4-7
          }
        } else {
          const int8x16x4_t v = vld1q_s8_x4(reinterpret_cast<const int8_t*>(w));  // k 0-3, k 4-7
          w += 64;
          for (int c = 0; c < 2; ++c)
            for (int h = 0; h < 2; ++h) op[c][h] = v.val[2 * c + h];
        }
        for (int i = 0; i < MR; ++i) {
          const int8x8_t x = vld1_s8(xq[i] + kk);
          for (int h = 0; h < 2; ++h) {
            acc[i][h] = vdotq_lane_s32(acc[i][h], op[0][h], x, 0);
            acc[i][h] = vdotq_lane_s32(acc[i][h], op[1][h], x, 1);
          }
        }
      }
    }
  }

  static inline void gemv(const uint8_t* w, int64_t block, const int8_t* x, int32x4_t* out) {
    int32x4_t s[2][2] = {{vdupq_n_s32(0), vdupq_n_s32(0)}, {vdupq_n_s32(0), vdupq_n_s32(0)}};
    for (int64_t kk = 0; kk < block; kk += 32) gemv_step32(w, x, s);
    for (int h = 0; h < 2; ++h) out[h] = vaddq_s32(s[0][h], s[1][h]);
  }

  // 32 k of one row: int4 128, int8 256 weight bytes from w and 32 activation bytes from x (both
  // advanced past them), into s[c][h] (c: even / odd k-quad lane, h: rows 0-3 / 4-7), 16 SDOTs
  // in four chains.
  static inline void gemv_step32(const uint8_t*& w, const int8_t*& x, int32x4_t (&s)[2][2]) {
    const int8x16x2_t xv = vld1q_s8_x2(x);
    x += 32;
    if constexpr (BITS == 4) {
      const uint8x16_t low4 = vdupq_n_u8(0x0F);
      for (int q = 0; q < 2; ++q, w += 64) {  // 16 k: two 32-byte chunks
        const uint8x16x4_t v = vld1q_u8_x4(w);
        for (int c = 0; c < 2; ++c)
          for (int h = 0; h < 2; ++h) {
            const uint8x16_t b = v.val[2 * c + h];
            s[0][h] = vdotq_laneq_s32(s[0][h], vreinterpretq_s8_u8(vandq_u8(b, low4)), xv.val[q], 2 * c);
            s[1][h] = vdotq_laneq_s32(s[1][h], vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), xv.val[q], 2 * c + 1);
          }
      }
    } else {
      for (int q = 0; q < 4; ++q, w += 64) {  // 8 k: two 32-byte chunks of 4 k
        const int8x16x4_t v = vld1q_s8_x4(reinterpret_cast<const int8_t*>(w));
        for (int c = 0; c < 2; ++c)
          for (int h = 0; h < 2; ++h) {
            const int lane = 2 * (q % 2) + c;
            s[c][h] = vdotq_laneq_s32(s[c][h], v.val[2 * c + h], xv.val[q / 2], lane);
          }
      }
    }
  }

  // 64 k of one int4 row (256 weight bytes, 64 activation bytes; both pointers advanced), the same
  // SDOTs into the same four chains as two gemv_step32, written out so that one pointer walks the
  // weights (post-indexed loads, no address arithmetic) and the activations are one load. TAIL 16 /
  // 32: the block ends here, and its scales (and offsets) that follow the codes are loaded into
  // tail[0] (and tail[1]) by the same pointer.
  template <int TAIL>
  static inline void gemv_step64_int4(const uint8_t*& w, const int8_t*& x, int32x4_t (&s)[2][2],
                                      uint16x8_t (&tail)[2]) {
    static_assert(BITS == 4 && (TAIL == 0 || TAIL == 16 || TAIL == 32));
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
#define QLINEAR_SDOT_Q(A, B, C, D, X)                                                           \
    "and  v28.16b, " A ".16b, %[m].16b\n\t"                                                      \
    "ushr v29.16b, " A ".16b, #4\n\t"                                                            \
    "and  v30.16b, " B ".16b, %[m].16b\n\t"                                                      \
    "ushr v31.16b, " B ".16b, #4\n\t"                                                            \
    "sdot %[s00].4s, v28.16b, " X ".4b[0]\n\t"                                                   \
    "sdot %[s10].4s, v29.16b, " X ".4b[1]\n\t"                                                   \
    "sdot %[s01].4s, v30.16b, " X ".4b[0]\n\t"                                                   \
    "sdot %[s11].4s, v31.16b, " X ".4b[1]\n\t"                                                   \
    "and  v28.16b, " C ".16b, %[m].16b\n\t"                                                      \
    "ushr v29.16b, " C ".16b, #4\n\t"                                                            \
    "and  v30.16b, " D ".16b, %[m].16b\n\t"                                                      \
    "ushr v31.16b, " D ".16b, #4\n\t"                                                            \
    "sdot %[s00].4s, v28.16b, " X ".4b[2]\n\t"                                                   \
    "sdot %[s10].4s, v29.16b, " X ".4b[3]\n\t"                                                   \
    "sdot %[s01].4s, v30.16b, " X ".4b[2]\n\t"                                                   \
    "sdot %[s11].4s, v31.16b, " X ".4b[3]\n\t"
    asm("ld1 {v16.16b-v19.16b}, [%[w]], #64\n\t"
        "ld1 {v24.16b-v27.16b}, [%[x]], #64\n\t"
        "ld1 {v20.16b-v23.16b}, [%[w]], #64\n\t"
        QLINEAR_SDOT_Q("v16", "v17", "v18", "v19", "v24")
        "ld1 {v16.16b-v19.16b}, [%[w]], #64\n\t"
        QLINEAR_SDOT_Q("v20", "v21", "v22", "v23", "v25")
        "ld1 {v20.16b-v23.16b}, [%[w]], #64\n\t"
        QLINEAR_SDOT_Q("v16", "v17", "v18", "v19", "v26")
        QLINEAR_SDOT_Q("v20", "v21", "v22", "v23", "v27")
        : [w] "+r"(w), [x] "+r"(x), [s00] "+w"(s[0][0]), [s01] "+w"(s[0][1]), [s10] "+w"(s[1][0]),
          [s11] "+w"(s[1][1])
        : [m] "w"(low4), "m"(*reinterpret_cast<const uint8_t(*)[256]>(w)),
          "m"(*reinterpret_cast<const int8_t(*)[64]>(x))
        : "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27",
          "v28", "v29", "v30", "v31");
#undef QLINEAR_SDOT_Q
    load_tail<TAIL>(w, tail);
  }

  // 64 k of one int8 row (512 weight bytes, 64 activation bytes), as gemv_step64_int4: the SDOTs of
  // two gemv_step32 (int8) with one pointer and post-indexed loads: 41 instructions (the codes
  // stored flipped, nr8_kr4_s8; with an EOR per 16 bytes it was 73).
  template <int TAIL>
  static inline void gemv_step64_int8(const uint8_t*& w, const int8_t*& x, int32x4_t (&s)[2][2],
                                      uint16x8_t (&tail)[2]) {
    static_assert(BITS == 8 && (TAIL == 0 || TAIL == 16 || TAIL == 32));
    // 8 k (chunks of k 0-3 and k 4-7, rows 0-3 / 4-7 each) in A..D, x lanes L, L + 1 of X.
#define QLINEAR_DOT_8K(A, B, C, D, X, L0, L1)                                                   \
    "sdot %[s00].4s, " A ".16b, " X ".4b[" L0 "]\n\t"                                           \
    "sdot %[s01].4s, " B ".16b, " X ".4b[" L0 "]\n\t"                                           \
    "sdot %[s10].4s, " C ".16b, " X ".4b[" L1 "]\n\t"                                           \
    "sdot %[s11].4s, " D ".16b, " X ".4b[" L1 "]\n\t"
#define QLINEAR_LD_A "ld1 {v16.16b-v19.16b}, [%[w]], #64\n\t"
#define QLINEAR_LD_B "ld1 {v20.16b-v23.16b}, [%[w]], #64\n\t"
#define QLINEAR_BODY                                                                            \
    QLINEAR_LD_A                                                                                 \
    "ld1 {v24.16b-v27.16b}, [%[x]], #64\n\t"                                                     \
    QLINEAR_LD_B                                                                                 \
    QLINEAR_DOT_8K("v16", "v17", "v18", "v19", "v24", "0", "1") QLINEAR_LD_A                     \
    QLINEAR_DOT_8K("v20", "v21", "v22", "v23", "v24", "2", "3") QLINEAR_LD_B                     \
    QLINEAR_DOT_8K("v16", "v17", "v18", "v19", "v25", "0", "1") QLINEAR_LD_A                     \
    QLINEAR_DOT_8K("v20", "v21", "v22", "v23", "v25", "2", "3") QLINEAR_LD_B                     \
    QLINEAR_DOT_8K("v16", "v17", "v18", "v19", "v26", "0", "1") QLINEAR_LD_A                     \
    QLINEAR_DOT_8K("v20", "v21", "v22", "v23", "v26", "2", "3") QLINEAR_LD_B                     \
    QLINEAR_DOT_8K("v16", "v17", "v18", "v19", "v27", "0", "1")                                  \
    QLINEAR_DOT_8K("v20", "v21", "v22", "v23", "v27", "2", "3")
#define QLINEAR_OUT                                                                             \
    : [w] "+r"(w), [x] "+r"(x), [s00] "+w"(s[0][0]), [s01] "+w"(s[0][1]), [s10] "+w"(s[1][0]),   \
      [s11] "+w"(s[1][1])
#define QLINEAR_IN "m"(*reinterpret_cast<const uint8_t(*)[512]>(w)), "m"(*reinterpret_cast<const int8_t(*)[64]>(x))
#define QLINEAR_CLOBBER : "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27"
    asm(QLINEAR_BODY QLINEAR_OUT : QLINEAR_IN QLINEAR_CLOBBER);
#undef QLINEAR_OUT
#undef QLINEAR_IN
#undef QLINEAR_CLOBBER
#undef QLINEAR_BODY
#undef QLINEAR_DOT_8K
#undef QLINEAR_LD_A
#undef QLINEAR_LD_B
    load_tail<TAIL>(w, tail);
  }

  template <int TAIL>
  static inline void load_tail(const uint8_t*& w, uint16x8_t (&tail)[2]) {
    if constexpr (TAIL == 16)
      asm("ldr %q[a], [%[w]], #16" : [w] "+r"(w), [a] "=w"(tail[0]) : "m"(*reinterpret_cast<const uint8_t(*)[16]>(w)));
    else if constexpr (TAIL == 32)
      asm("ldp %q[a], %q[b], [%[w]], #32"
          : [w] "+r"(w), [a] "=w"(tail[0]), [b] "=w"(tail[1])
          : "m"(*reinterpret_cast<const uint8_t(*)[32]>(w)));
  }
};

// *p++, with POST as one post-indexed load: GCC 12 indexes the per-block streams (scales, sums)
// from a counter instead, one more instruction per block. Taken by the int8 GEMV; for int4, on
// the in-order Cortex-A55, the compiler's placement of its own loads was 1% faster in llvm-mca's
// model than the asm's, for that instruction more.
template <bool POST>
inline float load_next(const float*& p) {
  if constexpr (!POST) return *p++;
  float v;
  asm("ldr %s[v], [%[p]], #4" : [v] "=w"(v), [p] "+r"(p) : "m"(*p));
  return v;
}
template <bool POST>
inline int32x4_t load_next_dup(const int32_t*& p) {
  if constexpr (!POST) return vld1q_dup_s32(p++);
  int32x4_t v;
  asm("ld1r {%[v].4s}, [%[p]], #4" : [v] "=w"(v), [p] "+r"(p) : "m"(*p));
  return v;
}

// The dot-product levels' GEMV: every panel of [p0, p1) against each row of [m0, m1), one block
// after another. Per block: four SDOT chains (at block 64 eight deep: the next block's chains are
// independent of this one's epilogue, so an out-of-order core overlaps them), the activation row's
// shifted sum (when its factor code_shift - zero_point is not 0) as the accumulators' initial value,
// and one pointer walking the panel's codes, scales and offsets in storage order. KB: the block
// length when fixed at compile time (the inner steps unrolled), 0 = g.block. SHIFTED / ASYM follow
// from the weights: sum_shift = code_shift - zero_point is 0 for asymmetric int4 (0 - 0) and
// symmetric int8 (128 - 128), so only symmetric int4 and asymmetric int8 read shifted_sum. The
// float operations are those of panel_tile, in its order, so
// the result is the same to the bit.
template <int BITS, int KB, bool ASYM>
void sdot_gemv_impl(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  using Dot = SdotBlockDot<BITS, 1>;
  constexpr int kCodeShift = BITS == 8 ? 128 : 0, kZeroPoint = ASYM ? 0 : (BITS == 4 ? 8 : 128);
  constexpr bool kShifted = kCodeShift != kZeroPoint;
  // int8 on SDOT: post-indexed per-block streams (the symmetric loop: one ADD less per block); the
  // asymmetric one reads all three through the shifted sums' pointer.
  constexpr bool kPost = BITS == 8, kOnePtr = BITS == 8 && ASYM && KB != 0 && KB % 64 == 0;
  static_assert(!kOnePtr || kShifted);
  const WeightGeometry& g = *a.w;
  const int64_t block = KB ? KB : g.block, nb = g.nblocks;
  for (int64_t m = m0; m < m1; ++m) {
    const float* sx0 = a.act.scale + m * nb;
    const float* sxsum0 = a.act.scaled_sum + m * nb;
    const int32_t* zsum0 = a.act.shifted_sum + m * nb;
    float* out = a.y + m * a.ldy;
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* w = a.packed + p * g.panel_bytes;
      const int8_t* x = a.act.q + m * a.act.ldq;
      const float* sx = sx0;
      const float* sxsum = sxsum0;
      const int32_t* zsum = zsum0;
      // byte distances from the shifted sum after the post-increment to the block's scale / scaled sum
      const intptr_t dsx = reinterpret_cast<intptr_t>(sx0) - reinterpret_cast<intptr_t>(zsum0) - 4;
      const intptr_t dxs = reinterpret_cast<intptr_t>(sxsum0) - reinterpret_cast<intptr_t>(zsum0) - 4;
      float32x4_t y0 = vdupq_n_f32(0.f), y1 = vdupq_n_f32(0.f);
      for (const float* const sx_end = sx + nb; kOnePtr ? zsum != zsum0 + nb : sx != sx_end;) {
        float s_x, xs = 0.f;
        int32x4_t s[2][2];
        if constexpr (kOnePtr) {
          // One pointer reads the three per-block streams: the shifted sum by a post-indexed LD1R,
          // the scale and scaled sum at fixed distances from it (no counter, no DUP: 96
          // instructions per 64-k block instead of 98; in the A55 / A57 models 1 cycle faster).
          asm("ld1r {%[z0].4s}, [%[p]], #4\n\t"
              "ldr %s[sx], [%[p], %[dsx]]\n\t"
              "ldr %s[xs], [%[p], %[dxs]]\n\t"
              "mov %[z1].16b, %[z0].16b\n\t"
              : [z0] "=&w"(s[0][0]), [z1] "=w"(s[0][1]), [sx] "=&w"(s_x), [xs] "=&w"(xs), [p] "+r"(zsum)
              : [dsx] "r"(dsx), [dxs] "r"(dxs)
              : "memory");
        } else {
          // the block's activation scale (and scaled sum) first: asm loads stay where they are written
          s_x = load_next<kPost>(sx);
          if constexpr (ASYM) xs = load_next<kPost>(sxsum);
          s[0][0] = kShifted ? load_next_dup<kPost>(zsum) : vdupq_n_s32(0);
          s[0][1] = s[0][0];
        }
        s[1][0] = s[1][1] = vdupq_n_s32(0);
        uint16x8_t tail[2];  // the block's scales (and offsets), fp16, after its codes
        if constexpr (BITS == 4 && KB != 0 && KB % 64 == 0) {
          for (int kk = 0; kk + 64 < KB; kk += 64) Dot::template gemv_step64_int4<0>(w, x, s, tail);
          Dot::template gemv_step64_int4<ASYM ? 32 : 16>(w, x, s, tail);
        } else if constexpr (BITS == 8 && KB != 0 && KB % 64 == 0) {
          for (int kk = 0; kk + 64 < KB; kk += 64) Dot::template gemv_step64_int8<0>(w, x, s, tail);
          Dot::template gemv_step64_int8<ASYM ? 32 : 16>(w, x, s, tail);
        } else {
          if constexpr (KB != 0) {
#pragma GCC unroll 8
            for (int kk = 0; kk < KB; kk += 32) Dot::gemv_step32(w, x, s);
          } else {
            for (int64_t kk = 0; kk < block; kk += 32) Dot::gemv_step32(w, x, s);
          }
          tail[0] = vld1q_u16(reinterpret_cast<const uint16_t*>(w));
          if constexpr (ASYM) tail[1] = vld1q_u16(reinterpret_cast<const uint16_t*>(w + 16));
          w += ASYM ? 32 : 16;
        }
        const float16x8_t sc = vreinterpretq_f16_u16(tail[0]);
        y0 = vfmaq_f32(y0, vcvtq_f32_s32(vaddq_s32(s[0][0], s[1][0])), vmulq_n_f32(vcvt_f32_f16(vget_low_f16(sc)), s_x));
        y1 = vfmaq_f32(y1, vcvtq_f32_s32(vaddq_s32(s[0][1], s[1][1])), vmulq_n_f32(vcvt_high_f32_f16(sc), s_x));
        if constexpr (ASYM) {
          const float16x8_t off = vreinterpretq_f16_u16(tail[1]);
          y0 = vfmaq_n_f32(y0, vcvt_f32_f16(vget_low_f16(off)), xs);
          y1 = vfmaq_n_f32(y1, vcvt_high_f32_f16(off), xs);
        }
      }
      const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
      if (rows == 8) {
        if (a.bias) {
          y0 = vaddq_f32(y0, vld1q_f32(a.bias + n0));
          y1 = vaddq_f32(y1, vld1q_f32(a.bias + n0 + 4));
        }
        vst1q_f32(out + n0, y0);
        vst1q_f32(out + n0 + 4, y1);
      } else {
        float tmp[8];
        vst1q_f32(tmp, y0);
        vst1q_f32(tmp + 4, y1);
        for (int64_t r = 0; r < rows; ++r) out[n0 + r] = a.bias ? tmp[r] + a.bias[n0 + r] : tmp[r];
      }
    }
  }
}

template <int BITS>
void sdot_gemv(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  with_block_and_symmetry(*a.w, [&](auto kb, auto asym) {
    sdot_gemv_impl<BITS, decltype(kb)::value, decltype(asym)::value>(a, m0, m1, p0, p1);
  });
}

#endif  // __ARM_FEATURE_DOTPROD

}  // namespace QLINEAR_ARM_LEVEL
}  // namespace qlinear::arm
