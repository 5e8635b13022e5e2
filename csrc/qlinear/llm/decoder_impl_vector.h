// Part of decoder_impl.h (included from it only, after decoder_impl_rowwise.h, once per copy):
// the attention's vector primitives over float or half KV caches, each in one fixed order of
// float operations at every level: dot products (dot, dot8), weighted sums of value rows
// (add_rows), max_of, sum_of, and floats_to_halves.

namespace qlinear::decoder::QLINEAR_DECODER_IMPL {

// A cached key or value as float: a float cache's own, a half cache's converted (exactly).
inline float kv_float(float x) { return x; }
inline float kv_float(uint16_t h) { return half_to_float(h); }

// Dot product in 8 lanes (lane j: the products i = j mod 8, in order of i), the lanes added as
// ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) (the order of the vector reduction in dot8), then
// the products past the last multiple of 8, in order.
template <class KV>
inline float dot(const float* a, const KV* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * kv_float(b[i + j]);
  float total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) total += a[i] * kv_float(b[i]);
  return total;
}

#if defined(__AVX2__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#elif defined(__aarch64__)
inline float32x4_t load4(const float* p) { return vld1q_f32(p); }
inline float32x4_t load4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
#endif

// s[t] = dot(q, k + t * d, d) for 8 consecutive rows of k, d a multiple of 8: the same sums in
// the same order as dot, the 8 rows' lanes reduced together (no horizontal sum per row).
template <class KV>
inline void dot8(const float* q, const KV* k, int64_t d, float* s) {
#if defined(__AVX2__)
  __m256 acc[8];
  for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int t = 0; t < 8; ++t) acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(qv, load8(k + t * d + i)));
  }
  // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  // h0 = [(0+1)+(2+3) of rows 0..3 | (4+5)+(6+7) of rows 0..3], h1 the same for rows 4..7
  _mm256_storeu_ps(s, _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31)));
#elif defined(__aarch64__)
  float32x4_t lo[8], hi[8];
  for (int t = 0; t < 8; ++t) lo[t] = hi[t] = vdupq_n_f32(0.f);
  for (int64_t i = 0; i < d; i += 8) {
    const float32x4_t ql = vld1q_f32(q + i), qh = vld1q_f32(q + i + 4);
    for (int t = 0; t < 8; ++t) {
      lo[t] = vaddq_f32(lo[t], vmulq_f32(ql, load4(k + t * d + i)));
      hi[t] = vaddq_f32(hi[t], vmulq_f32(qh, load4(k + t * d + i + 4)));
    }
  }
  // vpaddq(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3]
  for (int t = 0; t < 8; t += 4) {
    const float32x4_t l = vpaddq_f32(vpaddq_f32(lo[t], lo[t + 1]), vpaddq_f32(lo[t + 2], lo[t + 3]));
    const float32x4_t h = vpaddq_f32(vpaddq_f32(hi[t], hi[t + 1]), vpaddq_f32(hi[t + 2], hi[t + 3]));
    vst1q_f32(s + t, vaddq_f32(l, h));
  }
#else
  for (int t = 0; t < 8; ++t) s[t] = dot(q, k + t * d, d);
#endif
}

// y[j] = dot(x, w + j * k, k) for the n rows of w [n, k] (a MoE router's logits): dot8 over 8
// rows at a time when k is a multiple of 8 (the same bits as dot), the rest by dot.
void dot_rows(const float* x, const float* w, int64_t n, int64_t k, float* y) {
  int64_t j = 0;
  if (k % 8 == 0)
    for (; j + 8 <= n; j += 8) dot8(x, w + j * k, k, y + j);
  for (; j < n; ++j) y[j] = dot(x, w + j * k, k);
}

