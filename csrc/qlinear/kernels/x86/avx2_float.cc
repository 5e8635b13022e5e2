// AVX2 + FMA + F16C kernels of the low-memory float path (float activations, int4 / int8 weights
// of the nr8_kr4 layout dequantized in registers, fp32 accumulation).
//
// GEMV: a 32-bit lane of a chunk holds one row's codes for 4 (int8) or 8 (int4) consecutive k.
// Instead of shifting each code down, the code is masked in place (q << s, exact as a float) and
// accumulated in an accumulator of its own bit position s; a block's accumulators are combined
// with exact power-of-two factors 2^-s. Per k and 8 rows: AND, CVTDQ2PS, FMA. Then per block:
// y += scale * acc + offset * sum(x)  (symmetric: y += scale * (acc - zero_point * sum(x))).
//
// GEMM: a slice of a panel is dequantized once into a float buffer (8 rows per k, w' = scale * q
// + offset), then every 4-row tile of x runs an 8-wide FMA micro-kernel over it.
#include <immintrin.h>

#include <cmath>
#include <utility>

#include "qlinear/kernels/x86/avx2.h"
#include "qlinear/kernels/tiling.h"

namespace qlinear::avx2 {

namespace {

inline __m256 load_half8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Bit positions of the codes of one chunk lane, in k order: int4 low nibbles k0..3 at bits 0, 8,
// 16, 24, high nibbles k4..7 at 4, 12, 20, 28; int8 bytes k0..3 at 0, 8, 16, 24. The last
// position of each is shifted down instead of masked (its mask would set the sign bit).
template <int BITS> struct Positions;
template <> struct Positions<4> {
  static constexpr int count = 8;
  static constexpr int shift[8] = {0, 8, 16, 24, 4, 12, 20, 0};
};
template <> struct Positions<8> {
  static constexpr int count = 4;
  static constexpr int shift[4] = {0, 8, 16, 0};
};

// The code of position i of every lane, times 2^shift[i], as floats.
template <int BITS, int I>
inline __m256 position_value(__m256i v) {
  constexpr int kLast = Positions<BITS>::count - 1;
  if constexpr (I == kLast) {
    return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, BITS == 4 ? 28 : 24));
  } else {
    constexpr uint32_t mask = (BITS == 4 ? 0xFu : 0xFFu) << Positions<BITS>::shift[I];
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(mask))));
  }
}

template <int BITS, int... I>
inline void accumulate_chunk(__m256i v, const float* x, __m256* acc, std::integer_sequence<int, I...>) {
  ((acc[I] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + I), position_value<BITS, I>(v), acc[I])), ...);
}

}  // namespace

float prepare_float_acts(const FloatActArgs& a, int64_t m0, int64_t m1) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps();
  for (int64_t m = m0; m < m1; ++m) {
    float* out = a.out + m * a.ldo;
    int64_t i = 0;
    if (a.dtype == DType::f32) {
      const float* x = static_cast<const float*>(a.x) + m * a.ldx;
      for (; i + 8 <= a.k; i += 8) _mm256_storeu_ps(out + i, _mm256_loadu_ps(x + i));
      for (; i < a.k; ++i) out[i] = x[i];
    } else {
      const uint16_t* x = static_cast<const uint16_t*>(a.x) + m * a.ldx;
      for (; i + 8 <= a.k; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
      for (; i < a.k; ++i) out[i] = _cvtsh_ss(x[i]);
    }
    for (; i < a.nblocks * a.block; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < a.nblocks; ++b) {  // blocks are multiples of 32 floats
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
      for (int64_t j = b * a.block; j < (b + 1) * a.block; j += 16) {
        const __m256 v0 = _mm256_loadu_ps(out + j), v1 = _mm256_loadu_ps(out + j + 8);
        s0 = _mm256_add_ps(s0, v0);
        s1 = _mm256_add_ps(s1, v1);
        vmax = _mm256_max_ps(vmax, _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)));
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v0, v1, _CMP_UNORD_Q));
      }
      a.sum[m * a.nblocks + b] = hsum(_mm256_add_ps(s0, s1));
    }
  }
  if (_mm256_movemask_ps(vnan) != 0) return NAN;
  return hmax(vmax);
}

