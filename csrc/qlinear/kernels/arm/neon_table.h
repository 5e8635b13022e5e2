// A level's kernel table (make_table) and the float path shared by the aarch64 levels, over
// neon_common.h's integer cores (and neon_sdot.h's on the dot-product levels).
#pragma once

#include "qlinear/kernels/arm/neon_common.h"
#include "qlinear/kernels/arm/neon_sdot.h"

namespace qlinear::arm {
inline namespace QLINEAR_ARM_LEVEL {

// The GEMV function of a level's integer core: panel_tile's, or the dot-product levels' own.
template <template <int, int> class Dot, int BITS>
struct GemvFor {
  static constexpr Int8MatmulFn fn = gemv<Dot, BITS>;
};
#if defined(__ARM_FEATURE_DOTPROD)
template <int BITS>
struct GemvFor<SdotBlockDot, BITS> {
  static constexpr Int8MatmulFn fn = sdot_gemv<BITS>;
};
#endif  // __ARM_FEATURE_DOTPROD

// ---------------------------------------------------------------------------------------------
// Float path: each block of a panel is dequantized to w'[k][8 rows] in a stack buffer, then every
// row of x runs 8-wide FMAs over it (block sums, then across blocks, as on x86).

inline float prepare_float_acts(const FloatActArgs& a, int64_t m0, int64_t m1) {
  float absmax = 0.f;
  bool nan = false;
  for (int64_t m = m0; m < m1; ++m) {
    float* out = a.out + m * a.ldo;
    int64_t i = 0;
    if (a.dtype == DType::f32) {
      const float* x = static_cast<const float*>(a.x) + m * a.ldx;
      std::memcpy(out, x, static_cast<size_t>(a.k) * 4);
      i = a.k;
    } else {
      const void* x = static_cast<const uint16_t*>(a.x) + m * a.ldx;
      for (; i + 4 <= a.k; i += 4) vst1q_f32(out + i, load4<DType::f16>(x, i));
      for (; i < a.k; ++i) out[i] = load1<DType::f16>(x, i);
    }
    for (; i < a.nblocks * a.block; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < a.nblocks; ++b) {
      float32x4_t s = vdupq_n_f32(0.f), mx = vdupq_n_f32(0.f);
      uint32x4_t vn = vdupq_n_u32(0);
      for (int64_t j = b * a.block; j < (b + 1) * a.block; j += 4) {
        const float32x4_t v = vld1q_f32(out + j);
        s = vaddq_f32(s, v);
        mx = vmaxnmq_f32(mx, vabsq_f32(v));
        vn = vorrq_u32(vn, vmvnq_u32(vceqq_f32(v, v)));
      }
      a.sum[m * a.nblocks + b] = vaddvq_f32(s);
      absmax = std::max(absmax, vmaxvq_f32(mx));
      nan |= vmaxvq_u32(vn) != 0;
    }
  }
  return nan ? NAN : absmax;
}

// w'[k][r] of one block (8 rows), k-major.
template <int BITS>
inline void dequantize_block(const WeightGeometry& g, const uint8_t* block, float* out) {
  const float zp = static_cast<float>(g.zero_point());
  float32x4_t scale[2] = {load_half4(block + g.code_bytes), load_half4(block + g.code_bytes + 8)};
  float32x4_t offset[2];
  for (int h = 0; h < 2; ++h)
    offset[h] = g.symmetric ? vmulq_n_f32(scale[h], -zp) : load_half4(block + g.code_bytes + 16 + 8 * h);
#if defined(__ARM_FEATURE_MATMUL_INT8)
  // nr8_kr8_s8 / nr8_kr8: only the i8mm level reads them (table_reads), so only its copy has this
  if (g.kr == 8) {  // gathered by table lookups
    const uint8x16_t flip = vdupq_n_u8(g.code_xor);
    const auto step8 = [&](const uint8x16x4_t& v, int64_t k0) {  // 8 k of 8 rows, as nr8_kr8_s8
      for (int t = 0; t < 4; ++t) {
        const uint8x16_t two = veorq_u8(vqtbl4q_u8(v, vld1q_u8(kKr8Gather[t])), flip);  // k, k + 1
        const uint16x8_t q[2] = {vmovl_u8(vget_low_u8(two)), vmovl_high_u8(two)};
        for (int i = 0; i < 2; ++i) {
          float* o = out + (k0 + 2 * t + i) * 8;
          vst1q_f32(o, vfmaq_f32(offset[0], vcvtq_f32_u32(vmovl_u16(vget_low_u16(q[i]))), scale[0]));
          vst1q_f32(o + 4, vfmaq_f32(offset[1], vcvtq_f32_u32(vmovl_high_u16(q[i])), scale[1]));
        }
      }
    };
    if constexpr (BITS == 8) {
      for (int64_t kk = 0; kk < g.block; kk += 8) step8(vld1q_u8_x4(block + kk * 8), kk);
    } else {  // a 64-byte chunk (16 k): its low nibbles are k 0-7, its high nibbles k 8-15
      for (int64_t kk = 0; kk < g.block; kk += 16) {
        uint8x16x4_t lo = vld1q_u8_x4(block + kk * 4), hi;
        for (int j = 0; j < 4; ++j) hi.val[j] = vshrq_n_u8(lo.val[j], 4), lo.val[j] = vandq_u8(lo.val[j], vdupq_n_u8(0x0F));
        step8(lo, kk);
        step8(hi, kk + 8);
      }
    }
    return;
  }
#endif
  constexpr int kChunkK = BITS == 4 ? 8 : 4;
  const uint32x4_t flip = vdupq_n_u32(0x01010101u * g.code_xor);  // the stored int8 bytes back to codes
  for (int64_t kk = 0; kk < g.block; kk += kChunkK) {
    const uint8_t* w = block + kk * (32 / kChunkK);
    for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h+3: one 32-bit lane each
      uint32x4_t v = vld1q_u32(reinterpret_cast<const uint32_t*>(w + 16 * h));
      if constexpr (BITS == 8) v = veorq_u32(v, flip);
      for (int i = 0; i < kChunkK; ++i) {
        // int4: k i < 4 at bits 8i (low nibble), k 4 + i at bits 8i + 4; int8: k i at bits 8i.
        const int shift = BITS == 4 ? (i < 4 ? 8 * i : 8 * (i - 4) + 4) : 8 * i;
        const uint32x4_t q = vandq_u32(vshlq_u32(v, vdupq_n_s32(-shift)), vdupq_n_u32(BITS == 4 ? 0xF : 0xFF));
        vst1q_f32(out + (kk + i) * 8 + 4 * h, vfmaq_f32(offset[h], vcvtq_f32_u32(q), scale[h]));
      }
    }
  }
}

// R rows of x against one dequantized block, 8 outputs each: part[i] = sum_k w'[k] * x[i][k], in
// k order (the same FMAs as one row at a time; R rows give 2R independent chains, so the FMLAs do
// not wait on each other's latency).
template <int R>
inline void float_rows(const float* wbuf, const float* const* x, int64_t block, float32x4_t (*part)[2]) {
  for (int i = 0; i < R; ++i) part[i][0] = part[i][1] = vdupq_n_f32(0.f);
  for (int64_t kk = 0; kk < block; kk += 4) {
    float32x4_t xv[R];
    for (int i = 0; i < R; ++i) xv[i] = vld1q_f32(x[i] + kk);
    const auto step = [&](auto lane) {  // k = kk + lane
      constexpr int j = decltype(lane)::value;
      const float32x4_t w0 = vld1q_f32(wbuf + 8 * (kk + j)), w1 = vld1q_f32(wbuf + 8 * (kk + j) + 4);
      for (int i = 0; i < R; ++i) {
        part[i][0] = vfmaq_laneq_f32(part[i][0], w0, xv[i], j);
        part[i][1] = vfmaq_laneq_f32(part[i][1], w1, xv[i], j);
      }
    };
    step(Rows<0>{}), step(Rows<1>{}), step(Rows<2>{}), step(Rows<3>{});
  }
}

template <int BITS>
void float_matmul(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& g = *a.w;
  float wbuf[256 * 8];  // one block (block <= 256)
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = a.packed + p * g.panel_bytes;
    const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
    for (int64_t b = 0; b < g.nblocks; ++b) {
      dequantize_block<BITS>(g, panel + b * g.block_bytes, wbuf);
      for_row_tiles<8>(m0, m1, [&](auto tile_rows, int64_t mt) {
        constexpr int R = decltype(tile_rows)::value;
        const float* x[R];
        for (int i = 0; i < R; ++i) x[i] = a.x + (mt + i) * a.ldx + b * g.block;
        float32x4_t part[R][2];
        float_rows<R>(wbuf, x, g.block, part);
        for (int i = 0; i < R; ++i) {
          float tmp[8];
          vst1q_f32(tmp, part[i][0]);
          vst1q_f32(tmp + 4, part[i][1]);
          float* out = a.y + (mt + i) * a.ldy + n0;
          for (int64_t r = 0; r < rows; ++r) {
            const float acc = (b == 0 ? 0.f : out[r]) + tmp[r];
            out[r] = b + 1 < g.nblocks ? acc : acc * a.unscale + (a.bias ? a.bias[n0 + r] : 0.f);
          }
        }
      });
    }
  }
}

