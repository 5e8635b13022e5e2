// Dispatch of the decoder operations: the AVX2 copy of decoder_impl.h on x86 CPUs that run an
// AVX2 level, the baseline copy elsewhere (and under QLINEAR_ISA=scalar).
#define QLINEAR_DECODER_IMPL generic
#include "qlinear/llm/decoder_impl.h"

#include <algorithm>
#include <vector>

#include "qlinear/core/kernels.h"
#include "qlinear/core/threadpool.h"

namespace qlinear::decoder {

#if defined(__x86_64__) || defined(_M_X64)
namespace avx2 {
void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t n, float* y);
void silu_mul(const float* gu, int64_t rows, int64_t n, float* out);
void silu_mul_cols(const float* gu, int64_t n, int64_t c0, int64_t c1, float* out);
void gelu_tanh_mul(const float* gu, int64_t rows, int64_t n, float* out);
void gelu_tanh_mul_cols(const float* gu, int64_t n, int64_t c0, int64_t c1, float* out);
void softcap(float* x, int64_t n, float cap);
void dot_rows(const float* x, const float* w, int64_t n, int64_t k, float* y);
void store_kv(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
              const AttentionShape& sh, void* k_cache, void* v_cache);
void attend_heads(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                  const AttentionShape& sh, float scale, const void* k_cache, const void* v_cache,
                  int64_t h0, int64_t h1, float* out, float* scratch);
void attend_rows(const float* q, int64_t ldq, int64_t start, const AttentionShape& sh,
                 const void* k_cache, const void* v_cache, int64_t h, int64_t r0, int64_t r1,
                 float* out, int64_t ldo, float* scratch);
void rope_queries(const float* qkv, int64_t ldqkv, const float* cos, const float* sin, int64_t start,
                  const AttentionShape& sh, float scale, int64_t r0, int64_t r1, float* q);
void delta_conv(const float* y, const DeltaShape& s, const DeltaWeights& w, float* conv_state, float* h);
void delta_heads(const float* y, const float* h, const DeltaShape& s, const DeltaWeights& w, float* state,
                 int64_t h0, int64_t h1, float* out);
void sigmoid_mul(const float* gate, int64_t n, float* x);
void short_conv_token(const float* y, int64_t n, int64_t kernel, const float* conv, float* conv_state, float* out);
void delta_prefill_inputs(const float* y, int64_t n, const DeltaShape& s, const DeltaWeights& w, float* conv_state,
                          float* h, float* beta, float* g);
void delta_prefill_heads(const float* y, const float* h, const float* beta, const float* g, int64_t n,
                         int64_t start, const DeltaShape& s, const DeltaWeights& w, float* state, int64_t h0,
                         int64_t h1, float* out, float* scratch);
}  // namespace avx2
#define QLINEAR_DECODER_CALL(fn, ...) \
  (active_kernels().isa != Isa::scalar ? avx2::fn(__VA_ARGS__) : generic::fn(__VA_ARGS__))
#else
#define QLINEAR_DECODER_CALL(fn, ...) generic::fn(__VA_ARGS__)
#endif

void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t n, float* y) {
  QLINEAR_DECODER_CALL(rms_norm, x, weight, eps, rows, n, y);
}

void silu_mul(const float* gu, int64_t rows, int64_t n, float* out) {
  QLINEAR_DECODER_CALL(silu_mul, gu, rows, n, out);
}

namespace {
template <typename F>
void columns_in_parallel(int64_t n, F&& cols) {
  constexpr int64_t kMinColumns = 2048;  // per thread: ~2 us of work, worth a pool job
  if (n < 2 * kMinColumns || ThreadPool::global().num_threads() < 2) cols(int64_t{0}, n);
  else ThreadPool::global().parallel_for(n, kMinColumns, cols);
}
}  // namespace

void silu_mul_row(const float* gu, int64_t n, float* out) {
  columns_in_parallel(n, [&](int64_t c0, int64_t c1) { QLINEAR_DECODER_CALL(silu_mul_cols, gu, n, c0, c1, out); });
}

namespace {
// The rows of a batched step as tasks of the pool; one row alone splits its columns (one_row).
template <typename OneRow, typename Row>
void rows_in_parallel(int64_t rows, OneRow&& one_row, Row&& row) {
  if (rows == 1) {
    one_row();
  } else {
    ThreadPool::global().parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) row(r);
    });
  }
}
}  // namespace

