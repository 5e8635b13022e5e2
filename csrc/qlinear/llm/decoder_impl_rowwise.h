// Part of decoder_impl.h (included from it only, after its includes, once per copy): the
// row-wise operations, rms_norm, silu_mul / gelu_tanh_mul and softcap, and exp_poly, the
// vectorizable e^x they and the attention's softmax use.

namespace qlinear::decoder::QLINEAR_DECODER_IMPL {

// Sum of squares in double, 8 lanes (a fixed order the compiler may vectorize: one running sum is
// a chain of n dependent additions).
inline double sum_squares(const float* x, int64_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += double(x[i + j]) * x[i + j];
  double ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) ss += double(x[i]) * x[i];
  return ss;
}

void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t n, float* y) {
  for (int64_t r = 0; r < rows; ++r, x += n, y += n) {
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(x, n) / double(n) + eps));
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

}  // namespace qlinear::decoder::QLINEAR_DECODER_IMPL
