// Functions of the AVX2 level shared between its translation units (all compiled with
// -mavx2 -mfma -mf16c; call them only through the kernel table).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "../kernels.h"

namespace qlinear::avx2 {

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 4 activation bytes broadcast to every 32-bit lane.
inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The GEMM driver of the tiled int8 kernels (AVX2 int4, AVX-VNNI): rows in chunks of `row_chunk`
// (<= 96) whose int8 activations stay in L2, panels two at a time (an odd last one alone).
// run(mc, mc1, p, np, ytile) computes rows [mc, mc1) x panels [p, p + np) into the L1 tile
// ytile ([rows][8 * np] floats); the tile then goes to y, with the bias.
template <class RunPanels>
void gemm_by_panel_pairs(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
                         int64_t row_chunk, RunPanels&& run) {
  const WeightGeometry& g = *a.w;
  alignas(64) float ytile[96 * 16];
  for (int64_t mc = m0; mc < m1; mc += row_chunk) {
    const int64_t mc1 = std::min(m1, mc + row_chunk);
    for (int64_t p = p0; p < p1;) {
      const int np = p + 2 <= p1 ? 2 : 1;
      run(mc, mc1, p, np, ytile);
      for (int q = 0; q < np; ++q, ++p) {
        const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
        const __m256 bias = a.bias == nullptr || rows < 8 ? _mm256_setzero_ps() : _mm256_loadu_ps(a.bias + n0);
        for (int64_t m = mc; m < mc1; ++m) {
          const float* yt = ytile + (m - mc) * 8 * np + 8 * q;
          float* out = a.y + m * a.ldy + n0;
          if (rows == 8) {
            _mm256_storeu_ps(out, _mm256_add_ps(_mm256_load_ps(yt), bias));
          } else {
            for (int64_t r = 0; r < rows; ++r) out[r] = a.bias ? yt[r] + a.bias[n0 + r] : yt[r];
          }
        }
      }
    }
  }
}

// Unpacks one panel's block of int4 codes: int4 chunk c (8 rows x 8 k) -> int8 chunks 2c (k 0..3,
// low nibbles) and 2c + 1 (k 4..7, high nibbles), 0..15 each, chunk j stored at out + j * stride
// (32-byte aligned).
inline void unpack_int4_block(const uint8_t* codes, int64_t code_bytes, int8_t* out, int64_t stride) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < code_bytes; i += 32, out += 2 * stride) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_and_si256(raw, low4));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + stride), _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4));
  }
}

float prepare_float_acts(const FloatActArgs& a, int64_t m0, int64_t m1);
template <int BITS> void gemv_float(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
template <int BITS> void gemm_float(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

}  // namespace qlinear::avx2
