// AVX2 + FMA + F16C kernels over the nr8_kr4 layout (compiled with -mavx2 -mfma -mf16c in
// this file only; dispatch calls them only on CPUs that report all three).
//
// Integer core, per 32-byte chunk of one panel (8 output rows x 4 k per 32-bit lane):
//   int4: the chunk splits into low / high nibbles, two u8 x 8 x 4 operands (0..15); each is
//         multiplied by 4 activation bytes broadcast to every lane with VPMADDUBSW (u8 x s8,
//         pairs summed in s16: |pair| <= 2 * 15 * 127). Four chunks (32 k) add up in s16
//         (|sum| <= 16 * 15 * 127 = 30480 < 32767) before VPMADDWD widens them to int32: exact.
//   int8: codes 0..255 are flipped to c - 128 (-128..127); VPMADDUBSW(|c - 128|, sign(x, c - 128))
//         keeps |pair| <= 2 * 128 * 127 < 32767, widened to int32 per chunk: exact. The int32
//         sums are of x * (c - 128): symmetric weights need nothing more, asymmetric ones add
//         128 * sum(x) to recover the sum over the stored codes.
// Float epilogue per block (8 rows at once): y += (s_x * scale) * acc + (s_x * sum_x) * offset.
// GEMV and small GEMMs run row tiles over the packed panels; the int4 GEMM from 12 rows on
// (prefill) unpacks each block of two panels once and runs 3-row x 16-output tiles over it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "avx2.h"

namespace qlinear {
namespace {

using avx2::hmax;

// ---------------------------------------------------------------------------------------------
// Dynamic activation quantization: absmax per block, q = rint(x / s), s = absmax / 127.

template <DType DT>
inline __m256 load8(const void* x, int64_t i) {
  if constexpr (DT == DType::f32) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  else return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i)));
}

template <DType DT>
inline float load1(const void* x, int64_t i) {
  if constexpr (DT == DType::f32) return static_cast<const float*>(x)[i];
  else return _cvtsh_ss(static_cast<const uint16_t*>(x)[i]);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

template <DType DT>
void quantize_acts_impl(const ActQuantArgs& a, int64_t m0, int64_t m1) {
  const int64_t kpad = a.nblocks * a.block;
  const int64_t act_block = a.act_block >= a.k ? kpad : a.act_block;
  const __m256 sign_mask = _mm256_set1_ps(-0.f);
  const __m256i qmax = _mm256_set1_epi32(127), qmin = _mm256_set1_epi32(-127);
  for (int64_t m = m0; m < m1; ++m) {
    const void* x = DT == DType::f32 ? static_cast<const void*>(static_cast<const float*>(a.x) + m * a.ldx)
                                     : static_cast<const void*>(static_cast<const uint16_t*>(a.x) + m * a.ldx);
    int8_t* q = a.q + m * a.ldq;
    for (int64_t a0 = 0; a0 < kpad; a0 += act_block) {
      const int64_t a1 = std::min(a0 + act_block, a.k);  // real activations of this block
      // absmax, with NaN / Inf detection (VMAXPS drops NaNs, so track them apart).
      __m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps();
      int64_t i = a0;
      for (; i + 8 <= a1; i += 8) {
        const __m256 v = load8<DT>(x, i);
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign_mask, v));
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      }
      float absmax = hmax(vmax);
      bool finite = _mm256_movemask_ps(vnan) == 0;
      for (; i < a1; ++i) {
        const float v = load1<DT>(x, i);
        finite &= !std::isnan(v);
        absmax = std::max(absmax, std::fabs(v));
      }
      finite &= !std::isinf(absmax);
      const float s = finite ? absmax / 127.f : NAN;
      const bool zero = !(s > 0.f);  // all-zero, underflowing or non-finite block: q = 0
      const __m256 vs = _mm256_set1_ps(s);
      const int64_t block_end = std::min(a0 + act_block, kpad);
      for (int64_t b = a0 / a.block; b < block_end / a.block; ++b) {
        const int64_t b0 = b * a.block, b1 = b0 + a.block, real_end = std::max(b0, std::min(b1, a1));
        __m256i vsum = _mm256_setzero_si256();
        int32_t sum = 0;
        int64_t j = b0;
        if (!zero) {
          for (; j + 8 <= real_end; j += 8) {
            __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(load8<DT>(x, j), vs));  // rounds to nearest even
            v = _mm256_max_epi32(qmin, _mm256_min_epi32(qmax, v));
            vsum = _mm256_add_epi32(vsum, v);
            const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(q + j), _mm_packs_epi16(w16, w16));
          }
          for (; j < real_end; ++j) {
            const float r = std::nearbyint(load1<DT>(x, j) / s);
            const int32_t v = static_cast<int32_t>(std::min(127.f, std::max(-127.f, r)));
            q[j] = static_cast<int8_t>(v);
            sum += v;
          }
        }
        for (; j < b1; ++j) q[j] = 0;
        a.sum[m * a.nblocks + b] = sum + hsum_epi32(vsum);
        a.scale[m * a.nblocks + b] = s;
      }
    }
  }
}