// A level's table: its integer cores for GEMV (1 x 8) and GEMM (GemmRows x 8 row tiles), everything else
// shared. Names: scheme x layout x tile x level.
template <template <int, int> class GemvDot, template <int, int> class GemmDot, int GemmRows>
KernelTable make_table(Isa isa, const char* gemv_w4, const char* gemv_w8, const char* gemm_w4,
                       const char* gemm_w8) {
  constexpr int32_t kShift8 = 128;  // int8 codes stored as code - 128 (nr8_kr4_s8: s8 operands)
  KernelTable t{isa, LayoutId::nr8_kr4_s8, quantize_acts, "quantize_acts_absmax_neon", prepare_float_acts, {}, {}, {}};
  t.int8 = {
      {gemv_w4, GemvFor<GemvDot, 4>::fn, 4, 1, 1, 1, 1},
      {gemm_w4, gemm<GemmDot, 4, GemmRows>, 4, GemmRows, 1, 2},
      {gemv_w8, GemvFor<GemvDot, 8>::fn, 8, 1, 1, 1, 1, 1, kShift8},
      {gemm_w8, gemm<GemmDot, 8, GemmRows>, 8, GemmRows, 1, 2, INT64_MAX, 1, kShift8},
  };
  t.float32 = {
      {"gemv_w4f32_nr8_kr4_1x8_neon", float_matmul<4>, 4, 1, 1, 1, 1},
      {"gemm_w4f32_nr8_kr4_1x8_neon", float_matmul<4>, 4, 1, 1, 2},
      {"gemv_w8f32_nr8_kr4_s8_1x8_neon", float_matmul<8>, 8, 1, 1, 1, 1},
      {"gemm_w8f32_nr8_kr4_s8_1x8_neon", float_matmul<8>, 8, 1, 1, 2},
  };
  return t;
}

}  // namespace QLINEAR_ARM_LEVEL
}  // namespace qlinear::arm
