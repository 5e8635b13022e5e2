// The block formats' int8-activation kernels on aarch64 (block_format.h), the counterpart of
// x86/x86_blocks.h: a level's file names its level (QLINEAR_ARM_LEVEL), includes this header under
// its own flags and supplies the dot product of a 16-byte half chunk (4 rows x 4 k) with 4
// activation bytes (SdotDot: SDOT by element; SmullDot: SMULL + pairwise adds, plain NEON). A row
// vector of a panel's 8 rows is two registers (rows 0-3, 4-7).
//
// Per super-block of a panel the 8 rows' constants are unpacked into vectors (six-bit sub-scales
// with a few byte operations), per sub-block the codes are unpacked chunk by chunk in registers
// (nibbles or two-bit codes AND / shift, the high plane's bits shifted above them, IQ4 / MXFP4
// through a TBL of the signed values) and dotted with the activations; the sub-block's int32 sums
// are scaled by its sub-scale into the super-block's sum, the minimums' term from the
// activations' sums of 16. The float epilogue is the scalar kernel's, operation for operation (two
// FMAs per super-block), so every level gives the scalar level's bits.
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cstring>

#include "qlinear/core/block_format.h"
#include "qlinear/core/kernels.h"
#include "qlinear/kernels/block_driver.h"

namespace qlinear::arm {
inline namespace QLINEAR_ARM_LEVEL {
namespace blocks {

// A row vector of the panel's 8 rows.
struct I8 { int32x4_t h[2]; };
struct F8 { float32x4_t h[2]; };
struct C8 { uint8x16_t h[2]; };  // one 32-byte chunk: rows 0-3 x 4 k, rows 4-7 x 4 k

inline I8 widen_u8(const uint8_t* p) {
  const uint16x8_t w = vmovl_u8(vld1_u8(p));
  return {{vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(w))), vreinterpretq_s32_u32(vmovl_high_u16(w))}};
}
inline I8 widen_s8(const uint8_t* p) {
  const int16x8_t w = vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(p)));
  return {{vmovl_s16(vget_low_s16(w)), vmovl_high_s16(w)}};
}
inline float32x4_t half4(const uint8_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}

// The 8 rows' constants of one super-block.
template <Format F>
struct PanelMeta {
  F8 d, m;                              // m: the minimums' float factor (formats with minimums)
  alignas(16) uint8_t sc6[128], mn6[128];  // the sub-scales / minimums as bytes, [sub-block][row]

