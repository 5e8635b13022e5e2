// The decoder operations' code, compiled once per instruction set: decoder.cc includes it for
// the baseline target (NEON intrinsics on aarch64), decoder_avx2.cc for AVX2 (same source, same
// order of float operations and no contraction, so all give identical results; the intrinsics
// only compute the same sums faster). The AVX2 copy also serves the AVX-512 levels.
// QLINEAR_DECODER_IMPL names the namespace of each copy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common.h"
#include "decoder.h"

#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace qlinear::decoder::QLINEAR_DECODER_IMPL {

void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t n, float* y) {
  for (int64_t r = 0; r < rows; ++r, x += n, y += n) {
    // sum of squares in double, 8 lanes (a fixed order the compiler may vectorize: one running
    // sum is a chain of n dependent additions)
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) lane[j] += double(x[i + j]) * x[i + j];
    double ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < n; ++i) ss += double(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(n) + eps));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * weight[i];
  }
}

// e^x to ~2 ulp (Cephes' expf polynomial after x = n ln2 + r), written so that the compiler can
// vectorize a loop of it (std::exp is a library call per element): rounding by the 1.5 * 2^23
// trick, 2^n built in the exponent bits. Inputs are clamped to the finite range.
inline float exp_poly(float x) {
  x = std::min(88.3762626647949f, std::max(-87.3365447504f, x));
  const float shifter = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// silu_mul of one row over the columns [c0, c1) (gate = gu[:n], up = gu[n:2n]).
void silu_mul_cols(const float* gu, int64_t n, int64_t c0, int64_t c1, float* out) {
  for (int64_t i = c0; i < c1; ++i) out[i] = gu[i] / (1.f + exp_poly(-gu[i])) * gu[n + i];
}

void silu_mul(const float* gu, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r, gu += 2 * n, out += n)
    for (int64_t i = 0; i < n; ++i) out[i] = gu[i] / (1.f + exp_poly(-gu[i])) * gu[n + i];
}

inline float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x / (1.f + exp_poly(-2.f * u));
}

void gelu_tanh_mul_cols(const float* gu, int64_t n, int64_t c0, int64_t c1, float* out) {
  for (int64_t i = c0; i < c1; ++i) out[i] = gelu_tanh(gu[i]) * gu[n + i];
}

void gelu_tanh_mul(const float* gu, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r, gu += 2 * n, out += n) gelu_tanh_mul_cols(gu, n, 0, n, out);
}

// cap * tanh(x / cap), tanh(y) = 2 / (1 + e^-2y) - 1 (absolute error ~1e-7 cap)
void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * (2.f / (1.f + exp_poly(-2.f * (x[i] * inv))) - 1.f);
}

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

inline void rope(const float* in, const float* c, const float* s, int64_t d, float* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = in[i], x2 = in[half + i];
    out[i] = x1 * c[i] - x2 * s[i];
    out[half + i] = x2 * c[i] + x1 * s[i];
  }
}

// RoPE on this token's keys, keys and values into the caches at `pos`.
void store_kv(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
              const AttentionShape& sh, void* k_cache, void* v_cache) {
  const int64_t d = sh.head_dim;
  const float* k_in = qkv + sh.heads * d;
  const float* v_in = k_in + sh.kv_heads * d;
  const int64_t row = pos % sh.capacity;  // a ring once the positions pass the capacity
  for (int64_t g = 0; g < sh.kv_heads; ++g) {
    const int64_t at = (g * sh.capacity + row) * d;
    if (sh.kv_half) {
      float k[kMaxHeadDim];
      rope(k_in + g * d, cos_row, sin_row, d, k);
      floats_to_halves(k, d, static_cast<uint16_t*>(k_cache) + at);
      floats_to_halves(v_in + g * d, d, static_cast<uint16_t*>(v_cache) + at);
    } else {
      rope(k_in + g * d, cos_row, sin_row, d, static_cast<float*>(k_cache) + at);
      std::memcpy(static_cast<float*>(v_cache) + at, v_in + g * d, sizeof(float) * d);
    }
  }
}