void quantize_acts(const ActQuantArgs& a, int64_t m0, int64_t m1) {
  if (a.dtype == DType::f32) quantize_acts_impl<DType::f32>(a, m0, m1);
  else quantize_acts_impl<DType::f16>(a, m0, m1);
}

// ---------------------------------------------------------------------------------------------
// Integer matmul: MR activation rows x one panel (8 output rows), over all blocks.

using avx2::bcast4;

// Sum over one block of x * code (int4) or x * (code - 128) (int8) for MR rows, 8 weight rows.
template <int BITS, int MR, bool PREFETCH>
inline void block_dot(const uint8_t* w, int64_t block, const int8_t* const* xq, __m256i* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_si256();
  if constexpr (BITS == 4) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t kk = 0; kk < block; kk += 32, w += 128) {  // 4 chunks of 8 k
      if constexpr (PREFETCH) {
        _mm_prefetch(reinterpret_cast<const char*>(w) + 2048, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w) + 2048 + 64, _MM_HINT_T0);
      }
      __m256i s16[MR];
      for (int i = 0; i < MR; ++i) s16[i] = _mm256_setzero_si256();
      const auto chunk = [&](int c) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c));
        const __m256i lo = _mm256_and_si256(raw, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        for (int i = 0; i < MR; ++i) {
          const int8_t* x = xq[i] + kk + 8 * c;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(x)),
                                             _mm256_maddubs_epi16(hi, bcast4(x + 4)));
          s16[i] = _mm256_add_epi16(s16[i], p);
        }
      };
      if constexpr (MR == 1) {
        for (int c = 0; c < 4; ++c) chunk(c);
      } else {
        // Kept rolled: unrolled, GCC hoists all four chunks' products and spills them.
#pragma GCC unroll 1
        for (int c = 0; c < 4; ++c) chunk(c);
      }
      for (int i = 0; i < MR; ++i) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(s16[i], ones));
    }
  } else {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int64_t kk = 0; kk < block; kk += 8, w += 64) {  // 2 chunks of 4 k
      if constexpr (PREFETCH) _mm_prefetch(reinterpret_cast<const char*>(w) + 2048, _MM_HINT_T0);
      for (int c = 0; c < 2; ++c) {
        const __m256i sw = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c)), flip);
        const __m256i aw = _mm256_abs_epi8(sw);
        for (int i = 0; i < MR; ++i) {
          const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(xq[i] + kk + 4 * c), sw));
          acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p, ones));
        }
      }
    }
  }
}