void silu_mul_rows(const float* gu, int64_t rows, int64_t n, float* out) {
  rows_in_parallel(
      rows, [&] { silu_mul_row(gu, n, out); },
      [&](int64_t r) { QLINEAR_DECODER_CALL(silu_mul_cols, gu + r * 2 * n, n, 0, n, out + r * n); });
}

void gelu_tanh_mul(const float* gu, int64_t rows, int64_t n, float* out) {
  QLINEAR_DECODER_CALL(gelu_tanh_mul, gu, rows, n, out);
}

void gelu_tanh_mul_row(const float* gu, int64_t n, float* out) {
  columns_in_parallel(n, [&](int64_t c0, int64_t c1) {
    QLINEAR_DECODER_CALL(gelu_tanh_mul_cols, gu, n, c0, c1, out);
  });
}

void gelu_tanh_mul_rows(const float* gu, int64_t rows, int64_t n, float* out) {
  rows_in_parallel(
      rows, [&] { gelu_tanh_mul_row(gu, n, out); },
      [&](int64_t r) { QLINEAR_DECODER_CALL(gelu_tanh_mul_cols, gu + r * 2 * n, n, 0, n, out + r * n); });
}

void softcap(float* x, int64_t n, float cap) { QLINEAR_DECODER_CALL(softcap, x, n, cap); }

void delta_token(const float* y, const DeltaShape& s, const DeltaWeights& w, float* conv_state, float* state,
                 float* out) {
  thread_local std::vector<float> h;  // the conv's output: q, k (normed), v
  h.resize(static_cast<size_t>(s.channels()));
  float* conv_out = h.data();  // (the pool's threads see this thread's buffer through the pointer)
  QLINEAR_DECODER_CALL(delta_conv, y, s, w, conv_state, conv_out);
  // value heads split over the pool once they are worth a job (a head: ~3 k_dim x v_dim multiply-adds)
  const auto heads = [&](int64_t h0, int64_t h1) {
    QLINEAR_DECODER_CALL(delta_heads, y, conv_out, s, w, state, h0, h1, out);
  };
  constexpr int64_t kMinParallelWork = 1 << 17;
  if (s.v_heads * s.k_dim * s.v_dim * 3 < 2 * kMinParallelWork || ThreadPool::global().num_threads() < 2) heads(0, s.v_heads);
  else ThreadPool::global().parallel_for(s.v_heads, 1, heads);
}

void sigmoid_mul(const float* gate, int64_t n, float* x) { QLINEAR_DECODER_CALL(sigmoid_mul, gate, n, x); }

void delta_chunked(const float* y, int64_t n, int64_t start, const DeltaShape& s, const DeltaWeights& w,
                   float* conv_state, float* state, float* out) {
  std::vector<float> h(static_cast<size_t>(n * s.channels())), beta(static_cast<size_t>(n * s.v_heads)),
      g(static_cast<size_t>(n * s.v_heads));
  QLINEAR_DECODER_CALL(delta_prefill_inputs, y, n, s, w, conv_state, h.data(), beta.data(), g.data());
  const float *hp = h.data(), *bp = beta.data(), *gp = g.data();
  const int64_t scratch = 2 * kDeltaChunk + 2 * kDeltaChunk * kDeltaChunk + kDeltaChunk * (s.v_dim + 2 * s.k_dim) + s.v_dim;
  ThreadPool::global().parallel_for(s.v_heads, 1, [&](int64_t h0, int64_t h1) {
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(scratch));
    QLINEAR_DECODER_CALL(delta_prefill_heads, y, hp, bp, gp, n, start, s, w, state, h0, h1, out, buf.data());
  });
}

void short_conv_token(const float* y, int64_t n, int64_t kernel, const float* conv, float* conv_state, float* out) {
  QLINEAR_DECODER_CALL(short_conv_token, y, n, kernel, conv, conv_state, out);
}

void dot_rows(const float* x, const float* w, int64_t n, int64_t k, float* y) {
  QLINEAR_DECODER_CALL(dot_rows, x, w, n, k, y);
}

namespace {
// Heads [h0, h1) of one token over its caches (stored already), with this thread's scratch.
void heads_of_one(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                  const AttentionShape& sh, float scale, const void* k_cache, const void* v_cache,
                  int64_t h0, int64_t h1, float* out) {
  const int64_t n = std::min(pos + 1, sh.capacity);  // keys attended
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(kAttendBatch * (sh.head_dim + attend_scores_stride(n - 1))));
  QLINEAR_DECODER_CALL(attend_heads, qkv, cos_row, sin_row, pos, sh, scale, k_cache, v_cache, h0, h1, out,
                       scratch.data());
}
}  // namespace