// Query heads [h0, h1) over positions 0..pos. The heads that share a KV head are taken together
// (up to kAttendBatch at a time): every key and value row is read from memory once for all of
// them, which is what keeps a long context's attention at the cache's streaming speed. Each
// output's arithmetic is that of one head alone (the same dot products, sums and order).
// Half caches are read converted to float as they are loaded. scratch: kAttendBatch * (d +
// attend_scores_stride(pos)) floats.
template <class KV>
void attend_heads_t(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                    const AttentionShape& sh, float scale, const KV* k_cache, const KV* v_cache,
                    int64_t h0, int64_t h1, float* out, float* scratch) {
  const int64_t d = sh.head_dim, group = sh.heads / sh.kv_heads, n = std::min(pos + 1, sh.capacity);
  constexpr int64_t kRows = 64;  // value rows per pass over the heads (16 KiB at d = 64: L1)
  float* q = scratch;                   // [kAttendBatch, d]
  float* p = scratch + kAttendBatch * d;  // [kAttendBatch, ldp]
  const int64_t ldp = attend_scores_stride(n - 1);
  bool bad[kAttendBatch];
  for (int64_t hb = h0; hb < h1;) {
    const int64_t g = hb / group;
    const int64_t he = std::min({h1, (g + 1) * group, hb + kAttendBatch}), nq = he - hb;
    const KV* kc = k_cache + g * sh.capacity * d;
    const KV* vc = v_cache + g * sh.capacity * d;
    for (int64_t j = 0; j < nq; ++j) {
      float* qj = q + j * d;
      rope(qkv + (hb + j) * d, cos_row, sin_row, d, qj);
      for (int64_t i = 0; i < d; ++i) qj[i] *= scale;
    }
    int64_t t = 0;
    if (d % 8 == 0)
      for (; t + 8 <= n; t += 8)  // 8 keys (2 KiB at d = 64) in L1 for all the heads
        for (int64_t j = 0; j < nq; ++j) dot8(q + j * d, kc + t * d, d, p + j * ldp + t);
    for (; t < n; ++t)
      for (int64_t j = 0; j < nq; ++j) p[j * ldp + t] = dot(q + j * d, kc + t * d, d);
    for (int64_t j = 0; j < nq; ++j) {
      float* pj = p + j * ldp;
      if (sh.softcap > 0.f) softcap(pj, n, sh.softcap);
      bool nan = false;
      const float top = max_of(pj, n, &nan);
      float* o = out + (hb + j) * d;
      bad[j] = nan || std::isinf(top);
      if (bad[j]) {  // NaN / Inf in q or k: the result is NaN, as in float math
        std::fill(o, o + d, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      for (int64_t i = 0; i < n; ++i) pj[i] = exp_poly(pj[i] - top);
      const float total = sum_of(pj, n);
      for (int64_t i = 0; i < n; ++i) pj[i] = pj[i] / total;
      std::fill(o, o + d, 0.f);
    }
    for (int64_t t0 = 0; t0 < n; t0 += kRows) {  // a block of value rows in L1 for all the heads
      const int64_t t1 = std::min(n, t0 + kRows);
      for (int64_t j = 0; j < nq; ++j)
        if (!bad[j]) add_rows(p + j * ldp + t0, vc + t0 * d, t1 - t0, d, out + (hb + j) * d);
    }
    hb = he;
  }
}

// f(k, v) with the caches as the element type they hold (sh.kv_half: IEEE half, else float).
template <class F>
inline void with_kv_type(const AttentionShape& sh, const void* k_cache, const void* v_cache, F&& f) {
  if (sh.kv_half) f(static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache));
  else f(static_cast<const float*>(k_cache), static_cast<const float*>(v_cache));
}

void attend_heads(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                  const AttentionShape& sh, float scale, const void* k_cache, const void* v_cache,
                  int64_t h0, int64_t h1, float* out, float* scratch) {
  with_kv_type(sh, k_cache, v_cache, [&](const auto* k, const auto* v) {
    attend_heads_t(qkv, cos_row, sin_row, pos, sh, scale, k, v, h0, h1, out, scratch);
  });
}

// -- prefill: causal attention of many query rows, keys in blocks with an online softmax --------

// s[r][t] = q[r] . k[t] for `rows` query rows and the `nk` <= kKeyBlock keys of a block, through
// the block transposed (kt [d][kKeyBlock]): products accumulated along the keys, the vector
// lanes over keys, no horizontal sums.
template <int64_t D, class KV>
void block_scores(const float* q, int64_t rows, const KV* k, int64_t nk, int64_t d_rt, float* kt, float* s) {
  const int64_t d = D ? D : d_rt;
  for (int64_t t = 0; t < nk; ++t)
    for (int64_t i = 0; i < d; ++i) kt[i * kKeyBlock + t] = kv_float(k[t * d + i]);
  for (int64_t t = nk; t < kKeyBlock; ++t)
    for (int64_t i = 0; i < d; ++i) kt[i * kKeyBlock + t] = 0.f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* qr = q + r * d;
    float* sr = s + r * kKeyBlock;
#if defined(__AVX2__) || defined(__aarch64__)
    constexpr int kNV = kKeyBlock / kVecF;  // the row's scores in registers
    VecF acc[kNV];
    for (int j = 0; j < kNV; ++j) acc[j] = vbroadcast(0.f);
    for (int64_t i = 0; i < d; ++i) {
      const VecF x = vbroadcast(qr[i]);
      const float* kr = kt + i * kKeyBlock;
      for (int j = 0; j < kNV; ++j) acc[j] = vmuladd(acc[j], x, vload(kr + j * kVecF));
    }
    for (int j = 0; j < kNV; ++j) vstore(sr + j * kVecF, acc[j]);
#else
    for (int64_t t = 0; t < kKeyBlock; ++t) sr[t] = 0.f;
    for (int64_t i = 0; i < d; ++i) {
      const float x = qr[i];
      const float* kr = kt + i * kKeyBlock;
      for (int64_t t = 0; t < kKeyBlock; ++t) sr[t] += x * kr[t];
    }
#endif
  }
}

