#include "qlinear/llm/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "qlinear/llm/decoder.h"
#include "qlinear/core/matmul.h"
#include "qlinear/core/threadpool.h"

namespace qlinear::decoder {

void run_linear(const StepLinear& l, const float* x, int64_t b, float* y, bool float_rows) {
  if (l.act_int8) {
    matmul_int8(MatmulRequest{l.w, l.packed, x, DType::f32, b, l.w->k, l.act_block, l.bias, y, l.w->n});
  } else if (!float_rows) {
    matmul_float(MatmulRequest{l.w, l.packed, x, DType::f32, b, l.w->k, l.w->k, l.bias, y, l.w->n});
  } else {
    for (int64_t r = 0; r < b; ++r)
      matmul_float(MatmulRequest{l.w, l.packed, x + r * l.w->k, DType::f32, 1, l.w->k, l.w->k, l.bias,
                                 y + r * l.w->n, l.w->n});
  }
}

void route(const float* logits, int64_t rows, int64_t experts, int64_t k, bool norm_topk, int32_t* idx, float* w) {
  std::vector<float> p(static_cast<size_t>(experts));
  std::vector<char> taken(static_cast<size_t>(experts));
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * experts;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < experts; ++e) top = std::max(top, l[e]);
    float sum = 0.f;
    for (int64_t e = 0; e < experts; ++e) {
      p[e] = std::exp(l[e] - top);
      sum += p[e];
    }
    for (int64_t e = 0; e < experts; ++e) p[e] = p[e] / sum;
    std::fill(taken.begin(), taken.end(), 0);
    float chosen = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;  // the first expert not taken, then any strictly larger one
      for (int64_t e = 0; e < experts; ++e)
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      idx[r * k + j] = static_cast<int32_t>(best);
      w[r * k + j] = p[best];
      chosen += p[best];
    }
    if (norm_topk)
      for (int64_t j = 0; j < k; ++j) w[r * k + j] = w[r * k + j] / chosen;
  }
}

void router_logits(const MoeLayer& L, const float* x, int64_t rows, float* logits) {
  const auto some = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* l = logits + r * L.experts;
      dot_rows(x + r * L.hidden, L.router, L.experts, L.hidden, l);
      if (L.router_bias)
        for (int64_t e = 0; e < L.experts; ++e) l[e] = l[e] + L.router_bias[e];
    }
  };
  if (rows < 16) some(0, rows);  // a decode step's rows: a few microseconds
  else ThreadPool::global().parallel_for(rows, 16, some);
}

void group_by_expert(const int32_t* idx, int64_t rows, int64_t k, int64_t experts, int64_t hidden, int64_t inter,
                     MoeScratch& s) {
  const int64_t pairs = rows * k;
  s.xe.resize(pairs * hidden);
  s.gu.resize(pairs * 2 * inter);
  s.act.resize(pairs * inter);
  s.out.resize(pairs * hidden);
  s.count.assign(experts, 0);
  s.start.resize(experts);
  s.pair.resize(pairs);
  s.where.resize(pairs);
  for (int64_t p = 0; p < pairs; ++p) ++s.count[idx[p]];
  s.used.clear();
  for (int64_t e = 0, at = 0; e < experts; ++e) {
    s.start[e] = at;
    at += s.count[e];
    if (s.count[e]) s.used.push_back(e);
  }
  std::vector<int64_t> next(s.start);
  for (int64_t p = 0; p < pairs; ++p) {
    s.where[p] = next[idx[p]]++;
    s.pair[s.where[p]] = p;
  }
}

void run_experts(const ExpertTask* tasks, int64_t n, const float* x, int64_t hidden, int64_t inter, int64_t k,
                 const ExpertActivation& act_kind, MoeScratch& s, bool float_rows) {
  const int64_t H = hidden, I = inter;
  auto expert = [&](int64_t t) {
    const ExpertTask& task = tasks[t];
    const int64_t c0 = s.start[task.expert], c = s.count[task.expert];
    float* xe = s.xe.data() + c0 * H;
    for (int64_t i = 0; i < c; ++i) std::copy_n(x + s.pair[c0 + i] / k * H, H, xe + i * H);
    float *gu = s.gu.data() + c0 * 2 * I, *act = s.act.data() + c0 * I;
    run_linear(*task.gate_up, xe, c, gu, float_rows);
    if (act_kind.swiglu_limit > 0.f) clamped_swiglu_mul(gu, c, I, act_kind.swiglu_limit, act_kind.swiglu_alpha, act);
    else if (act_kind.gelu) gelu_tanh_mul(gu, c, I, act);
    else silu_mul(gu, c, I, act);
    run_linear(*task.down, act, c, s.out.data() + c0 * H, float_rows);
  };
  ThreadPool& pool = ThreadPool::global();
  if (n >= 2 && pool.num_threads() >= 2) {
    pool.run(n, TaskRef(expert));  // the GEMMs inside a task run on its thread
  } else {
    for (int64_t t = 0; t < n; ++t) expert(t);  // one expert: its GEMMs split over the pool
  }
}

