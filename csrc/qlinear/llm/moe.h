// Routed experts (Qwen3-MoE, OLMoE, Mixtral, GPT-OSS, Qwen2-MoE with its shared expert) for the LLM runtime: the
// router, softmax and top-k, and the routed MLP of a layer over any number of rows, one function
// for the compiled decode step (one token, or a batch of them) and for the per-layer Python path
// (decode and prefill), so both compute the same bits (docs/llm.md, "Mixture of experts").
//
// The order of operations, fixed: logits[e] = dot(x, router[e]) (+ bias) by decoder::dot_rows;
// p = exp(l - max) / sum (std::exp, the sum in ascending expert order); the k largest p (ties: the
// lower expert), divided by their sum (in rank order) with norm_topk; then y = 0 and, for the
// chosen experts in ascending expert order, y = y + w * down(act(gate_up(x))) (the product
// rounded, then the sum: no contraction).
//
// Rows are grouped by expert: one GEMM per expert over the rows that chose it (int8 activations:
// every row of a GEMM has the bits of its GEMV, so a row's result does not depend on the other
// rows; float activations run row by row where the caller needs that, as the decode step does).
// The experts are tasks of the thread pool (their GEMMs then run on one thread each) once there
// are at least two of them for two threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "qlinear/core/layout.h"

namespace qlinear::decoder {

struct StepLinear {
  const WeightGeometry* w = nullptr;
  const uint8_t* packed = nullptr;
  const float* bias = nullptr;  // [n] or nullptr
  bool act_int8 = true;         // matmul_int8 (act_block) or matmul_float
  int64_t act_block = 0;
};

// y [b, n] = x [b, k] W^T (+ bias). float_rows: float-activation projections one row at a time
// (a row's bits then do not depend on b; the float GEMM sums in another order than its GEMV).
void run_linear(const StepLinear& l, const float* x, int64_t b, float* y, bool float_rows);

// The experts' activation over gate_up [rows, 2 inter] (gate first): SiLU * up, GELU-tanh * up,
// or GPT-OSS's clamped SwiGLU (clamped_swiglu_mul).
struct ExpertActivation {
  bool gelu = false;
  float swiglu_limit = 0.f;  // > 0: the clamped SwiGLU
  float swiglu_alpha = 1.702f;
};

struct MoeLayer {
  int64_t hidden = 0, inter = 0, experts = 0, top_k = 0;
  const float* router = nullptr;       // [experts, hidden], float
  const float* router_bias = nullptr;  // [experts] or nullptr
  bool norm_topk = false;              // the k weights divided by their sum
  ExpertActivation act;
  std::vector<StepLinear> gate_up, down;  // per expert: [2 inter, hidden], [hidden, inter]
  // A shared expert every row runs (Qwen2-MoE, Qwen3.5-MoE; none while shared_gate is null): after
  // the routed sum, y = y + down(act(gate_up(x))) * sigmoid(dot(x, shared_gate)) (std::exp).
  StepLinear shared_gate_up, shared_down;
  const float* shared_gate = nullptr;  // [hidden]
  int64_t shared_inter = 0;
  mutable std::atomic<int64_t> bytes_read{0};  // packed bytes of the experts run (all calls)
};

// The k experts of each of `rows` rows of logits [rows, experts]: idx [rows, k] (highest first,
// ties the lower expert) and their weights w [rows, k].
void route(const float* logits, int64_t rows, int64_t experts, int64_t k, bool norm_topk, int32_t* idx, float* w);

// Router logits [rows, experts] of x [rows, hidden].
void router_logits(const MoeLayer& L, const float* x, int64_t rows, float* logits);

// An expert to run: its index and weights.
struct ExpertTask {
  int64_t expert = 0;
  const StepLinear* gate_up = nullptr;
  const StepLinear* down = nullptr;
};

// Buffers of moe_mlp and its stages (they only grow).
struct MoeScratch {
  std::vector<float> logits, w, xe, gu, act, out, shared_gu, shared_act, shared_out;
  std::vector<int32_t> idx;
  std::vector<int64_t> count, start, pair, where, used;
  std::vector<ExpertTask> tasks;
};

// y [rows, hidden] = the routed MLP of x [rows, hidden].
void moe_mlp(const MoeLayer& L, const float* x, int64_t rows, float* y, MoeScratch& s, bool float_rows);

// moe_mlp's stages, for experts whose weights arrive over time (read from flash on demand): the
// (row, slot) pairs of idx [rows, k] grouped by expert (count, start, pair, where, used = the
// experts chosen, ascending); the outputs of n of those experts, each an ExpertTask, over their
// rows (tasks of the pool when n >= 2); and y [rows, hidden], the sum of the outputs weighted by
// w [rows, k] in ascending expert order, once every chosen expert has run.
void group_by_expert(const int32_t* idx, int64_t rows, int64_t k, int64_t experts, int64_t hidden, int64_t inter,
                     MoeScratch& s);
void run_experts(const ExpertTask* tasks, int64_t n, const float* x, int64_t hidden, int64_t inter, int64_t k,
                 const ExpertActivation& act, MoeScratch& s, bool float_rows);

// GPT-OSS's clamped SwiGLU over gate_up [rows, 2n] (gate first): g = min(gate, limit), u =
// clamp(up, -limit, limit), out = (u + 1) * (g * sigmoid(alpha * g)) (std::exp).
void clamped_swiglu_mul(const float* gu, int64_t rows, int64_t n, float limit, float alpha, float* out);
void sum_experts(const int32_t* idx, const float* w, int64_t rows, int64_t k, int64_t hidden, const MoeScratch& s,
                 float* y);
// y [rows, hidden] += the shared expert's output (MoeLayer), after the routed sum.
void shared_expert(const MoeLayer& L, const float* x, int64_t rows, float* y, MoeScratch& s, bool float_rows);

}  // namespace qlinear::decoder
