// Part of decoder_impl.h (included from it only, after decoder_impl_rowwise.h, once per copy):
// one token of a Gated DeltaNet layer (Qwen3.5's linear attention, decoder.h delta_token) or of
// a short convolution (LFM2's, short_conv_token), in
// one fixed order of float operations at every level. The loops over a state row's value
// columns are independent sums (each column accumulates over the key rows in order), which the
// compiler vectorizes without reordering anything.

namespace qlinear::decoder::QLINEAR_DECODER_IMPL {

namespace delta_detail {
inline float sigmoid(float x) { return 1.f / (1.f + exp_poly(-x)); }

// A decay e^x (x <= 0): 0 below e^-80 (exp_poly would give ~1e-38, whose products are subnormal
// numbers, each operation on them ~100x slower; a decay that small is 0 in every sum it enters)
inline float decay_exp(float x) { return x < -80.f ? 0.f : exp_poly(x); }

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
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(x, dk) + 1e-6));
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
    const float decay = delta_detail::decay_exp(w.a[hv] * delta_detail::softplus(a[hv] + w.dt_bias[hv]));
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
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(o, dv) / double(dv) + s.eps));
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

// The conv and norms of a prefill's rows: h [n, channels] as delta_conv gives them row by row
// (the conv over the cached inputs and the rows before), beta and the log decay g [n, v_heads].
void delta_prefill_inputs(const float* y, int64_t n, const DeltaShape& s, const DeltaWeights& w, float* conv_state,
                          float* h, float* beta, float* g) {
  const int64_t W = s.width(), C = s.channels(), nv = s.v_heads;
  for (int64_t t = 0; t < n; ++t) {
    const float* yt = y + t * W;
    delta_conv(yt, s, w, conv_state, h + t * C);
    const float* b = yt + C + nv * s.v_dim;
    const float* a = b + nv;
    for (int64_t hv = 0; hv < nv; ++hv) {
      beta[t * nv + hv] = delta_detail::sigmoid(b[hv]);
      g[t * nv + hv] = w.a[hv] * delta_detail::softplus(a[hv] + w.dt_bias[hv]);
    }
  }
}

