// Part of decoder_impl.h (included from it only, after decoder_impl_rowwise.h, once per copy):
// one token of a Gated DeltaNet layer (Qwen3.5's linear attention, decoder.h delta_token) or of
// a short convolution (LFM2's, short_conv_token), in
// one fixed order of float operations at every level. The loops over a state row's value
// columns are independent sums (each column accumulates over the key rows in order), which the
// compiler vectorizes without reordering anything.

namespace qlinear::decoder::QLINEAR_DECODER_IMPL {

namespace delta_detail {
// sum of squares in double, 8 lanes, in rms_norm's order
inline double sum_squares(const float* x, int64_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += double(x[i + j]) * x[i + j];
  double ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) ss += double(x[i]) * x[i];
  return ss;
}

inline float sigmoid(float x) { return 1.f / (1.f + exp_poly(-x)); }

// softplus(x) = log(1 + e^x), as torch's (x itself above 20)
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }
}  // namespace delta_detail

void delta_conv(const float* y, const DeltaShape& s, const DeltaWeights& w, float* conv_state, float* h) {
  const int64_t C = s.channels(), K = s.kernel;
  for (int64_t c = 0; c < C; ++c) {
    float acc = conv_state[c] * w.conv[c];
    for (int64_t j = 1; j < K - 1; ++j) acc += conv_state[j * C + c] * w.conv[j * C + c];
    acc += y[c] * w.conv[(K - 1) * C + c];
    h[c] = acc / (1.f + exp_poly(-acc));  // SiLU
  }
  for (int64_t j = 0; j + 1 < K - 1; ++j) std::memcpy(conv_state + j * C, conv_state + (j + 1) * C, C * sizeof(float));
  std::memcpy(conv_state + (K - 2) * C, y, C * sizeof(float));
  // q and k L2-normed per key head, q scaled by head_k ** -0.5
  const int64_t dk = s.k_dim;
  const float qscale = static_cast<float>(1.0 / std::sqrt(double(dk)));
  for (int64_t hd = 0; hd < 2 * s.k_heads; ++hd) {
    float* x = h + hd * dk;
    const float inv = static_cast<float>(1.0 / std::sqrt(delta_detail::sum_squares(x, dk) + 1e-6));
    const float f = hd < s.k_heads ? inv * qscale : inv;
    for (int64_t i = 0; i < dk; ++i) x[i] = x[i] * f;
  }
}

void delta_heads(const float* y, const float* h, const DeltaShape& s, const DeltaWeights& w, float* state,
                 int64_t h0, int64_t h1, float* out) {
  const int64_t C = s.channels(), dk = s.k_dim, dv = s.v_dim, nk = s.k_heads, nv = s.v_heads;
  const float* z = y + C;
  const float* b = z + nv * dv;
  const float* a = b + nv;
  float kv_mem[kMaxDeltaDim], delta[kMaxDeltaDim];
  for (int64_t hv = h0; hv < h1; ++hv) {
    const int64_t hk = s.tiled ? hv % nk : hv / (nv / nk);
    const float* q = h + hk * dk;
    const float* k = h + (nk + hk) * dk;
    const float* v = h + 2 * nk * dk + hv * dv;
    const float beta = delta_detail::sigmoid(b[hv]);
    const float decay = exp_poly(w.a[hv] * delta_detail::softplus(a[hv] + w.dt_bias[hv]));
    float* S = state + hv * dk * dv;
    // S <- decay S; kv_mem = k S
    for (int64_t j = 0; j < dv; ++j) kv_mem[j] = 0.f;
    for (int64_t i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      const float ki = k[i];
      for (int64_t j = 0; j < dv; ++j) {
        row[j] = row[j] * decay;
        kv_mem[j] += ki * row[j];
      }
    }
    for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - kv_mem[j]) * beta;
    // S <- S + k^T delta; o = q S
    float* o = out + hv * dv;
    for (int64_t j = 0; j < dv; ++j) o[j] = 0.f;
    for (int64_t i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      const float ki = k[i], qi = q[i];
      for (int64_t j = 0; j < dv; ++j) {
        row[j] = row[j] + ki * delta[j];
        o[j] += qi * row[j];
      }
    }
    // RMS-normed per head, times the norm's weight and silu(z)
    const float inv = static_cast<float>(1.0 / std::sqrt(delta_detail::sum_squares(o, dv) / double(dv) + s.eps));
    const float* zh = z + hv * dv;
    for (int64_t j = 0; j < dv; ++j) o[j] = o[j] * inv * w.norm[j] * (zh[j] / (1.f + exp_poly(-zh[j])));
  }
}

void short_conv_token(const float* y, int64_t n, int64_t kernel, const float* conv, float* conv_state, float* out) {
  const float *b = y, *c = y + n, *x = y + 2 * n;
  for (int64_t ch = 0; ch < n; ++ch) {
    const float bx = b[ch] * x[ch];
    float acc = conv_state[ch] * conv[ch];
    for (int64_t j = 1; j < kernel - 1; ++j) acc += conv_state[j * n + ch] * conv[j * n + ch];
    acc += bx * conv[(kernel - 1) * n + ch];
    out[ch] = c[ch] * acc;
  }
  for (int64_t j = 0; j + 1 < kernel - 1; ++j) std::memcpy(conv_state + j * n, conv_state + (j + 1) * n, n * sizeof(float));
  for (int64_t ch = 0; ch < n; ++ch) conv_state[(kernel - 2) * n + ch] = b[ch] * x[ch];
}

void sigmoid_mul(const float* gate, int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * (1.f / (1.f + exp_poly(-gate[i])));
}

}  // namespace qlinear::decoder::QLINEAR_DECODER_IMPL
