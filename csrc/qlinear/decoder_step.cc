#include "decoder_step.h"

#include <chrono>
#include <utility>

#include "matmul.h"

namespace qlinear::decoder {

DecodeStep::DecodeStep(StepModel m) : m_(std::move(m)) {
  const int64_t d = m_.attn.head_dim;
  h_.resize(m_.hidden);
  x_.resize(m_.hidden);
  qkv_.resize((m_.attn.heads + 2 * m_.attn.kv_heads) * d);
  att_.resize(m_.attn.heads * d);
  proj_.resize(m_.hidden);
  gu_.resize(2 * m_.intermediate);
  act_.resize(m_.intermediate);
}

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void DecodeStep::linear(const StepLinear& l, const float* x, float* y) {
  const double t0 = now();
  const MatmulRequest req{l.w, l.packed, x, DType::f32, 1, l.w->k, l.act_int8 ? l.act_block : l.w->k,
                          l.bias, y, l.w->n};
  if (l.act_int8) matmul_int8(req);
  else matmul_float(req);
  matmul_ += now() - t0;
}

void DecodeStep::run(const float* h_in, int64_t pos, float* logits) {
  std::lock_guard<std::mutex> lock(mutex_);
  const double t0 = now();
  matmul_ = 0;
  const int64_t n = m_.hidden, d = m_.attn.head_dim, half = d / 2;
  float* h = h_.data();
  std::copy(h_in, h_in + n, h);
  // out = rms_norm(out) when a norm is given; then h += out
  const auto residual = [&](const float* norm, float* out) {
    if (norm) rms_norm(out, norm, m_.eps, 1, n, out);
    for (int64_t i = 0; i < n; ++i) h[i] = h[i] + out[i];
  };
  for (const StepLayer& L : m_.layers) {
    AttentionShape sh = m_.attn;
    sh.capacity = L.capacity;
    rms_norm(h, L.input_norm, m_.eps, 1, n, x_.data());
    linear(L.qkv, x_.data(), qkv_.data());
    if (L.q_norm) rms_norm(qkv_.data(), L.q_norm, m_.eps, sh.heads, d, qkv_.data());
    if (L.k_norm) rms_norm(qkv_.data() + sh.heads * d, L.k_norm, m_.eps, sh.kv_heads, d, qkv_.data() + sh.heads * d);
    attend_one(qkv_.data(), L.cos + pos * half, L.sin + pos * half, pos, sh, m_.scale, L.k_cache,
               L.v_cache, att_.data());
    linear(L.o, att_.data(), proj_.data());
    residual(L.attn_out_norm, proj_.data());
    rms_norm(h, L.post_norm, m_.eps, 1, n, x_.data());
    linear(L.gate_up, x_.data(), gu_.data());
    if (m_.gelu) gelu_tanh_mul_row(gu_.data(), m_.intermediate, act_.data());
    else silu_mul_row(gu_.data(), m_.intermediate, act_.data());
    linear(L.down, act_.data(), proj_.data());
    residual(L.mlp_out_norm, proj_.data());
  }
  rms_norm(h, m_.final_norm, m_.eps, 1, n, x_.data());
  linear(m_.lm_head, x_.data(), logits);
  if (m_.final_softcap > 0.f) softcap(logits, m_.lm_head.w->n, m_.final_softcap);
  last_total_ = now() - t0;
  last_matmul_ = matmul_;
}

void DecodeStep::run_matmuls(float* logits) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const StepLayer& L : m_.layers) {
    linear(L.qkv, x_.data(), qkv_.data());
    linear(L.o, att_.data(), proj_.data());
    linear(L.gate_up, x_.data(), gu_.data());
    linear(L.down, act_.data(), proj_.data());
  }
  linear(m_.lm_head, x_.data(), logits);
}

}  // namespace qlinear::decoder