template <int BITS, int MR, bool PREFETCH>
void panel_tile(const Int8MatmulArgs& a, int64_t m, int64_t p) {
  const WeightGeometry& g = *a.w;
  // The integer sums are over codes (int4) or codes - 128 (int8); adding shifted_sum makes them
  // sum(x * (code - zero_point)), exactly (see code_shift in kernels.h).
  const uint8_t* panel = a.packed + p * g.panel_bytes;
  const int8_t* xq[MR];
  const float* sx = a.act.scale + m * g.nblocks;
  const float* sxsum = a.act.scaled_sum + m * g.nblocks;
  const int32_t* zsum = a.act.shifted_sum + m * g.nblocks;
  __m256 y[MR];
  for (int i = 0; i < MR; ++i) {
    xq[i] = a.act.q + (m + i) * a.act.ldq;
    y[i] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < g.nblocks; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    __m256i acc[MR];
    block_dot<BITS, MR, PREFETCH>(block, g.block, xq, acc);
    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g.code_bytes)));
    for (int i = 0; i < MR; ++i) {
      const int64_t at = i * g.nblocks + b;
      const __m256i acc_q = _mm256_add_epi32(acc[i], _mm256_set1_epi32(zsum[at]));
      y[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc_q), _mm256_mul_ps(scale, _mm256_broadcast_ss(sx + at)), y[i]);
      xq[i] += g.block;
    }
    if (!g.symmetric) {
      const __m256 offset = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g.code_bytes + 16)));
      for (int i = 0; i < MR; ++i)
        y[i] = _mm256_fmadd_ps(offset, _mm256_broadcast_ss(sxsum + i * g.nblocks + b), y[i]);
    }
  }
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
  const __m256 bias = a.bias == nullptr ? _mm256_setzero_ps()
      : rows == 8 ? _mm256_loadu_ps(a.bias + n0) : _mm256_setzero_ps();
  for (int i = 0; i < MR; ++i) {
    float* out = a.y + (m + i) * a.ldy + n0;
    if (rows == 8) {
      _mm256_storeu_ps(out, _mm256_add_ps(y[i], bias));
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, y[i]);
      for (int64_t r = 0; r < rows; ++r) out[r] = a.bias ? tmp[r] + a.bias[n0 + r] : tmp[r];
    }
  }
}

template <int BITS>
void gemv(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t p = p0; p < p1; ++p) panel_tile<BITS, 1, true>(a, m, p);
}

