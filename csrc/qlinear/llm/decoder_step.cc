#include "qlinear/llm/decoder_step.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "qlinear/core/matmul.h"
#include "qlinear/llm/moe.h"

namespace qlinear::decoder {

DecodeStep::DecodeStep(StepModel m, std::vector<LayerCache> caches) : m_(std::move(m)), own_(std::move(caches)) {
  for (const StepLayer& L : m_.layers) {
    qkv_width_ = std::max(qkv_width_, L.qkv.w->n);
    att_width_ = std::max(att_width_, L.delta ? L.delta_shape.v_heads * L.delta_shape.v_dim
                                      : L.conv_kernel ? m_.hidden : m_.attn.heads * m_.attn.head_dim);
  }
  reserve(1);
}

// Buffers for b rows (they only grow: a batch's room serves the single steps after it).
void DecodeStep::reserve(int64_t b) {
  if (b <= rows_) return;
  const int64_t d = m_.attn.head_dim;
  h_.resize(b * m_.hidden);
  x_.resize(b * m_.hidden);
  qkv_.resize(b * std::max(qkv_width_, (m_.attn.heads + 2 * m_.attn.kv_heads) * d));
  att_.resize(b * std::max(att_width_, m_.attn.heads * d));
  proj_.resize(b * m_.hidden);
  gu_.resize(b * 2 * m_.intermediate);
  act_.resize(b * m_.intermediate);
  attend_.resize(b);
  round_.resize(b);
  round_of_.resize(b);
  rows_ = b;
}

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// The int8 path computes every row of a GEMM as its GEMV; the float path's GEMM sums in another
// order than its GEMV, so its rows run one at a time (a row's bits do not depend on the batch).
void DecodeStep::linear(const StepLinear& l, const float* x, int64_t b, float* y) {
  const double t0 = now();
  run_linear(l, x, b, y, true);
  matmul_ += now() - t0;
}

// The routed MLP (its time counted as the matmuls': the experts' GEMMs are nearly all of it).
void DecodeStep::moe(const MoeLayer& L, const float* x, int64_t b, float* y) {
  const double t0 = now();
  moe_mlp(L, x, b, y, moe_, true);
  matmul_ += now() - t0;
}

void DecodeStep::run(const float* h, int64_t pos, float* logits) {
  const StepRow row{pos, own_.data()};
  run(h, &row, 1, logits);
}

void DecodeStep::run_block(const float* h, int64_t pos, int64_t b, float* logits) {
  std::vector<StepRow> rows(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) rows[r] = {pos + r, own_.data()};
  run(h, rows.data(), b, logits);
}

void DecodeStep::run(const float* h, const StepRow* rows, int64_t b, float* logits) {
  std::lock_guard<std::mutex> lock(mutex_);
  const double t0 = now();
  matmul_ = 0;
  reserve(b);
  last_rows_ = b;
  forward(h, rows, b, logits);
  last_total_ = now() - t0;
  last_matmul_ = matmul_;
}

void DecodeStep::forward(const float* h_in, const StepRow* rows, int64_t b, float* logits) {
  const int64_t n = m_.hidden, d = m_.attn.head_dim, half = d / 2;
  const int64_t heads = m_.attn.heads, kv_heads = m_.attn.kv_heads, nqkv = (heads + 2 * kv_heads) * d;
  const int64_t natt = heads * d, vocab = m_.lm_head.w->n;
  float* h = h_.data();
  std::copy(h_in, h_in + b * n, h);
  int64_t rounds = 1;
  for (int64_t r = 0; r < b; ++r) {
    round_of_[r] = 0;
    for (int64_t q = 0; q < r; ++q) round_of_[r] += rows[q].caches == rows[r].caches;
    rounds = std::max(rounds, round_of_[r] + 1);
  }
  // out = rms_norm(out) when a norm is given; then h += out (b rows)
  const auto residual = [&](const float* norm, float* out) {
    if (norm) rms_norm(out, norm, m_.eps, b, n, out);
    for (int64_t i = 0; i < b * n; ++i) h[i] = h[i] + out[i];
  };
  for (size_t li = 0; li < m_.layers.size(); ++li) {
    const StepLayer& L = m_.layers[li];
    rms_norm(h, L.input_norm, m_.eps, b, n, x_.data());
    linear(L.qkv, x_.data(), b, qkv_.data());
    const int64_t wq = L.qkv.w->n;  // a row's projection: [q, k, v] (and a gate), or a delta layer's
    if (L.delta || L.conv_kernel) {
      // row after row: rows of one sequence in order of their positions, each over its state
      const int64_t out_width = L.delta ? L.delta_shape.v_heads * L.delta_shape.v_dim : n;
      for (int64_t r = 0; r < b; ++r) {
        const float* y = qkv_.data() + r * wq;
        const LayerCache& c = rows[r].caches[li];
        if (c.record) std::copy(y, y + wq, c.record + rows[r].pos % c.record_rows * wq);
        float* out = att_.data() + r * out_width;
        if (L.delta) delta_token(y, L.delta_shape, L.delta_weights, c.conv_state, c.state, out);
        else short_conv_token(y, n, L.conv_kernel, L.conv, c.conv_state, out);
      }
      linear(L.o, att_.data(), b, proj_.data());
      residual(L.attn_out_norm, proj_.data());
      rms_norm(h, L.post_norm, m_.eps, b, n, x_.data());
      mlp(L, b);
      residual(L.mlp_out_norm, proj_.data());
      continue;
    }
    for (int64_t r = 0; r < b; ++r) {
      float* qkv = qkv_.data() + r * wq;
      const int64_t pos = rows[r].pos;
      const LayerCache& c = rows[r].caches[li];
      if (L.q_norm) rms_norm(qkv, L.q_norm, m_.eps, heads, d, qkv);
      if (L.k_norm) rms_norm(qkv + heads * d, L.k_norm, m_.eps, kv_heads, d, qkv + heads * d);
      attend_[r] = {qkv, L.cos + pos * half, L.sin + pos * half, pos, c.capacity, c.k, c.v, att_.data() + r * natt};
    }
    AttentionShape sh = m_.attn;
    sh.sinks = L.sinks;
    if (rounds == 1) {
      attend_batch(attend_.data(), b, sh, m_.scale);
    } else {
      for (int64_t j = 0; j < rounds; ++j) {
        int64_t nr = 0;
        for (int64_t r = 0; r < b; ++r)
          if (round_of_[r] == j) round_[nr++] = attend_[r];
        attend_batch(round_.data(), nr, sh, m_.scale);
      }
    }
    if (L.gated)  // the heads' outputs times sigmoid(gate), the gate after q, k and v
      for (int64_t r = 0; r < b; ++r) sigmoid_mul(qkv_.data() + r * wq + nqkv, natt, att_.data() + r * natt);
    linear(L.o, att_.data(), b, proj_.data());
    residual(L.attn_out_norm, proj_.data());
    rms_norm(h, L.post_norm, m_.eps, b, n, x_.data());
    mlp(L, b);
    residual(L.mlp_out_norm, proj_.data());
  }
  rms_norm(h, m_.final_norm, m_.eps, b, n, x_.data());
  linear(m_.lm_head, x_.data(), b, logits);
  if (m_.final_softcap > 0.f)
    for (int64_t r = 0; r < b; ++r) softcap(logits + r * vocab, vocab, m_.final_softcap);
}

// The MLP of b rows: x_ -> proj_ (routed experts, or gate_up, the activation and down).
void DecodeStep::mlp(const StepLayer& L, int64_t b) {
  if (L.moe) {
    moe(*L.moe, x_.data(), b, proj_.data());
    return;
  }
  const int64_t inter = m_.intermediate;
  linear(L.gate_up, x_.data(), b, gu_.data());
  if (m_.gelu) gelu_tanh_mul_rows(gu_.data(), b, inter, act_.data());
  else silu_mul_rows(gu_.data(), b, inter, act_.data());
  linear(L.down, act_.data(), b, proj_.data());
}

void DecodeStep::run_matmuls(float* logits) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t b = last_rows_;
  for (const StepLayer& L : m_.layers) {
    linear(L.qkv, x_.data(), b, qkv_.data());
    linear(L.o, att_.data(), b, proj_.data());
    if (L.moe) {
      moe(*L.moe, x_.data(), b, proj_.data());
    } else {
      linear(L.gate_up, x_.data(), b, gu_.data());
      linear(L.down, act_.data(), b, proj_.data());
    }
  }
  linear(m_.lm_head, x_.data(), b, logits);
}

}  // namespace qlinear::decoder
