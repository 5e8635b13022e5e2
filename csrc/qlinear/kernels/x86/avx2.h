// Functions of the AVX2 level shared between its translation units (all compiled with
// -mavx2 -mfma -mf16c; call them only through the kernel table).
#pragma once

#include <immintrin.h>

#include <vector>

#include "qlinear/core/kernels.h"

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

// The low-memory float path (avx2_float.cc), also the float path of the levels above AVX2.
float prepare_float_acts(const FloatActArgs& a, int64_t m0, int64_t m1);
std::vector<FloatUkernel> float_ukernels();

}  // namespace qlinear::avx2