namespace {

template <int BITS>
void gemv_float(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  using P = Positions<BITS>;
  constexpr int kPos = P::count;
  constexpr int kChunkK = BITS == 4 ? 8 : 4;
  const WeightGeometry& g = *a.w;
  const float zp = static_cast<float>(g.zero_point());
  __m256 unshift[kPos];
  for (int i = 0; i < kPos; ++i) unshift[i] = _mm256_set1_ps(std::ldexp(1.f, -P::shift[i]));
  for (int64_t m = m0; m < m1; ++m) {
    const float* x = a.x + m * a.ldx;
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* panel = a.packed + p * g.panel_bytes;
      __m256 y = _mm256_setzero_ps();
      for (int64_t b = 0; b < g.nblocks; ++b) {
        const uint8_t* block = panel + b * g.block_bytes;
        const float* xb = x + b * g.block;
        __m256 acc[kPos];
        for (int i = 0; i < kPos; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t kk = 0; kk < g.block; kk += kChunkK) {
          const uint8_t* w = block + kk * (32 / kChunkK);
          if (kk % (2 * kChunkK) == 0) _mm_prefetch(reinterpret_cast<const char*>(w) + 2048, _MM_HINT_T0);
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
          accumulate_chunk<BITS>(v, xb + kk, acc, std::make_integer_sequence<int, kPos>());
        }
        __m256 sum = _mm256_mul_ps(acc[0], unshift[0]);
        for (int i = 1; i < kPos; ++i) sum = _mm256_fmadd_ps(acc[i], unshift[i], sum);
        const __m256 scale = load_half8(block + g.code_bytes);
        const float xs = a.xsum[m * g.nblocks + b];
        if (g.symmetric) {
          y = _mm256_fmadd_ps(scale, _mm256_fnmadd_ps(_mm256_set1_ps(zp), _mm256_set1_ps(xs), sum), y);
        } else {
          y = _mm256_fmadd_ps(scale, sum, y);
          y = _mm256_fmadd_ps(load_half8(block + g.code_bytes + 16), _mm256_set1_ps(xs), y);
        }
      }
      y = _mm256_mul_ps(y, _mm256_set1_ps(a.unscale));
      const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, y);
      float* out = a.y + m * a.ldy + n0;
      for (int64_t r = 0; r < rows; ++r) out[r] = a.bias ? tmp[r] + a.bias[n0 + r] : tmp[r];
    }
  }
}

constexpr int64_t kSliceK = 2048;  // k per dequantized slice: 8 x 2048 floats = 64 KiB (L2)

template <int BITS, int... I>
inline void dequantize_chunk(__m256i v, const __m256* step, __m256 offset, float* o, std::integer_sequence<int, I...>) {
  ((_mm256_storeu_ps(o + 8 * I, _mm256_fmadd_ps(position_value<BITS, I>(v), step[I], offset))), ...);
}

// w'[kk][r] for the blocks [b0, b1) of one panel, 8 floats per k.
template <int BITS>
void dequantize_slice(const WeightGeometry& g, const uint8_t* panel, int64_t b0, int64_t b1, float* out) {
  using P = Positions<BITS>;
  constexpr int kPos = P::count;
  constexpr int kChunkK = BITS == 4 ? 8 : 4;
  const float zp = static_cast<float>(g.zero_point());
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    const __m256 scale = load_half8(block + g.code_bytes);
    const __m256 offset = g.symmetric ? _mm256_mul_ps(scale, _mm256_set1_ps(-zp)) : load_half8(block + g.code_bytes + 16);
    __m256 step[kPos];  // scale / 2^shift: dequantizes a masked-in-place code with one FMA
    for (int i = 0; i < kPos; ++i) step[i] = _mm256_mul_ps(scale, _mm256_set1_ps(std::ldexp(1.f, -P::shift[i])));
    float* o = out + (b - b0) * g.block * 8;
    for (int64_t kk = 0; kk < g.block; kk += kChunkK, o += 8 * kChunkK) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kk * (32 / kChunkK)));
      dequantize_chunk<BITS>(v, step, offset, o, std::make_integer_sequence<int, kPos>());
    }
  }
}