// acc[r] = acc[r] * alpha[r] + sum_t p[r][t] v[t] over the block's first nk[r] keys.
template <int64_t D, class KV>
void block_values(const float* p, const int64_t* nk, const float* alpha, int64_t rows, const KV* v,
                  int64_t d_rt, float* acc) {
  const int64_t d = D ? D : d_rt;
  for (int64_t r = 0; r < rows; ++r) {
    float* ar = acc + r * d;
    for (int64_t i = 0; i < d; ++i) ar[i] = ar[i] * alpha[r];
    add_rows(p + r * kKeyBlock, v, nk[r], d, ar);
  }
}

template <int64_t D, class KV>
void attend_rows_d(const float* q, int64_t ldq, int64_t start, const AttentionShape& sh,
                   const KV* k_cache, const KV* v_cache, int64_t h, int64_t r0, int64_t r1,
                   float* out, int64_t ldo, float* scratch) {
  const int64_t d = sh.head_dim, rows = r1 - r0, g = h / (sh.heads / sh.kv_heads);
  const KV* kc = k_cache + g * sh.capacity * d;
  const KV* vc = v_cache + g * sh.capacity * d;
  float* qs = scratch;                        // [rows, d]
  float* kt = qs + kPrefillRows * d;          // [d, kKeyBlock]
  float* s = kt + d * kKeyBlock;              // [rows, kKeyBlock]
  float* acc = s + kPrefillRows * kKeyBlock;  // [rows, d]
  float m[kPrefillRows], l[kPrefillRows], alpha[kPrefillRows];
  int64_t nk[kPrefillRows];
  bool bad[kPrefillRows];
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(qs + r * d, q + (r0 + r) * ldq + h * d, sizeof(float) * d);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.f;
    bad[r] = false;
  }
  std::fill(acc, acc + rows * d, 0.f);
  const int64_t last = start + r1;  // keys [0, last) are seen by some row of the block
  // row r (position p = start + r0 + r) sees keys [first(p), p]
  const auto first = [&](int64_t p) { return sh.window > 0 ? std::max<int64_t>(0, p - sh.window + 1) : 0; };
  for (int64_t t0 = first(start + r0) / kKeyBlock * kKeyBlock; t0 < last; t0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, last - t0);
    block_scores<D>(qs, rows, kc + t0 * d, kb, d, kt, s);
    for (int64_t r = 0; r < rows; ++r) {
      nk[r] = std::max<int64_t>(0, std::min(kb, start + r0 + r + 1 - t0));
      const int64_t lo = std::min(nk[r], std::max<int64_t>(0, first(start + r0 + r) - t0));
      float* sr = s + r * kKeyBlock;
      if (nk[r] > lo && sh.softcap > 0.f) softcap(sr + lo, nk[r] - lo, sh.softcap);
      bool nan = false;
      const float top = nk[r] > lo ? std::max(m[r], max_of(sr + lo, nk[r] - lo, &nan)) : m[r];
      bad[r] = bad[r] || (nk[r] > lo && (nan || std::isinf(top)));
      if (bad[r] || nk[r] == lo) {
        nk[r] = 0;
        alpha[r] = 1.f;
        continue;
      }
      alpha[r] = exp_poly(m[r] - top);  // 0 on the first block (m = -inf, clamped)
      std::fill(sr, sr + lo, 0.f);  // keys before the window weigh nothing
      for (int64_t t = lo; t < nk[r]; ++t) sr[t] = exp_poly(sr[t] - top);
      float sum = 0.f;
      for (int64_t t = lo; t < nk[r]; ++t) sum += sr[t];
      l[r] = l[r] * alpha[r] + sum;
      m[r] = top;
    }
    block_values<D>(s, nk, alpha, rows, vc + t0 * d, d, acc);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + (r0 + r) * ldo + h * d;
    if (bad[r]) {
      std::fill(o, o + d, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const float inv = 1.f / l[r];
    for (int64_t i = 0; i < d; ++i) o[i] = acc[r * d + i] * inv;
  }
}

