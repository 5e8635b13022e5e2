// Functions of the AVX2 level shared between its translation units (all compiled with
// -mavx2 -mfma -mf16c; call them only through the kernel table).
#pragma once

#include <immintrin.h>

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
