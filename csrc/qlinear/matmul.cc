#include "matmul.h"

#include <algorithm>
#include <vector>

#include "threadpool.h"

namespace qlinear {

namespace {

// Per calling thread, reused across calls: decode issues thousands of calls, none allocates.
struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
};
thread_local Scratch tl_scratch;

// Below this many multiply-adds a job is not worth waking other threads for.
constexpr int64_t kMinParallelWork = 1 << 18;

}  // namespace

const KernelTable& kernels_for_weight(const WeightGeometry& w) {
  const KernelTable& table = active_kernels();
  return table.layout == w.layout ? table : scalar_kernels();
}

void quantize_activations(const void* x, DType dtype, int64_t m, int64_t ldx, int64_t k,
                          int64_t block, int64_t act_block, int8_t* q, int64_t ldq, float* scale,
                          int32_t* sum) {
  if (m <= 0) return;
  const ActQuantArgs args{x, dtype, ldx, k, block, ceil_div(k, block), act_block, q, ldq, scale, sum};
  const QuantizeActsFn fn = active_kernels().quantize_acts;
  const int64_t grain = std::max<int64_t>(1, kMinParallelWork / 16 / std::max<int64_t>(k, 1));
  ThreadPool::global().parallel_for(m, grain, [&](int64_t m0, int64_t m1) { fn(args, m0, m1); });
}

void matmul_int8(const MatmulRequest& r) {
  if (r.m <= 0) return;
  const WeightGeometry& w = *r.w;
  const KernelTable& kt = kernels_for_weight(w);
  const int64_t kpad = w.padded_k();
  Scratch& s = tl_scratch;
  s.q.resize(static_cast<size_t>(r.m * kpad));
  s.scale.resize(static_cast<size_t>(r.m * w.nblocks));
  s.sum.resize(static_cast<size_t>(r.m * w.nblocks));
  ThreadPool& pool = ThreadPool::global();

  const ActQuantArgs qa{r.x, r.dtype, r.ldx, w.k, w.block, w.nblocks, r.act_block,
                        s.q.data(), kpad, s.scale.data(), s.sum.data()};
  if (r.m * w.k >= kMinParallelWork / 16) {
    pool.parallel_for(r.m, 4, [&](int64_t m0, int64_t m1) { kt.quantize_acts(qa, m0, m1); });
  } else {
    kt.quantize_acts(qa, 0, r.m);
  }

  const Int8MatmulArgs args{&w, r.packed, {s.q.data(), kpad, s.scale.data(), s.sum.data()},
                            r.bias, r.y, r.ldy};
  const int idx = w.bits == 8 ? 1 : 0;
  const int64_t work = r.m * w.npanels * w.nr * kpad;
  if (r.m == 1) {
    const Int8MatmulFn gemv = kt.gemv[idx];
    const int64_t grain = work < kMinParallelWork ? w.npanels : 1;
    pool.parallel_for(w.npanels, grain, [&](int64_t p0, int64_t p1) { gemv(args, 0, 1, p0, p1); });
    return;
  }
  // GEMM: tasks of a few panels (their weights stay in L2 while every row block passes over
  // them); rows are split too when there are too few panel tasks to keep the threads busy.
  const Int8MatmulFn gemm = kt.gemm[idx];
  const int threads = work < kMinParallelWork ? 1 : pool.num_threads();
  constexpr int64_t kPanelsPerTask = 4;
  const int64_t panel_tasks = ceil_div(w.npanels, kPanelsPerTask);
  const int64_t row_tasks = panel_tasks >= 2 * threads ? 1
      : std::min(ceil_div(r.m, 4), ceil_div(2 * threads, panel_tasks));
  const int64_t rows_per_task = round_up(ceil_div(r.m, row_tasks), 4);
  auto task = [&](int64_t t) {
    const int64_t pt = t % panel_tasks, rt = t / panel_tasks;
    const int64_t p0 = pt * kPanelsPerTask, p1 = std::min(w.npanels, p0 + kPanelsPerTask);
    const int64_t m0 = rt * rows_per_task, m1 = std::min(r.m, m0 + rows_per_task);
    if (m0 < m1) gemm(args, m0, m1, p0, p1);
  };
  if (threads == 1) {
    for (int64_t t = 0; t < panel_tasks * row_tasks; ++t) task(t);
  } else {
    pool.run(panel_tasks * row_tasks, TaskRef(task));
  }
}

}  // namespace qlinear
