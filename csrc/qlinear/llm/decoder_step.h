// The decode step of a whole model in one call: for each layer, RMSNorm, the fused QKV
// projection, RoPE and attention over the KV cache, the output projection and residual, RMSNorm,
// the fused gate/up projection, SiLU * up, the down projection and residual (or the routed
// experts' MLP: moe.h); then the final norm
// and the lm head. The caller (qlinear.llm) keeps the embedding lookup and sampling.
// Per layer, as the architectures need them: RMSNorm of each query and key head before RoPE
// (Qwen3, Gemma 3), RMSNorms of the attention's and the MLP's outputs before their residuals
// (Gemma 2 / 3), the layer's own RoPE tables and cache (a sliding window's cache: `window` rows
// used as a ring), attention sinks (GPT-OSS), the attention's output gated (Qwen3.5), or a Gated DeltaNet layer instead of
// attention (decoder.h delta_token over the sequence's states, its input rows recorded for a
// rollback). Per model: GELU-tanh instead of SiLU, soft-capped attention scores and logits.
//
// A DecodeStep holds pointers only (to packed weights, norms, biases, RoPE tables and the KV
// cache): whoever builds it keeps those alive, and it does exactly the operations of the
// per-layer Python path, in its order (the same drivers, the same float operations), so both
// give the same logits.
//
// One implementation serves one sequence and several (continuous batching in qlinear.llm.serve):
// B tokens, each of its own sequence at its own position over that sequence's caches. The
// projections are one B-row matmul per weight (the weights read once for all rows); norms, RoPE,
// attention, the MLP's activation, residuals and soft-caps run row by row. The int8-activation
// kernels compute each row of a GEMM exactly as the one-row GEMV, and float-activation
// projections run row by row (their GEMM sums in another order), so every row's logits are
// bit-identical to the step of that sequence alone; one sequence is the case B = 1.
//
// Several rows may belong to one sequence (a speculative verification: the token last decided and
// the drafted ones): they share its caches and stand at consecutive positions, in order. Their
// attention runs in rounds (round j: the j-th row of every sequence), so each row sees the keys
// and values of the rows before it, and computes what the one-token step at its position would.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "qlinear/llm/decoder.h"
#include "qlinear/core/layout.h"
#include "qlinear/llm/moe.h"

namespace qlinear::decoder {

struct StepLayer {
  // qkv, o: the attention's projections, or a Gated DeltaNet's (`delta`: its input projection
  // [width] and its output projection); gate_up and down unset in a layer of routed experts
  StepLinear qkv, o, gate_up, down;
  bool delta = false;                // a Gated DeltaNet layer (decoder.h delta_token): no KV cache
  DeltaShape delta_shape{};
  DeltaWeights delta_weights{};
  bool gated = false;                // attention whose output is gated: qkv = [q, k, v, gate]
  int64_t conv_kernel = 0;           // a short convolution layer (LFM2, decoder.h short_conv_token)
  const float* conv = nullptr;       // its taps [conv_kernel, hidden]
  const MoeLayer* moe = nullptr;     // routed experts (moe.h) instead of gate_up / down
  const float* input_norm = nullptr;     // [hidden]
  const float* post_norm = nullptr;      // [hidden]
  const float* q_norm = nullptr;         // [head_dim] or nullptr
  const float* k_norm = nullptr;         // [head_dim] or nullptr
  const float* sinks = nullptr;          // [heads] or nullptr (AttentionShape::sinks)
  const float* attn_out_norm = nullptr;  // [hidden] or nullptr
  const float* mlp_out_norm = nullptr;   // [hidden] or nullptr
  const float* cos = nullptr;            // [rope_rows, head_dim / 2]
  const float* sin = nullptr;
};

// One layer's cache of one sequence: [kv_heads, capacity, head_dim] keys and values; shorter than
// the sequence's context, a sliding window's ring.
struct LayerCache {
  void* k = nullptr;  // float, or IEEE half (StepModel::attn.kv_half)
  void* v = nullptr;
  int64_t capacity = 0;
  // A Gated DeltaNet or short conv layer's instead: its states (delta_token's conv_state and
  // state; short_conv_token's conv_state) and the record of its input rows, row pos % record_rows
  // for position pos (a rollback replays them)
  float* conv_state = nullptr;
  float* state = nullptr;
  float* record = nullptr;
  int64_t record_rows = 0;
};

// One token of a batch: its position and its sequence's caches (one per layer).
struct StepRow {
  int64_t pos = 0;
  const LayerCache* caches = nullptr;
};

struct StepModel {
  int64_t hidden = 0, intermediate = 0;
  AttentionShape attn{};  // capacity: the context (the largest layer cache)
  float eps = 0.f, scale = 0.f;
  bool gelu = false;          // GELU-tanh * up instead of SiLU * up
  float final_softcap = 0.f;  // logits soft-capped (0: not)
  int64_t rope_rows = 0;      // rows of every layer's RoPE tables (at least)
  std::vector<StepLayer> layers;
  const float* final_norm = nullptr;  // [hidden]
  StepLinear lm_head;
};

class DecodeStep {
 public:
  // `caches`: the step's own sequence's, one per layer (`run` with a position fills them).
  DecodeStep(StepModel m, std::vector<LayerCache> caches);

  // One token of the own sequence at position `pos` (< capacity and < rope_rows): h = its
  // embedding [hidden]; writes the logits [lm_head n]. Fills the caches' row `pos` of every layer.
  void run(const float* h, int64_t pos, float* logits);

  // `b` tokens: h [b, hidden] their embeddings; writes logits [b, lm_head n] and fills row r's
  // caches at rows[r].pos. Rows sharing caches (one sequence's) come in order of consecutive
  // positions; rows of different sequences share no cache.
  void run(const float* h, const StepRow* rows, int64_t b, float* logits);

  // `b` tokens of the own sequence at positions pos.. (a speculative verification): as `b` one-
  // token runs at pos, pos + 1, ..., with the projections as b-row matmuls.
  void run_block(const float* h, int64_t pos, int64_t b, float* logits);

  // The step's matmuls alone, on its buffers as the last run left them (for measuring the time
  // the step spends outside them).
  void run_matmuls(float* logits);

  const StepModel& model() const { return m_; }
  const std::vector<LayerCache>& caches() const { return own_; }
  int64_t last_rows() const { return last_rows_; }  // rows of the last run (run_matmuls' logits)

  // Seconds the last run() took in all, and in its matmuls (clocked around each call).
  double last_seconds() const { return last_total_; }
  double last_matmul_seconds() const { return last_matmul_; }

 private:
  void reserve(int64_t b);
  void forward(const float* h, const StepRow* rows, int64_t b, float* logits);
  void linear(const StepLinear& l, const float* x, int64_t b, float* y);
  void moe(const MoeLayer& L, const float* x, int64_t b, float* y);
  void mlp(const StepLayer& L, int64_t b);

  StepModel m_;
  std::vector<LayerCache> own_;
  std::mutex mutex_;  // one step at a time per object (the buffers below)
  std::vector<float> h_, x_, qkv_, att_, proj_, gu_, act_;  // room for rows_ rows
  std::vector<AttendRow> attend_, round_;
  MoeScratch moe_;
  std::vector<int64_t> round_of_;  // each row's round: rows of its sequence before it
  int64_t rows_ = 0, last_rows_ = 1;
  int64_t qkv_width_ = 0, att_width_ = 0;  // the widest layer's projection and mixer output
  double last_total_ = 0, last_matmul_ = 0, matmul_ = 0;
};

}  // namespace qlinear::decoder