// o[i] += p[t] * v[t * d + i] for t = 0..rows-1 in order, i < d.
#if defined(__AVX2__) || defined(__aarch64__)
#if defined(__AVX2__)
using VecF = __m256;
constexpr int64_t kVecF = 8;
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline VecF vload(const uint16_t* p) { return load8(p); }
inline void vstore(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF vmuladd(VecF acc, VecF a, VecF b) { return _mm256_add_ps(acc, _mm256_mul_ps(a, b)); }
inline VecF vbroadcast(float x) { return _mm256_set1_ps(x); }
#else
using VecF = float32x4_t;
constexpr int64_t kVecF = 4;
inline VecF vload(const float* p) { return vld1q_f32(p); }
inline VecF vload(const uint16_t* p) { return load4(p); }
inline void vstore(float* p, VecF v) { vst1q_f32(p, v); }
inline VecF vmuladd(VecF acc, VecF a, VecF b) { return vaddq_f32(acc, vmulq_f32(a, b)); }
inline VecF vbroadcast(float x) { return vdupq_n_f32(x); }
#endif
// NV vectors of o kept in registers over all the rows.
template <int NV, class KV>
inline void add_rows_v(const float* p, const KV* v, int64_t rows, int64_t d, float* o) {
  VecF acc[NV];
  for (int j = 0; j < NV; ++j) acc[j] = vload(o + j * kVecF);
  for (int64_t t = 0; t < rows; ++t) {
    const VecF pt = vbroadcast(p[t]);
    for (int j = 0; j < NV; ++j) acc[j] = vmuladd(acc[j], pt, vload(v + t * d + j * kVecF));
  }
  for (int j = 0; j < NV; ++j) vstore(o + j * kVecF, acc[j]);
}
#endif

template <class KV>
inline void add_rows(const float* p, const KV* v, int64_t rows, int64_t d, float* o) {
  int64_t i = 0;
#if defined(__AVX2__) || defined(__aarch64__)
  for (; i + 8 * kVecF <= d; i += 8 * kVecF) add_rows_v<8>(p, v + i, rows, d, o + i);
  for (; i + 2 * kVecF <= d; i += 2 * kVecF) add_rows_v<2>(p, v + i, rows, d, o + i);
  for (; i + kVecF <= d; i += kVecF) add_rows_v<1>(p, v + i, rows, d, o + i);
#endif
  if (i == d) return;
  for (int64_t t = 0; t < rows; ++t) {
    const float pt = p[t];
    const KV* vt = v + t * d;
    for (int64_t j = i; j < d; ++j) o[j] += pt * kv_float(vt[j]);
  }
}

// The largest of s[0..n) (-inf if n == 0); *nan tells whether one was NaN. (The maximum does
// not depend on the order of the comparisons.)
inline float max_of(const float* s, int64_t n, bool* nan) {
  int64_t t = 0;
  float top = -std::numeric_limits<float>::infinity();
  bool any_nan = false;
#if defined(__AVX2__)
  __m256 m = _mm256_set1_ps(top), bad = _mm256_setzero_ps();
  for (; t + 8 <= n; t += 8) {
    const __m256 x = _mm256_loadu_ps(s + t);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, x);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  for (float x : lanes) top = std::max(top, x);
  any_nan = _mm256_movemask_ps(bad) != 0;
#elif defined(__aarch64__)
  float32x4_t m = vdupq_n_f32(top);
  uint32x4_t ok = vdupq_n_u32(~0u);
  for (; t + 4 <= n; t += 4) {
    const float32x4_t x = vld1q_f32(s + t);
    ok = vandq_u32(ok, vceqq_f32(x, x));
    m = vmaxq_f32(m, x);
  }
  top = std::max(top, vmaxvq_f32(m));
  any_nan = vminvq_u32(ok) == 0;
#endif
  for (; t < n; ++t) {
    any_nan |= std::isnan(s[t]);
    top = std::max(top, s[t]);
  }
  *nan = any_nan;
  return top;
}

// The sum of s[0..n) in 8 lanes (lane j: t = j mod 8, in order), reduced as dot's lanes, then
// the rest in order: a fixed order, which the compiler may vectorize.
inline float sum_of(const float* s, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int j = 0; j < 8; ++j) lane[j] += s[t + j];
  float total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; t < n; ++t) total += s[t];
  return total;
}

// float -> IEEE half for the half KV caches, rounded to nearest even as common.h's
// float_to_half (F16C / NEON conversions give the same bits).
inline void floats_to_halves(const float* f, int64_t n, uint16_t* h) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__aarch64__)
  for (; i + 4 <= n; i += 4) vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(f + i))));
#endif
  for (; i < n; ++i) h[i] = float_to_half(f[i]);
}

}  // namespace qlinear::decoder::QLINEAR_DECODER_IMPL
