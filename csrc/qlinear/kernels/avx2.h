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

float prepare_float_acts(const FloatActArgs& a, int64_t m0, int64_t m1);
template <int BITS> void gemv_float(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
template <int BITS> void gemm_float(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

}  // namespace qlinear::avx2
