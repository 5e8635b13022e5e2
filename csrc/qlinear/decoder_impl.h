// The decoder operations' code, compiled once per instruction set: decoder.cc includes it for
// the baseline target, decoder_avx2.cc for AVX2 (same source, same order of float operations
// and no contraction, so both give identical results; the wider one only runs faster).
// QLINEAR_DECODER_IMPL names the namespace of each copy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "decoder.h"

namespace qlinear::decoder::QLINEAR_DECODER_IMPL {

void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t n, float* y) {
  for (int64_t r = 0; r < rows; ++r, x += n, y += n) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
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

void silu_mul(const float* gu, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r, gu += 2 * n, out += n)
    for (int64_t i = 0; i < n; ++i) out[i] = gu[i] / (1.f + exp_poly(-gu[i])) * gu[n + i];
}

// Dot product in 8 independent lanes (a fixed order, so the compiler may vectorize it without
// reassociating a single running sum), then the lanes added up.
inline float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
  float total = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
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
              const AttentionShape& sh, float* k_cache, float* v_cache) {
  const int64_t d = sh.head_dim;
  const float* k_in = qkv + sh.heads * d;
  const float* v_in = k_in + sh.kv_heads * d;
  for (int64_t g = 0; g < sh.kv_heads; ++g) {
    rope(k_in + g * d, cos_row, sin_row, d, k_cache + (g * sh.capacity + pos) * d);
    std::memcpy(v_cache + (g * sh.capacity + pos) * d, v_in + g * d, sizeof(float) * d);
  }
}

// Query heads [h0, h1) over positions 0..pos; scratch: pos + 1 floats.
void attend_heads(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                  const AttentionShape& sh, float scale, const float* k_cache, const float* v_cache,
                  int64_t h0, int64_t h1, float* out, float* scratch) {
  const int64_t d = sh.head_dim, group = sh.heads / sh.kv_heads;
  float q[512];
  for (int64_t h = h0; h < h1; ++h) {
    const int64_t g = h / group;
    const float* kc = k_cache + g * sh.capacity * d;
    const float* vc = v_cache + g * sh.capacity * d;
    rope(qkv + h * d, cos_row, sin_row, d, q);
    for (int64_t i = 0; i < d; ++i) q[i] *= scale;
    float top = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (int64_t t = 0; t <= pos; ++t) {
      scratch[t] = dot(q, kc + t * d, d);
      nan |= std::isnan(scratch[t]);
      top = std::max(top, scratch[t]);
    }
    float* o = out + h * d;
    if (nan || std::isinf(top)) {  // NaN / Inf in q or k: the result is NaN, as in float math
      std::fill(o, o + d, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    float total = 0.f;
    for (int64_t t = 0; t <= pos; ++t) scratch[t] = exp_poly(scratch[t] - top);
    for (int64_t t = 0; t <= pos; ++t) total += scratch[t];
    std::fill(o, o + d, 0.f);
    for (int64_t t = 0; t <= pos; ++t) {
      const float p = scratch[t] / total;
      for (int64_t i = 0; i < d; ++i) o[i] += p * vc[t * d + i];
    }
  }
}
}  // namespace qlinear::decoder::QLINEAR_DECODER_IMPL
