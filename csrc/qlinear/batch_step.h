// The decode step of several sequences at once (continuous batching in qlinear.llm.serve): one
// token of each of B sequences, every sequence at its own position over its own KV cache. The
// projections are one B-row matmul per weight (the weights are read once for all rows); norms,
// RoPE, attention, SiLU and residuals run row by row with the functions DecodeStep calls.
// Every row's logits are bit-identical to DecodeStep::run on that row alone: the int8-activation
// kernels compute each row of a GEMM exactly as the one-row GEMV (tests/test_serve.py checks
// both); float-activation projections run row by row.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "decoder_step.h"

namespace qlinear::decoder {

struct BatchRow {
  int64_t pos = 0;             // the token's position (< capacity)
  float* k_cache = nullptr;    // [layers, kv_heads, capacity, head_dim]: this sequence's cache
  float* v_cache = nullptr;
  int64_t capacity = 0;
};

class BatchStep {
 public:
  // The model of a DecodeStep; its layers' k_cache / v_cache are not used (each row brings its own).
  explicit BatchStep(StepModel m);

  // rows.size() tokens: h [B, hidden] their embeddings; writes logits [B, lm_head n] and fills
  // row b's cache at rows[b].pos in every layer.
  void run(const float* h, const std::vector<BatchRow>& rows, float* logits);

  const StepModel& model() const { return m_; }

 private:
  void linear(const StepLinear& l, const float* x, int64_t b, float* y);

  StepModel m_;
  std::mutex mutex_;  // one step at a time per object (the buffers below)
  std::vector<float> h_, x_, qkv_, att_, proj_, gu_, act_;
};

}  // namespace qlinear::decoder