  // 64 six-bit entries (block_format.cc get6: 32 bytes of nibbles, 16 of two-bit pairs) as bytes.
  static void unpack6(const uint8_t* p, uint8_t* out) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F), two = vdupq_n_u8(0x03);
    const uint8x16_t lo0 = vld1q_u8(p), lo1 = vld1q_u8(p + 16), h = vld1q_u8(p + 32);
    vst1q_u8(out, vorrq_u8(vandq_u8(lo0, low4), vshlq_n_u8(vandq_u8(h, two), 4)));
    vst1q_u8(out + 16, vorrq_u8(vandq_u8(lo1, low4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h, 2), two), 4)));
    vst1q_u8(out + 32, vorrq_u8(vshrq_n_u8(lo0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h, 4), two), 4)));
    vst1q_u8(out + 48, vorrq_u8(vshrq_n_u8(lo1, 4), vshlq_n_u8(vshrq_n_u8(h, 6), 4)));
  }

  explicit PanelMeta(const uint8_t* meta) {
    using T = BlockTraits<F>;
    if constexpr (F == Format::mxfp4) {
      // 2^(e - 128): (e - 1) << 23 for e >= 2, the subnormals 2^-127 / 2^-128 below
      const I8 e = widen_u8(meta);
      for (int h = 0; h < 2; ++h) {
        const int32x4_t normal = vshlq_n_s32(vsubq_s32(e.h[h], vdupq_n_s32(1)), 23);
        const int32x4_t sub = vshlq_s32(vdupq_n_s32(0x00200000), e.h[h]);
        d.h[h] = vreinterpretq_f32_s32(vbslq_s32(vcgtq_s32(e.h[h], vdupq_n_s32(1)), normal, sub));
      }
    } else {
      d = {{half4(meta), half4(meta + 8)}};
    }
    if constexpr (T::kHasMin) {
      m = {{half4(meta + 16), half4(meta + 24)}};
      if constexpr (T::k_quant) m = {{vnegq_f32(m.h[0]), vnegq_f32(m.h[1])}};  // m = -dmin
    }
    if constexpr (F == Format::q4_k || F == Format::q5_k) {
      unpack6(meta + 32, sc6);
      unpack6(meta + 80, mn6);
    } else if constexpr (F == Format::iq4_xs) {
      unpack6(meta + 16, sc6);
    } else if constexpr (F == Format::q3_k) {
      unpack6(meta + 16, sc6);
      unpack6(meta + 64, sc6 + 64);
    } else if constexpr (F == Format::q2_k) {  // the file's bytes: sub-scale | minimum << 4
      for (int i = 0; i < 8; ++i) {
        const uint8x16_t v = vld1q_u8(meta + 32 + 16 * i);
        vst1q_u8(sc6 + 16 * i, vandq_u8(v, vdupq_n_u8(0x0F)));
        vst1q_u8(mn6 + 16 * i, vshrq_n_u8(v, 4));
      }
    }
  }

  // Sub-block j's sub-scales and minimums of the 8 rows (int32).
  I8 sc(const uint8_t* meta, int j) const {
    if constexpr (F == Format::q6_k) {
      return widen_s8(meta + 16 + 8 * j);
    } else if constexpr (F == Format::iq4_xs || F == Format::q3_k) {
      I8 s = widen_u8(sc6 + 8 * j);
      return {{vsubq_s32(s.h[0], vdupq_n_s32(32)), vsubq_s32(s.h[1], vdupq_n_s32(32))}};
    } else {
      return widen_u8(sc6 + 8 * j);
    }
  }
  I8 mn(int j) const { return widen_u8(mn6 + 8 * j); }
};

// Bit S of each byte moved to bit D (immediate shifts: NEON's are per byte, nothing crosses).
template <int S, int D>
inline uint8x16_t move_bit(uint8x16_t h) {
  if constexpr (S < D) return vshlq_n_u8(h, D - S);
  else if constexpr (S == D) return h;
  else return vshrq_n_u8(h, S - D);
}

// The int8 chunk pair 2Q, 2Q + 1 of a super-block (8 rows x k 8Q .. 8Q + 3 and 8Q + 4 .. 8Q + 7)
// as codes 0..63 (lookup formats: the table's indices).
template <Format F, int Q>
inline void chunk_pair(const uint8_t* block, C8* c0, C8* c1) {
  using T = BlockTraits<F>;
  constexpr int kL = T::kLowBits;
  const uint8_t* high = block + T::kLowBytes;
  for (int h = 0; h < 2; ++h) {
    if constexpr (kL == 4) {  // nibbles: int4 chunk Q
      const uint8x16_t raw = vld1q_u8(block + 32 * Q + 16 * h);
      c0->h[h] = vandq_u8(raw, vdupq_n_u8(0x0F));
      c1->h[h] = vshrq_n_u8(raw, 4);
    } else {  // two-bit codes: chunk 4 (Q / 2) + t at bits 2t of group Q / 2
      const uint8x16_t raw = vld1q_u8(block + 32 * (Q / 2) + 16 * h);
      c0->h[h] = vandq_u8(move_bit<4 * (Q % 2), 0>(raw), vdupq_n_u8(0x03));
      c1->h[h] = vandq_u8(move_bit<4 * (Q % 2) + 2, 0>(raw), vdupq_n_u8(0x03));
    }
    if constexpr (T::kHighBits == 1) {  // bit t of byte i of group Q / 4: chunk 8 (Q / 4) + t, to bit kL
      const uint8x16_t hi = vld1q_u8(high + 32 * (Q / 4) + 16 * h);
      const uint8x16_t bit = vdupq_n_u8(1 << kL);
      c0->h[h] = vorrq_u8(c0->h[h], vandq_u8(move_bit<2 * (Q % 4), kL>(hi), bit));
      c1->h[h] = vorrq_u8(c1->h[h], vandq_u8(move_bit<2 * (Q % 4) + 1, kL>(hi), bit));
    } else if constexpr (T::kHighBits == 2) {  // bits 2t, 2t + 1 of byte i of group Q / 2: chunk 4 (Q / 2) + t, to bits 4..5
      const uint8x16_t hi = vld1q_u8(high + 32 * (Q / 2) + 16 * h);
      const uint8x16_t two = vdupq_n_u8(0x30);
      c0->h[h] = vorrq_u8(c0->h[h], vandq_u8(move_bit<4 * (Q % 2), 4>(hi), two));
      c1->h[h] = vorrq_u8(c1->h[h], vandq_u8(move_bit<4 * (Q % 2) + 2, 4>(hi), two));
    }
  }
}

