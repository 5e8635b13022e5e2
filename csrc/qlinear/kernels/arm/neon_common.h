// Pieces shared by the aarch64 levels (neon.cc, dotprod.cc, i8mm.cc): activation quantization, the
// row tiles and GEMV / GEMM drivers over a level's block dot with their float epilogue
// (neon_sdot.h: the dot-product levels' core; neon_table.h: the float path and a level's table).
// Included by each level's file, so each copy is compiled with that file's -march flags; the file
// names its level first (QLINEAR_ARM_LEVEL), and every template here lives in the namespace
// qlinear::arm::<level>, so the linker never merges one level's copy into another's (a weak
// template instance compiled with +i8mm must not be what the neon level calls) and each level's
// kernels have their own symbols.
#pragma once

#if !defined(QLINEAR_ARM_LEVEL)
#error "define QLINEAR_ARM_LEVEL (neon, dotprod, i8mm) before including neon_common.h"
#endif

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "qlinear/core/kernels.h"
#include "qlinear/core/layout_access.h"  // kKr8Gather
#include "qlinear/kernels/tiling.h"

namespace qlinear::arm {
inline namespace QLINEAR_ARM_LEVEL {

template <DType DT>
inline float32x4_t load4(const void* x, int64_t i) {
  if constexpr (DT == DType::f32) return vld1q_f32(static_cast<const float*>(x) + i);
  else return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(static_cast<const uint16_t*>(x) + i)));
}

template <DType DT>
inline float load1(const void* x, int64_t i) {
  if constexpr (DT == DType::f32) return static_cast<const float*>(x)[i];
  else return half_to_float(static_cast<const uint16_t*>(x)[i]);
}

// absmax per activation block, q = rint(x / s) (FCVTNS: nearest, ties to even), s = absmax / 127.
template <DType DT>
void quantize_acts_impl(const ActQuantArgs& a, int64_t m0, int64_t m1) {
  const int64_t kpad = a.nblocks * a.block;
  const int64_t act_block = a.act_block >= a.k ? kpad : a.act_block;
  for (int64_t m = m0; m < m1; ++m) {
    const void* x = DT == DType::f32 ? static_cast<const void*>(static_cast<const float*>(a.x) + m * a.ldx)
                                     : static_cast<const void*>(static_cast<const uint16_t*>(a.x) + m * a.ldx);
    int8_t* q = a.q + m * a.ldq;
    for (int64_t a0 = 0; a0 < kpad; a0 += act_block) {
      const int64_t a1 = std::min(a0 + act_block, a.k);
      float32x4_t vmax = vdupq_n_f32(0.f);
      uint32x4_t vnan = vdupq_n_u32(0);
      int64_t i = a0;
      for (; i + 4 <= a1; i += 4) {
        const float32x4_t v = load4<DT>(x, i);
        vmax = vmaxnmq_f32(vmax, vabsq_f32(v));
        vnan = vorrq_u32(vnan, vmvnq_u32(vceqq_f32(v, v)));
      }
      const float absmax = vmaxvq_f32(vmax);
      const bool finite = vmaxvq_u32(vnan) == 0;
      const float s = act_scale(absmax, finite, [&](int64_t j) { return load1<DT>(x, j); }, i, a1);
      const bool zero = !(s > 0.f);
      const float32x4_t vs = vdupq_n_f32(s);
      const int64_t block_end = std::min(a0 + act_block, kpad);
      for (int64_t b = a0 / a.block; b < block_end / a.block; ++b) {
        const int64_t b0 = b * a.block, b1 = b0 + a.block, real_end = std::max(b0, std::min(b1, a1));
        int32x4_t vsum = vdupq_n_s32(0);
        int32_t sum = 0;
        int64_t j = b0;
        if (!zero) {
          for (; j + 8 <= real_end; j += 8) {
            int32x4_t q0 = vcvtnq_s32_f32(vdivq_f32(load4<DT>(x, j), vs));
            int32x4_t q1 = vcvtnq_s32_f32(vdivq_f32(load4<DT>(x, j + 4), vs));
            q0 = vmaxq_s32(vdupq_n_s32(-127), vminq_s32(vdupq_n_s32(127), q0));
            q1 = vmaxq_s32(vdupq_n_s32(-127), vminq_s32(vdupq_n_s32(127), q1));
            vsum = vaddq_s32(vsum, vaddq_s32(q0, q1));
            vst1_s8(q + j, vmovn_s16(vcombine_s16(vmovn_s32(q0), vmovn_s32(q1))));
          }
          for (; j < real_end; ++j) sum += q[j] = quantize_one(load1<DT>(x, j), s);
        }
        for (; j < b1; ++j) q[j] = 0;
        a.sum[m * a.nblocks + b] = sum + vaddvq_s32(vsum);
        a.scale[m * a.nblocks + b] = s;
      }
    }
  }
}

