#include "batch_step.h"

#include <algorithm>
#include <utility>

#include "matmul.h"

namespace qlinear::decoder {

BatchStep::BatchStep(StepModel m) : m_(std::move(m)) {}

// The int8 path computes every row of a GEMM as its GEMV; the float path's GEMM sums in another
// order than its GEMV, so its rows run one at a time (invariance before speed).
void BatchStep::linear(const StepLinear& l, const float* x, int64_t b, float* y) {
  if (l.act_int8) {
    matmul_int8(MatmulRequest{l.w, l.packed, x, DType::f32, b, l.w->k, l.act_block, l.bias, y, l.w->n});
    return;
  }
  for (int64_t r = 0; r < b; ++r)
    matmul_float(MatmulRequest{l.w, l.packed, x + r * l.w->k, DType::f32, 1, l.w->k, l.w->k, l.bias,
                               y + r * l.w->n, l.w->n});
}

void BatchStep::run(const float* h_in, const std::vector<BatchRow>& rows, float* logits) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t b = static_cast<int64_t>(rows.size()), n = m_.hidden, d = m_.attn.head_dim, half = d / 2;
  const int64_t nqkv = (m_.attn.heads + 2 * m_.attn.kv_heads) * d, natt = m_.attn.heads * d;
  const int64_t inter = m_.intermediate, layer_size = m_.attn.kv_heads * d;  // x capacity: one layer
  h_.assign(h_in, h_in + b * n);
  x_.resize(b * n), qkv_.resize(b * nqkv), att_.resize(b * natt), proj_.resize(b * n);
  gu_.resize(b * 2 * inter), act_.resize(b * inter);
  float* h = h_.data();
  for (size_t li = 0; li < m_.layers.size(); ++li) {
    const StepLayer& L = m_.layers[li];
    rms_norm(h, L.input_norm, m_.eps, b, n, x_.data());
    linear(L.qkv, x_.data(), b, qkv_.data());
    for (int64_t r = 0; r < b; ++r) {
      const BatchRow& row = rows[r];
      AttentionShape sh = m_.attn;
      sh.capacity = row.capacity;
      const int64_t offset = static_cast<int64_t>(li) * layer_size * row.capacity;
      attend_one(qkv_.data() + r * nqkv, m_.cos + row.pos * half, m_.sin + row.pos * half, row.pos, sh,
                 m_.scale, row.k_cache + offset, row.v_cache + offset, att_.data() + r * natt);
    }
    linear(L.o, att_.data(), b, proj_.data());
    for (int64_t i = 0; i < b * n; ++i) h[i] = h[i] + proj_[i];
    rms_norm(h, L.post_norm, m_.eps, b, n, x_.data());
    linear(L.gate_up, x_.data(), b, gu_.data());
    for (int64_t r = 0; r < b; ++r) silu_mul_row(gu_.data() + r * 2 * inter, inter, act_.data() + r * inter);
    linear(L.down, act_.data(), b, proj_.data());
    for (int64_t i = 0; i < b * n; ++i) h[i] = h[i] + proj_[i];
  }
  rms_norm(h, m_.final_norm, m_.eps, b, n, x_.data());
  linear(m_.lm_head, x_.data(), b, logits);
}

}  // namespace qlinear::decoder