#if defined(__ARM_FEATURE_DOTPROD)
// SDOT by element: lane L of the 8 activation bytes x (k 4L .. 4L + 3) against 4 rows x 4 k.
struct SdotDot {
  static constexpr int kRows = 3;  // GEMM tile rows: 6 accumulators, 6 (+6) sums, codes and constants in 32 registers
  template <int L>
  static int32x4_t dot(int32x4_t acc, int8x16_t w, int8x8_t x) { return vdotq_lane_s32(acc, w, x, L); }
};
#endif

// SMULL by halves, then two pairwise adds: 16 products into 4 row sums (each pair of products
// fits int16: |code| <= 127, |x| <= 127).
struct SmullDot {
  static constexpr int kRows = 2;
  template <int L>
  static int32x4_t dot(int32x4_t acc, int8x16_t w, int8x8_t x) {
    const int8x16_t xb = vreinterpretq_s8_s32(vdupq_lane_s32(vreinterpret_s32_s8(x), L));
    const int16x8_t p = vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(xb)), vmull_high_s8(w, xb));
    return vpadalq_s16(acc, p);
  }
};

// MR activation rows [m, m + MR) x panel p, all super-blocks.
template <class D, Format F, int MR>
void block_tile(const Int8MatmulArgs& a, int64_t m, int64_t p) {
  using T = BlockTraits<F>;
  constexpr int kZero = T::kLookup ? 0 : T::kZero;  // lookup formats: signed values from the TBL
  constexpr int kChains = MR == 1 ? 2 : 1;          // the GEMV's latency: a second chain per half
  const WeightGeometry& g = *a.w;
  int8x16_t tbl = vdupq_n_s8(0);
  if constexpr (T::kLookup) tbl = vld1q_s8(format_table(F));
  const uint8_t* panel = a.packed + p * g.panel_bytes;
  F8 y[MR];
  for (int i = 0; i < MR; ++i) y[i].h[0] = y[i].h[1] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < g.nblocks; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    const uint8_t* meta = block + g.code_bytes;
    const PanelMeta<F> pm(meta);
    I8 A[MR], B[MR];
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h) A[i].h[h] = B[i].h[h] = vdupq_n_s32(0);
    static_for<0, T::kNsub>([&](auto jc) {
      constexpr int j = decltype(jc)::value;
      I8 acc[MR][kChains];
      int32_t xs[MR];
      for (int i = 0; i < MR; ++i) {
        const int32_t* s16 = a.act.sum16 + (m + i) * a.act.ld16 + (b * T::kSuper + j * T::kSub) / 16;
        xs[i] = T::kSub == 32 ? s16[0] + s16[1] : s16[0];
        for (int h = 0; h < 2; ++h) {
          acc[i][0].h[h] = vdupq_n_s32(-kZero * xs[i]);
          if constexpr (kChains == 2) acc[i][1].h[h] = vdupq_n_s32(0);
        }
      }
      static_for<0, T::kSub / 8>([&](auto tc) {
        constexpr int q = j * (T::kSub / 8) + decltype(tc)::value;
        C8 c0, c1;
        chunk_pair<F, q>(block, &c0, &c1);
        int8x16_t w0[2], w1[2];
        for (int h = 0; h < 2; ++h) {
          if constexpr (T::kLookup) {
            w0[h] = vqtbl1q_s8(tbl, c0.h[h]);
            w1[h] = vqtbl1q_s8(tbl, c1.h[h]);
          } else {
            w0[h] = vreinterpretq_s8_u8(c0.h[h]);
            w1[h] = vreinterpretq_s8_u8(c1.h[h]);
          }
        }
        for (int i = 0; i < MR; ++i) {
          const int8x8_t x = vld1_s8(a.act.q + (m + i) * a.act.ldq + b * T::kSuper + 8 * q);
          for (int h = 0; h < 2; ++h) {
            acc[i][0].h[h] = D::template dot<0>(acc[i][0].h[h], w0[h], x);
            acc[i][kChains - 1].h[h] = D::template dot<1>(acc[i][kChains - 1].h[h], w1[h], x);
          }
        }
      });
      I8 sum[MR];
      for (int i = 0; i < MR; ++i)
        for (int h = 0; h < 2; ++h)
          sum[i].h[h] = kChains == 2 ? vaddq_s32(acc[i][0].h[h], acc[i][kChains - 1].h[h]) : acc[i][0].h[h];
      if constexpr (T::kNsub > 1) {
        const I8 sc = pm.sc(meta, j);
        for (int i = 0; i < MR; ++i)
          for (int h = 0; h < 2; ++h) A[i].h[h] = vmlaq_s32(A[i].h[h], sum[i].h[h], sc.h[h]);
      } else {
        for (int i = 0; i < MR; ++i) A[i] = sum[i];
      }
      if constexpr (T::kHasMin) {
        if constexpr (T::kNsub > 1) {
          const I8 mn = pm.mn(j);
          for (int i = 0; i < MR; ++i)
            for (int h = 0; h < 2; ++h) B[i].h[h] = vmlaq_n_s32(B[i].h[h], mn.h[h], xs[i]);
        } else {
          for (int i = 0; i < MR; ++i) B[i].h[0] = B[i].h[1] = vdupq_n_s32(xs[i]);
        }
      }
    });
    for (int i = 0; i < MR; ++i) {
      const float sx = a.act.scale[(m + i) * g.nblocks + b];
      for (int h = 0; h < 2; ++h) {
        y[i].h[h] = vfmaq_f32(y[i].h[h], vcvtq_f32_s32(A[i].h[h]), vmulq_n_f32(pm.d.h[h], sx));
        if constexpr (T::kHasMin) y[i].h[h] = vfmaq_f32(y[i].h[h], vcvtq_f32_s32(B[i].h[h]), vmulq_n_f32(pm.m.h[h], sx));
      }
    }
  }
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
  for (int i = 0; i < MR; ++i) {
    float tmp[8];
    vst1q_f32(tmp, y[i].h[0]);
    vst1q_f32(tmp + 4, y[i].h[1]);
    float* out = a.y + (m + i) * a.ldy + n0;
    for (int64_t r = 0; r < rows; ++r) out[r] = a.bias ? tmp[r] + a.bias[n0 + r] : tmp[r];
  }
}

template <class D, Format F, int MR>
[[gnu::noinline]] void block_row_tile(const Int8MatmulArgs& a, int64_t m, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) block_tile<D, F, MR>(a, m, p);
}

template <class D, Format F>
void block_gemm(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  drive_block_gemm<D::kRows>(m0, m1, p0, p1, [&](auto rows, int64_t m, int64_t q0, int64_t q1) {
    block_row_tile<D, F, decltype(rows)::value>(a, m, q0, q1);
  });
}

}  // namespace blocks

// Every format's kernels of a level: a GEMV (M = 1) and a GEMM of D::kRows-row tiles.
template <class D>
void add_block_kernels(KernelTable& t, const char* level) {
  add_level_block_kernels<D::kRows>(t, level, [](auto fc) { return &blocks::block_gemm<D, decltype(fc)::value>; });
}

}  // namespace QLINEAR_ARM_LEVEL
}  // namespace qlinear::arm