inline void quantize_acts(const ActQuantArgs& a, int64_t m0, int64_t m1) {
  if (a.dtype == DType::f32) quantize_acts_impl<DType::f32>(a, m0, m1);
  else quantize_acts_impl<DType::f16>(a, m0, m1);
  write_pre_sums(a, m0, m1);
}

inline float32x4_t load_half4(const uint8_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}

// A level's integer core: BlockDot<BITS, MR>::run(block codes, block length, xq rows, acc) fills
// acc[i][0] (rows 0-3) and acc[i][1] (rows 4-7) with the block's sums of x * code (int4) or
// x * (code - 128) (int8). The rest -- epilogue, tiling, stores -- is common.
template <template <int, int> class BlockDot, int BITS, int MR>
void panel_tile(const Int8MatmulArgs& a, int64_t m, int64_t p) {
  const WeightGeometry& g = *a.w;
  const uint8_t* panel = a.packed + p * g.panel_bytes;
  const int8_t* xq[MR];
  float32x4_t y[MR][2];
  for (int i = 0; i < MR; ++i) {
    xq[i] = a.act.q + (m + i) * a.act.ldq;
    y[i][0] = y[i][1] = vdupq_n_f32(0.f);
  }
  const float* sx = a.act.scale + m * g.nblocks;
  const float* sxsum = a.act.scaled_sum + m * g.nblocks;
  const int32_t* zsum = a.act.shifted_sum + m * g.nblocks;
  for (int64_t b = 0; b < g.nblocks; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    int32x4_t acc[MR][2];
    BlockDot<BITS, MR>::run(block, g.block, xq, acc);
    const float32x4_t scale[2] = {load_half4(block + g.code_bytes), load_half4(block + g.code_bytes + 8)};
    for (int i = 0; i < MR; ++i) {
      const int64_t at = i * g.nblocks + b;
      const int32x4_t z = vdupq_n_s32(zsum[at]);
      for (int h = 0; h < 2; ++h)
        y[i][h] = vfmaq_f32(y[i][h], vcvtq_f32_s32(vaddq_s32(acc[i][h], z)), vmulq_n_f32(scale[h], sx[at]));
      xq[i] += g.block;
    }
    if (!g.symmetric) {
      const float32x4_t offset[2] = {load_half4(block + g.code_bytes + 16), load_half4(block + g.code_bytes + 24)};
      for (int i = 0; i < MR; ++i)
        for (int h = 0; h < 2; ++h) y[i][h] = vfmaq_n_f32(y[i][h], offset[h], sxsum[i * g.nblocks + b]);
    }
  }
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
  for (int i = 0; i < MR; ++i) {
    float tmp[8];
    vst1q_f32(tmp, y[i][0]);
    vst1q_f32(tmp + 4, y[i][1]);
    float* out = a.y + (m + i) * a.ldy + n0;
    for (int64_t r = 0; r < rows; ++r) out[r] = a.bias ? tmp[r] + a.bias[n0 + r] : tmp[r];
  }
}

template <template <int, int> class BlockDot, int BITS>
void gemv(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t p = p0; p < p1; ++p) panel_tile<BlockDot, BITS, 1>(a, m, p);
}

template <template <int, int> class BlockDot, int BITS, int MR>
void gemm(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  constexpr int64_t kRowChunk = 32;
  for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
    const int64_t mc1 = std::min(m1, mc + kRowChunk);
    for (int64_t p = p0; p < p1; ++p)
      for_row_tiles<MR>(mc, mc1, [&](auto rows, int64_t m) { panel_tile<BlockDot, BITS, decltype(rows)::value>(a, m, p); });
  }
}

// Runs f(Rows<KB>{}, std::bool_constant<ASYM>{}) for the weight: its storage block as a constant
// where the GEMVs unroll it (64, 32, 128; else KB 0, the block read at run time), and whether it
// is asymmetric.
template <class F>
inline void with_block_and_symmetry(const WeightGeometry& g, F&& f) {
  const auto by_symmetry = [&](auto kb) {
    if (g.symmetric) f(kb, std::false_type{});
    else f(kb, std::true_type{});
  };
  if (g.block == 64) by_symmetry(Rows<64>{});
  else if (g.block == 32) by_symmetry(Rows<32>{});
  else if (g.block == 128) by_symmetry(Rows<128>{});
  else by_symmetry(Rows<0>{});
}

}  // namespace QLINEAR_ARM_LEVEL
}  // namespace qlinear::arm