// Rows are taken in chunks whose int8 activations stay in L2 (32 x K bytes) while every panel
// of the range passes over them; a panel (8 x K codes) stays in L1 across the chunk's row tiles.
template <int BITS>
void gemm(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  constexpr int64_t kRowChunk = 32;
  for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
    const int64_t mc1 = std::min(m1, mc + kRowChunk);
    for (int64_t p = p0; p < p1; ++p) {
      int64_t m = mc;
      for (; m + 4 <= mc1; m += 4) panel_tile<BITS, 4, false>(a, m, p);
      switch (mc1 - m) {
        case 3: panel_tile<BITS, 3, false>(a, m, p); break;
        case 2: panel_tile<BITS, 2, false>(a, m, p); break;
        case 1: panel_tile<BITS, 1, false>(a, m, p); break;
        default: break;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// int4 GEMM over unpacked blocks. The prefill GEMM is bound by vector ALU operations, not by
// memory, and VPMADDUBSW + VPADDW (one each per 32 multiply-adds) are the floor; the rest is
// overhead to cut: splitting nibbles inside the row tile (3 operations per chunk), a broadcast per
// 8 output rows, spills. So each block of two panels is unpacked once into int8 chunks (8 rows x
// 4 k, 0..15) in an L1 buffer, chunk j of both panels side by side, and every 3-row tile of the
// row chunk reuses it: one activation broadcast feeds 16 output rows. The float results of the
// chunk's rows live in an L1 tile updated once per block, leaving the registers to the integer
// sums (3 x 2 x s16 + 3 x 2 x s32).

// acc[i * NP + p] = sum over one block of xq[i][k] * code[p][n][k] for MR rows x NP panels.
// The u8 x s8 pair sums of 8 chunks (32 k) add up in s16 (|sum| <= 8 * 2 * 15 * 127 = 30480)
// before VPMADDWD widens them: exact.
template <int MR, int NP>
inline void unpacked_block_dot(const int8_t* w, int64_t block, const int8_t* const* xq, __m256i* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  // 32 k: the first chunk's products start the s16 sums, the first step's widened sums the
  // accumulators (no additions to zero).
  const auto step32 = [&](int64_t kk, auto first_step) {
    __m256i s16[MR * NP];
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      // Ordered barriers: chunk c's sums are complete before chunk c + 1's weights are read.
      // Without them GCC hoists all products above the sums and spills them.
      if (c > 0)
        for (int i = 0; i < MR * NP; ++i) __asm__ volatile("" : "+x"(s16[i]));
      __m256i wc[NP];
      for (int p = 0; p < NP; ++p) {
        wc[p] = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + 32 * (c * NP + p)));
        __asm__ volatile("" : "+x"(wc[p]));
      }
      for (int i = 0; i < MR; ++i) {
        const __m256i x4 = bcast4(xq[i] + kk + 4 * c);
        for (int p = 0; p < NP; ++p) {
          const __m256i prod = _mm256_maddubs_epi16(wc[p], x4);
          s16[i * NP + p] = c == 0 ? prod : _mm256_add_epi16(s16[i * NP + p], prod);
        }
      }
    }
    for (int i = 0; i < MR * NP; ++i) {
      const __m256i wide = _mm256_madd_epi16(s16[i], ones);
      acc[i] = decltype(first_step)::value ? wide : _mm256_add_epi32(acc[i], wide);
    }
    w += 256 * NP;
  };
  step32(0, std::true_type{});
  for (int64_t kk = 32; kk < block; kk += 32) step32(kk, std::false_type{});
}

// A block's scales and offsets, one vector per panel.
struct BlockFactors {
  __m256 scale[2], offset[2];
};

// One block of an MR-row x NP-panel tile: integer sums, then
// ytile[i][p] += s_x * scale * (acc + zsum) (+ s_x * sum_x * offset). ytile rows hold 8 * NP floats.
template <int MR, int NP>
inline void unpacked_tile_block(const Int8MatmulArgs& a, const int8_t* w, const BlockFactors& f,
                                bool asymmetric, int64_t m, int64_t b, float* ytile) {
  const WeightGeometry& g = *a.w;
  const int8_t* xq[MR];
  for (int i = 0; i < MR; ++i) xq[i] = a.act.q + (m + i) * a.act.ldq + b * g.block;
  __m256i acc[MR * NP];
  unpacked_block_dot<MR, NP>(w, g.block, xq, acc);
  for (int i = 0; i < MR; ++i) {
    const int64_t at = (m + i) * g.nblocks + b;
    const __m256 sx = _mm256_broadcast_ss(a.act.scale + at);
    const __m256i zsum = _mm256_set1_epi32(a.act.shifted_sum[at]);
    const __m256 sxsum = _mm256_broadcast_ss(a.act.scaled_sum + at);
    for (int p = 0; p < NP; ++p) {
      float* yp = ytile + 8 * (i * NP + p);
      // int4 codes are summed as stored: only symmetric weights need their zero point removed
      const __m256i acc_q = asymmetric ? acc[i * NP + p] : _mm256_add_epi32(acc[i * NP + p], zsum);
      __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc_q), _mm256_mul_ps(f.scale[p], sx), _mm256_load_ps(yp));
      if (asymmetric) y = _mm256_fmadd_ps(f.offset[p], sxsum, y);
      _mm256_store_ps(yp, y);
    }
  }
}