// Value heads [h0, h1) of a prefill's n rows at positions start.. (delta_chunked): the chunked
// rule over chunks cut at multiples of kDeltaChunk of the absolute position, then the readout's
// gated norm. scratch: delta_chunk_scratch(s) floats.
void delta_prefill_heads(const float* y, const float* h, const float* beta, const float* g, int64_t n,
                         int64_t start, const DeltaShape& s, const DeltaWeights& w, float* state, int64_t h0,
                         int64_t h1, float* out, float* scratch) {
  const int64_t W = s.width(), C = s.channels(), dk = s.k_dim, dv = s.v_dim, nk = s.k_heads, nv = s.v_heads;
  constexpr int64_t L = kDeltaChunk;
  float* G = scratch;                // [L] cumulative log decay
  float* A = G + L;                  // [L, L]: beta_i k_i . k_j e^(G_i - G_j), j < i
  float* QK = A + L * L;             // [L, L]: q_i . k_j e^(G_i - G_j), j <= i
  float* U = QK + L * L;             // [L, dv]
  float* Wk = U + L * dv;            // [L, dk]
  float* qs = Wk + L * dk;           // [dv]
  float* kT = qs + dv;               // [dk, L]: the chunk's keys, transposed
  for (int64_t hv = h0; hv < h1; ++hv) {
    const int64_t hk = s.tiled ? hv % nk : hv / (nv / nk);
    float* S = state + hv * dk * dv;
    for (int64_t c0 = 0; c0 < n;) {
      const int64_t c1 = std::min(n, (start + c0) / L * L + L - start);
      const int64_t m = c1 - c0;
      const auto q = [&](int64_t i) { return h + (c0 + i) * C + hk * dk; };
      const auto k = [&](int64_t i) { return h + (c0 + i) * C + (nk + hk) * dk; };
      const auto v = [&](int64_t i) { return h + (c0 + i) * C + 2 * nk * dk + hv * dv; };
      float acc = 0.f;
      for (int64_t i = 0; i < m; ++i) G[i] = acc = acc + g[(c0 + i) * nv + hv];
      // k_i . k_j and q_i . k_j for j <= i, each summed over the key dimensions in order, the
      // j's side by side (the chunk's keys transposed: kT [dk, L]) so that the sums vectorize
      for (int64_t j = 0; j < m; ++j)
        for (int64_t x = 0; x < dk; ++x) kT[x * L + j] = k(j)[x];
      for (int64_t i = 0; i < m; ++i) {
        float* kk = A + i * L;
        float* qk = QK + i * L;
        for (int64_t j = 0; j <= i; ++j) kk[j] = qk[j] = 0.f;
        const float *ki = k(i), *qi = q(i);
        for (int64_t x = 0; x < dk; ++x) {
          const float kx = ki[x], qx = qi[x];
          const float* row = kT + x * L;
          for (int64_t j = 0; j <= i; ++j) {
            kk[j] += kx * row[j];
            qk[j] += qx * row[j];
          }
        }
        const float bi = beta[(c0 + i) * nv + hv];
        for (int64_t j = 0; j <= i; ++j) {
          const float decay = delta_detail::decay_exp(G[i] - G[j]);
          kk[j] = bi * kk[j] * decay;
          qk[j] = qk[j] * decay;
        }
      }
      // (I + strictly lower A) [U, Wk] = [beta v, beta e^G k]: forward substitution
      for (int64_t i = 0; i < m; ++i) {
        const float bi = beta[(c0 + i) * nv + hv], be = bi * delta_detail::decay_exp(G[i]);
        float* u = U + i * dv;
        float* wk = Wk + i * dk;
        const float *vi = v(i), *ki = k(i);
        for (int64_t x = 0; x < dv; ++x) u[x] = bi * vi[x];
        for (int64_t x = 0; x < dk; ++x) wk[x] = be * ki[x];
        for (int64_t j = 0; j < i; ++j) {
          const float a = A[i * L + j];
          const float *uj = U + j * dv, *wj = Wk + j * dk;
          for (int64_t x = 0; x < dv; ++x) u[x] = u[x] - a * uj[x];
          for (int64_t x = 0; x < dk; ++x) wk[x] = wk[x] - a * wj[x];
        }
      }
      // v' = U - Wk S (U becomes v'); out_i = e^(G_i) q_i S + sum_{j <= i} QK_ij v'_j
      for (int64_t i = 0; i < m; ++i) {
        float* u = U + i * dv;
        const float* wk = Wk + i * dk;
        for (int64_t r = 0; r < dk; ++r) {
          const float c = wk[r];
          const float* Sr = S + r * dv;
          for (int64_t x = 0; x < dv; ++x) u[x] = u[x] - c * Sr[x];
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* qi = q(i);
        for (int64_t x = 0; x < dv; ++x) qs[x] = 0.f;
        for (int64_t r = 0; r < dk; ++r) {
          const float c = qi[r];
          const float* Sr = S + r * dv;
          for (int64_t x = 0; x < dv; ++x) qs[x] += c * Sr[x];
        }
        const float eg = delta_detail::decay_exp(G[i]);
        float* o = out + (c0 + i) * nv * dv + hv * dv;
        for (int64_t x = 0; x < dv; ++x) o[x] = eg * qs[x];
        for (int64_t j = 0; j <= i; ++j) {
          const float c = QK[i * L + j];
          const float* uj = U + j * dv;
          for (int64_t x = 0; x < dv; ++x) o[x] += c * uj[x];
        }
      }
      // S <- e^(G_last) S + sum_j (e^(G_last - G_j) k_j)^T v'_j
      const float last = delta_detail::decay_exp(G[m - 1]);
      for (int64_t r = 0; r < dk; ++r) {
        float* Sr = S + r * dv;
        for (int64_t x = 0; x < dv; ++x) Sr[x] = Sr[x] * last;
        for (int64_t j = 0; j < m; ++j) {
          const float c = k(j)[r] * delta_detail::decay_exp(G[m - 1] - G[j]);
          const float* uj = U + j * dv;
          for (int64_t x = 0; x < dv; ++x) Sr[x] += c * uj[x];
        }
      }
      c0 = c1;
    }
    // the readouts RMS-normed per head, times the norm's weight and silu(z)
    for (int64_t t = 0; t < n; ++t) {
      float* o = out + t * nv * dv + hv * dv;
      const float* zh = y + t * W + C + hv * dv;
      const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(o, dv) / double(dv) + s.eps));
      for (int64_t x = 0; x < dv; ++x) o[x] = o[x] * inv * w.norm[x] * (zh[x] / (1.f + exp_poly(-zh[x])));
    }
  }
}

void sigmoid_mul(const float* gate, int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * (1.f / (1.f + exp_poly(-gate[i])));
}

}  // namespace qlinear::decoder::QLINEAR_DECODER_IMPL
