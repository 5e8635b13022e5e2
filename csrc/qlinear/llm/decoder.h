// The small per-token operations of a decoder block, for the LLM runtime's decode step: with one
// token, each is a few microseconds of work, and doing them as a dozen numpy calls per layer
// cost as much as the layer's matmuls' memory traffic leaves room for; and the attention of a
// prompt (prefill). decoder_impl.h, built for the baseline and for AVX2: loops the compiler
// vectorizes, and AVX2 / NEON intrinsics for the attention's dot products and value sums, all
// in one fixed order of float operations, so that every level gives the same bits. float32; the
// KV caches float32 or IEEE half (AttentionShape::kv_half: stored rounded to nearest even, read
// back exactly, the arithmetic in float32 as with float caches).
#pragma once

#include <cstdint>

namespace qlinear::decoder {

// y = x / sqrt(mean(x^2) + eps) * weight, for `rows` rows of `n` values.
void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t n, float* y);

// out[i] = silu(gate[i]) * up[i] with gate = gu[:n], up = gu[n:2n] per row.
void silu_mul(const float* gu, int64_t rows, int64_t n, float* out);

// One row of silu_mul, its columns split over the thread pool when it is wide (a decode step).
void silu_mul_row(const float* gu, int64_t n, float* out);

// The rows of a batched decode step (one token of each of `rows` sequences): rows are tasks of
// the thread pool (one row: its columns are, as silu_mul_row). The same bits as silu_mul_row.
void silu_mul_rows(const float* gu, int64_t rows, int64_t n, float* out);

// GeGLU (Gemma): out[i] = gelu_tanh(gate[i]) * up[i], gelu_tanh(x) = x * sigmoid(2u) with
// u = sqrt(2 / pi) (x + 0.044715 x^3) (the same as 0.5 x (1 + tanh u), without tanh's cancellation).
void gelu_tanh_mul(const float* gu, int64_t rows, int64_t n, float* out);
void gelu_tanh_mul_row(const float* gu, int64_t n, float* out);
void gelu_tanh_mul_rows(const float* gu, int64_t rows, int64_t n, float* out);

// Soft-capping (Gemma 2's attention scores and final logits): x = cap * tanh(x / cap), in place.
void softcap(float* x, int64_t n, float cap);

// y[j] = the dot product of x and row j of w [n, k], j < n (float32, one fixed order of float
// operations at every level: a MoE router's logits).
void dot_rows(const float* x, const float* w, int64_t n, int64_t k, float* y);

// Gated DeltaNet (Qwen3.5's linear attention): one token of one sequence. y: the layer's input
// projection [channels + v_heads * v_dim + 2 * v_heads] (the conv channels q, k, v; the output
// gate z; beta's logits b; the decay's a), conv_state [kernel - 1, channels] (the conv's last
// inputs) and state [v_heads, k_dim, v_dim] updated in place; out [v_heads * v_dim]: the readout
// RMS-normed per head (eps), times norm and silu(z). The conv (taps [kernel, channels]) and
// SiLU, q / k L2-normed (q scaled by k_dim ** -0.5), beta = sigmoid(b), decay = exp(a_rate *
// softplus(a + dt_bias)), then per value head: S <- decay S, S <- S + k^T (beta (v - k S)),
// o = q S. Value head j reads key head j / (v_heads / k_heads), or j % k_heads when `tiled`.
constexpr int64_t kMaxDeltaDim = 512;
struct DeltaShape {
  int64_t k_heads = 0, v_heads = 0, k_dim = 0, v_dim = 0, kernel = 0;
  bool tiled = false;
  float eps = 0.f;
  int64_t channels() const { return 2 * k_heads * k_dim + v_heads * v_dim; }
  int64_t width() const { return channels() + v_heads * v_dim + 2 * v_heads; }  // of y
};
struct DeltaWeights {
  const float* conv = nullptr;     // [kernel, channels]: tap j of every channel
  const float* dt_bias = nullptr;  // [v_heads]
  const float* a = nullptr;        // [v_heads]: the decay's rate, -exp(A_log)
  const float* norm = nullptr;     // [v_dim]
};
void delta_token(const float* y, const DeltaShape& s, const DeltaWeights& w, float* conv_state, float* state,
                 float* out);

// LFM2's short convolution, one token: y = [B, C, x] (n each), conv taps [kernel, n], conv_state
// [kernel - 1, n] (the last values of B * x) updated; out [n] = C * sum_j tap_j * (B * x)_{t-K+1+j}.
void short_conv_token(const float* y, int64_t n, int64_t kernel, const float* conv, float* conv_state, float* out);