// Rows [mc, mc1) x panels [p, p + NP): returns the results in ytile ([rows][8 * NP]).
template <int NP>
void unpacked_panels(const Int8MatmulArgs& a, int64_t mc, int64_t mc1, int64_t p, int8_t* wbuf, float* ytile) {
  const WeightGeometry& g = *a.w;
  constexpr int MR = NP == 2 ? 3 : 4;
  const bool asymmetric = !g.symmetric;
  std::fill(ytile, ytile + (mc1 - mc) * 8 * NP, 0.f);
  for (int64_t b = 0; b < g.nblocks; ++b) {
    BlockFactors f;
    for (int q = 0; q < NP; ++q) {
      const uint8_t* block = a.packed + (p + q) * g.panel_bytes + b * g.block_bytes;
      avx2::unpack_int4_block(block, g.code_bytes, wbuf + 32 * q, 32 * NP);
      f.scale[q] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g.code_bytes)));
      f.offset[q] = asymmetric
          ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g.code_bytes + 16)))
          : _mm256_setzero_ps();
    }
    int64_t m = mc;
    float* yt = ytile;
    for (; m + MR <= mc1; m += MR, yt += MR * 8 * NP) unpacked_tile_block<MR, NP>(a, wbuf, f, asymmetric, m, b, yt);
    switch (mc1 - m) {
      case 3: unpacked_tile_block<3, NP>(a, wbuf, f, asymmetric, m, b, yt); break;
      case 2: unpacked_tile_block<2, NP>(a, wbuf, f, asymmetric, m, b, yt); break;
      case 1: unpacked_tile_block<1, NP>(a, wbuf, f, asymmetric, m, b, yt); break;
      default: break;
    }
  }
}

// Rows of a chunk whose int8 activations (rows x K bytes) stay in about half of L2 while the
// panels pass over them (3-row tiles: a multiple of 3).
inline int64_t unpacked_row_chunk(int64_t kpad) {
  constexpr int64_t kMaxRowChunk = 96;
  return std::clamp<int64_t>((196608 / kpad) / 3 * 3, 24, kMaxRowChunk);
}

void gemm_unpacked4(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  alignas(64) int8_t wbuf[2 * 8 * 256];  // one unpacked block of two panels (block <= 256)
  avx2::gemm_by_panel_pairs(a, m0, m1, p0, p1, unpacked_row_chunk(a.w->padded_k()),
                            [&](int64_t mc, int64_t mc1, int64_t p, int np, float* ytile) {
                              if (np == 2) unpacked_panels<2>(a, mc, mc1, p, wbuf, ytile);
                              else unpacked_panels<1>(a, mc, mc1, p, wbuf, ytile);
                            });
}

// Below a dozen rows the unpacking is not repaid: the row tiles split nibbles themselves.
void gemm4(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  if (m1 - m0 >= 12) gemm_unpacked4(a, m0, m1, p0, p1);
  else gemm<4>(a, m0, m1, p0, p1);
}

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table = {
      Isa::avx2,
      quantize_acts, "quantize_acts_absmax_avx2",
      {gemv<4>, gemv<8>}, {"gemv_w4a8_nr8_kr4_avx2", "gemv_w8a8_nr8_kr4_avx2"},
      {gemm4, gemm<8>}, {"gemm_w4a8_nr8_kr4_3x16_unpacked_avx2", "gemm_w8a8_nr8_kr4_4x8_avx2"},
      {0, 128},
      avx2::prepare_float_acts,
      {avx2::gemv_float<4>, avx2::gemv_float<8>}, {"gemv_w4f32_nr8_kr4_avx2", "gemv_w8f32_nr8_kr4_avx2"},
      {avx2::gemm_float<4>, avx2::gemm_float<8>}, {"gemm_w4f32_nr8_kr4_4x8_avx2", "gemm_w8f32_nr8_kr4_4x8_avx2"},
      LayoutId::nr8_kr4,
  };
  return table;
}

}  // namespace qlinear