void attend_one(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                const AttentionShape& sh, float scale, void* k_cache, void* v_cache, float* out) {
  QLINEAR_DECODER_CALL(store_kv, qkv, cos_row, sin_row, pos, sh, k_cache, v_cache);
  // Heads split over the pool once a long context makes them worth a job (~100 us of work).
  const int64_t n = std::min(pos + 1, sh.capacity);  // keys attended
  const auto heads = [&](int64_t h0, int64_t h1) {
    heads_of_one(qkv, cos_row, sin_row, pos, sh, scale, k_cache, v_cache, h0, h1, out);
  };
  constexpr int64_t kMinParallelWork = 1 << 17;  // multiply-adds
  if (sh.heads * n * sh.head_dim * 2 < kMinParallelWork) heads(0, sh.heads);
  else ThreadPool::global().parallel_for(sh.heads, 1, heads);
}

void attend_batch(const AttendRow* rows, int64_t b, const AttentionShape& s, float scale) {
  if (b == 1 || ThreadPool::global().num_threads() < 2) {
    for (int64_t r = 0; r < b; ++r) {
      AttentionShape sh = s;
      sh.capacity = rows[r].capacity;
      const AttendRow& a = rows[r];
      attend_one(a.qkv, a.cos_row, a.sin_row, a.pos, sh, scale, a.k_cache, a.v_cache, a.out);
    }
    return;
  }
  for (int64_t r = 0; r < b; ++r) {
    AttentionShape sh = s;
    sh.capacity = rows[r].capacity;
    const AttendRow& a = rows[r];
    QLINEAR_DECODER_CALL(store_kv, a.qkv, a.cos_row, a.sin_row, a.pos, sh, a.k_cache, a.v_cache);
  }
  // Tasks of (row, group of heads): a row's heads are one task, or one per KV head once its
  // context is long (the tasks of the longest rows first would balance better; rows of a
  // batch are of similar lengths).
  int64_t most = 1;
  for (int64_t r = 0; r < b; ++r) most = std::max(most, std::min(rows[r].pos + 1, rows[r].capacity));
  constexpr int64_t kMinTaskWork = 1 << 17;  // multiply-adds
  const int64_t groups = s.heads * most * s.head_dim * 2 < 2 * kMinTaskWork ? 1 : s.kv_heads;
  const int64_t per_group = s.heads / groups;
  auto task = [&](int64_t t) {
    const AttendRow& a = rows[t / groups];
    const int64_t h0 = t % groups * per_group;
    AttentionShape sh = s;
    sh.capacity = a.capacity;
    heads_of_one(a.qkv, a.cos_row, a.sin_row, a.pos, sh, scale, a.k_cache, a.v_cache, h0, h0 + per_group, a.out);
  };
  ThreadPool::global().run(b * groups, TaskRef(task));
}

void attend_prefill(const float* qkv, int64_t rows, const float* cos, const float* sin, int64_t start,
                    const AttentionShape& sh, float scale, void* k_cache, void* v_cache, float* out) {
  const int64_t d = sh.head_dim, half = d / 2, ldqkv = (sh.heads + 2 * sh.kv_heads) * d;
  for (int64_t r = 0; r < rows; ++r)
    QLINEAR_DECODER_CALL(store_kv, qkv + r * ldqkv, cos + (start + r) * half, sin + (start + r) * half,
                         start + r, sh, k_cache, v_cache);
  std::vector<float> q(static_cast<size_t>(rows * sh.heads * d));
  ThreadPool& pool = ThreadPool::global();
  pool.parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    QLINEAR_DECODER_CALL(rope_queries, qkv, ldqkv, cos, sin, start, sh, scale, r0, r1, q.data());
  });
  // Tasks of (head, block of query rows), the longest (last rows: most keys) handed out first.
  const int64_t blocks = (rows + kPrefillRows - 1) / kPrefillRows;
  auto task = [&](int64_t t) {
    const int64_t b = blocks - 1 - t / sh.heads, h = t % sh.heads;
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(2 * kPrefillRows * d + d * kKeyBlock + kPrefillRows * kKeyBlock));
    QLINEAR_DECODER_CALL(attend_rows, q.data(), sh.heads * d, start, sh, k_cache, v_cache, h, b * kPrefillRows,
                         std::min(rows, (b + 1) * kPrefillRows), out, sh.heads * d, scratch.data());
  };
  pool.run(blocks * sh.heads, TaskRef(task));
}

}  // namespace qlinear::decoder