// A prefill's n rows of one sequence at positions start.. (y [n, width]): the same rule in its
// chunked (WY / UT) form, chunks of kDeltaChunk cut at multiples of it of the absolute position
// (docs/semantics.md 7): within a chunk, (I + strictly lower (beta_i k_i . k_j e^(G_i - G_j)))
// [u, w] = [beta v, beta e^G k] by forward substitution, v' = u - w S, o = e^G q S + (q k^T
// decay) v', S <- e^(G_last) S + (e^(G_last - G) k)^T v'. Value heads split over the pool;
// out [n, v_heads * v_dim] as delta_token's.
constexpr int64_t kDeltaChunk = 64;
void delta_chunked(const float* y, int64_t n, int64_t start, const DeltaShape& s, const DeltaWeights& w,
                   float* conv_state, float* state, float* out);

// x[i] *= sigmoid(gate[i]) (the gated attention's output, Qwen3.5).
void sigmoid_mul(const float* gate, int64_t n, float* x);

struct AttentionShape {
  int64_t heads, kv_heads, head_dim, capacity;  // capacity: positions the cache holds
  // Sliding window: a position sees the keys of the last `window` positions, its own included
  // (0: all before it). Prefill only; a decode step's window is its cache: see attend_one.
  int64_t window = 0;
  float softcap = 0.f;  // attention scores soft-capped (0: not)
  // Sinks (GPT-OSS): per query head a logit in the softmax's denominator that weighs no value
  // row, [heads] (nullptr: none). Scores and the sink share one max: p_t = e^(s_t - m) / (sum
  // e^(s - m) + e^(sink - m)), m = max(max s, sink).
  const float* sinks = nullptr;
  bool kv_half = false;  // the caches hold IEEE half values (uint16_t), else float
};

constexpr int64_t kAttendBatch = 16;   // decode: query heads of one KV head attended together
constexpr int64_t kPrefillRows = 16;   // prefill: query rows per task (and per pass over the keys)
constexpr int64_t kKeyBlock = 64;      // prefill: keys per block of the online softmax
constexpr int64_t kMaxHeadDim = 512;

// Decode: the scores of each head at positions 0..pos, rows of the scratch apart by a stride
// that is not a multiple of 4 KiB (rows 4 KiB apart would share L1 sets and alias).
inline int64_t attend_scores_stride(int64_t pos) { return (pos + 1 + 15) / 16 * 16 + 16; }

// One token at position `pos`: rotate q and k (rotate-half RoPE with the tables' row `pos`),
// store k and v into the caches ([kv_heads, capacity, head_dim] each) at row pos % capacity, and
// attend over the rows filled (0..pos, or all of them once pos >= capacity: a cache of `window`
// rows used as a ring is a sliding window's) (grouped-query: head h reads KV head h / (heads / kv_heads)); heads are split
// over the thread pool when the context is long.
// qkv: [heads + 2 * kv_heads, head_dim]; out: [heads, head_dim].
void attend_one(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                const AttentionShape& s, float scale, void* k_cache, void* v_cache, float* out);


// One token of each sequence of a batched decode step, each over its own caches and position:
// attend_one's work for every row, the rows (and a long context's heads) as tasks of one pool
// job. A row's result does not depend on the other rows (the same bits as attend_one).
struct AttendRow {
  const float* qkv;
  const float* cos_row;
  const float* sin_row;
  int64_t pos, capacity;
  void *k_cache, *v_cache;
  float* out;
};
void attend_batch(const AttendRow* rows, int64_t b, const AttentionShape& s, float scale);

// A prompt of `rows` tokens at positions start.. (prefill): RoPE on the queries and keys, the
// keys and values stored into the caches at start.. (start + rows <= capacity), and causal
// attention of every row over the positions up to its own (the last s.window ones, when set) (keys in blocks of 64 with an online softmax: no [rows, positions]
// score matrix is held). Tasks of (head, 16 query rows) run on the thread pool.
// qkv: [rows, (heads + 2 * kv_heads) * head_dim]; cos / sin: the full RoPE tables
// [>= start + rows, head_dim / 2]; out: [rows, heads * head_dim].
void attend_prefill(const float* qkv, int64_t rows, const float* cos, const float* sin, int64_t start,
                    const AttentionShape& s, float scale, void* k_cache, void* v_cache, float* out);

}  // namespace qlinear::decoder