// Sums per block, then across blocks: the error stays ~(block + blocks) ulps, as in the GEMV.
template <int MR>
inline void slice_tile(const float* wbuf, int64_t klen, int64_t block, const float* const* x,
                       float* const* y, bool first) {
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y[i]);
  for (int64_t k0 = 0; k0 < klen; k0 += block) {
    __m256 part[MR];
    for (int i = 0; i < MR; ++i) part[i] = _mm256_setzero_ps();
    for (int64_t kk = k0; kk < k0 + block; ++kk) {
      const __m256 w = _mm256_loadu_ps(wbuf + 8 * kk);
      for (int i = 0; i < MR; ++i) part[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(x[i] + kk), w, part[i]);
    }
    for (int i = 0; i < MR; ++i) acc[i] = _mm256_add_ps(acc[i], part[i]);
  }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(y[i], acc[i]);
}


template <int BITS>
void gemm_float(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& g = *a.w;
  alignas(32) float wbuf[8 * kSliceK];
  alignas(32) float ytile[4][8];
  const int64_t blocks_per_slice = std::max<int64_t>(1, kSliceK / g.block);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = a.packed + p * g.panel_bytes;
    const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
    for (int64_t b0 = 0; b0 < g.nblocks; b0 += blocks_per_slice) {
      const int64_t b1 = std::min(g.nblocks, b0 + blocks_per_slice);
      dequantize_slice<BITS>(g, panel, b0, b1, wbuf);
      const int64_t k0 = b0 * g.block, klen = (b1 - b0) * g.block;
      const bool first = b0 == 0, last = b1 == g.nblocks;
      for_row_tiles<4>(m0, m1, [&](auto tile_rows, int64_t m) {
        constexpr int mr = decltype(tile_rows)::value;
        const float* x[mr];
        float* y[mr];
        for (int i = 0; i < mr; ++i) {
          x[i] = a.x + (m + i) * a.ldx + k0;
          y[i] = ytile[i];
        }
        // Between slices the partial sums wait in the output.
        if (!first) {
          for (int i = 0; i < mr; ++i)
            for (int64_t r = 0; r < 8; ++r) ytile[i][r] = r < rows ? a.y[(m + i) * a.ldy + n0 + r] : 0.f;
        }
        slice_tile<mr>(wbuf, klen, g.block, x, y, first);
        for (int i = 0; i < mr; ++i) {
          float* out = a.y + (m + i) * a.ldy + n0;
          for (int64_t r = 0; r < rows; ++r) {
            float v = ytile[i][r];
            if (last) v = v * a.unscale + (a.bias ? a.bias[n0 + r] : 0.f);
            out[r] = v;
          }
        }
      });
    }
  }
}

}  // namespace

std::vector<FloatUkernel> float_ukernels() {
  return {
      {"gemv_w4f32_nr8_kr4_1x8_avx2", gemv_float<4>, 4, 1, 1, 1, 1},
      {"gemm_w4f32_nr8_kr4_4x8_avx2", gemm_float<4>, 4, 4, 1, 2},
      {"gemv_w8f32_nr8_kr4_1x8_avx2", gemv_float<8>, 8, 1, 1, 1, 1},
      {"gemm_w8f32_nr8_kr4_4x8_avx2", gemm_float<8>, 8, 4, 1, 2},
  };
}

}  // namespace qlinear::avx2