void clamped_swiglu_mul(const float* gu, int64_t rows, int64_t n, float limit, float alpha, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gu + r * 2 * n;
    const float* up = gate + n;
    float* o = out + r * n;
    for (int64_t i = 0; i < n; ++i) {
      const float g = std::min(gate[i], limit), u = std::min(std::max(up[i], -limit), limit);
      o[i] = (u + 1.f) * (g / (1.f + std::exp(-alpha * g)));
    }
  }
}

void sum_experts(const int32_t* idx, const float* w, int64_t rows, int64_t k, int64_t hidden, const MoeScratch& s,
                 float* y) {
  const int64_t H = hidden;
  const auto sum = [&](int64_t r0, int64_t r1) {
    int64_t order[64];
    for (int64_t r = r0; r < r1; ++r) {
      float* yr = y + r * H;
      std::fill(yr, yr + H, 0.f);
      for (int64_t j = 0; j < k; ++j) order[j] = j;
      std::sort(order, order + k, [&](int64_t a, int64_t b) { return idx[r * k + a] < idx[r * k + b]; });
      for (int64_t j = 0; j < k; ++j) {
        const float wj = w[r * k + order[j]];
        const float* o = s.out.data() + s.where[r * k + order[j]] * H;
        for (int64_t i = 0; i < H; ++i) yr[i] = yr[i] + wj * o[i];
      }
    }
  };
  if (rows < 16) sum(0, rows);
  else ThreadPool::global().parallel_for(rows, 16, sum);
}

void moe_mlp(const MoeLayer& L, const float* x, int64_t rows, float* y, MoeScratch& s, bool float_rows) {
  const int64_t E = L.experts, k = L.top_k;
  s.logits.resize(rows * E);
  s.idx.resize(rows * k);
  s.w.resize(rows * k);
  router_logits(L, x, rows, s.logits.data());
  route(s.logits.data(), rows, E, k, L.norm_topk, s.idx.data(), s.w.data());
  group_by_expert(s.idx.data(), rows, k, E, L.hidden, L.inter, s);
  // the experts with the most rows first (tasks handed out in order balance better)
  std::stable_sort(s.used.begin(), s.used.end(), [&](int64_t a, int64_t b) { return s.count[a] > s.count[b]; });
  int64_t bytes = 0;
  s.tasks.clear();
  for (int64_t e : s.used) {
    bytes += L.gate_up[e].w->total_bytes + L.down[e].w->total_bytes;
    s.tasks.push_back(ExpertTask{e, &L.gate_up[e], &L.down[e]});
  }
  L.bytes_read += bytes;
  run_experts(s.tasks.data(), static_cast<int64_t>(s.tasks.size()), x, L.hidden, L.inter, k, L.act, s, float_rows);
  sum_experts(s.idx.data(), s.w.data(), rows, k, L.hidden, s, y);
  if (L.shared_gate) shared_expert(L, x, rows, y, s, float_rows);
}

void shared_expert(const MoeLayer& L, const float* x, int64_t rows, float* y, MoeScratch& s, bool float_rows) {
  const int64_t H = L.hidden, S = L.shared_inter;
  s.shared_gu.resize(rows * 2 * S), s.shared_act.resize(rows * S), s.shared_out.resize(rows * H);
  run_linear(L.shared_gate_up, x, rows, s.shared_gu.data(), float_rows);
  if (L.act.gelu) gelu_tanh_mul(s.shared_gu.data(), rows, S, s.shared_act.data());
  else silu_mul(s.shared_gu.data(), rows, S, s.shared_act.data());
  run_linear(L.shared_down, s.shared_act.data(), rows, s.shared_out.data(), float_rows);
  for (int64_t r = 0; r < rows; ++r) {
    float logit;
    dot_rows(x + r * H, L.shared_gate, 1, H, &logit);
    const float g = 1.f / (1.f + std::exp(-logit));
    const float* o = s.shared_out.data() + r * H;
    for (int64_t i = 0; i < H; ++i) y[r * H + i] = y[r * H + i] + o[i] * g;
  }
}

}  // namespace qlinear::decoder