// Query rows [r0, r1) (r1 - r0 <= kPrefillRows) of head h; q: RoPE'd and scaled queries
// [rows, ldq] (head h at column h * d), row r at position start + r; out [rows, ldo].
// scratch: prefill_scratch_floats(d) floats.
void attend_rows(const float* q, int64_t ldq, int64_t start, const AttentionShape& sh,
                 const void* k_cache, const void* v_cache, int64_t h, int64_t r0, int64_t r1,
                 float* out, int64_t ldo, float* scratch) {
  with_kv_type(sh, k_cache, v_cache, [&](const auto* k, const auto* v) {
    if (sh.head_dim == 64)
      attend_rows_d<64>(q, ldq, start, sh, k, v, h, r0, r1, out, ldo, scratch);
    else if (sh.head_dim == 128)
      attend_rows_d<128>(q, ldq, start, sh, k, v, h, r0, r1, out, ldo, scratch);
    else
      attend_rows_d<0>(q, ldq, start, sh, k, v, h, r0, r1, out, ldo, scratch);
  });
}

// RoPE on query row r's heads (position start + r) times `scale`, into q [rows, heads * d].
void rope_queries(const float* qkv, int64_t ldqkv, const float* cos, const float* sin, int64_t start,
                  const AttentionShape& sh, float scale, int64_t r0, int64_t r1, float* q) {
  const int64_t d = sh.head_dim, half = d / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* c = cos + (start + r) * half;
    const float* s = sin + (start + r) * half;
    for (int64_t h = 0; h < sh.heads; ++h) {
      float* qh = q + r * sh.heads * d + h * d;
      rope(qkv + r * ldqkv + h * d, c, s, d, qh);
      for (int64_t i = 0; i < d; ++i) qh[i] *= scale;
    }
  }
}
}  // namespace qlinear::decoder::QLINEAR_DECODER_IMPL
