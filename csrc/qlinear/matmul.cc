#include "matmul.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "fp16_path.h"
#include "threadpool.h"

namespace qlinear {

namespace {

// Per calling thread, reused across calls: decode issues thousands of calls, none allocates.
struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  std::vector<float> scaled_sum;
  std::vector<int32_t> shifted_sum;
  std::vector<float> xf, xsum;  // float path
  std::vector<uint16_t> xh;     // float path in FP16 arithmetic: normalized fp16 activations
};
thread_local Scratch tl_scratch;

// Row stride of the int8 activations: an odd number of cache lines, so that the rows a GEMM
// tile reads at one k fall into different L1 sets (with K = 4096 every row hit the same set).
inline int64_t activation_stride(int64_t kpad) { return (ceil_div(kpad, 64) | 1) * 64; }

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

// Runs a GEMV (m == 1: panels split evenly over the threads) or a GEMM (tasks of a few panels,
// whose weights stay in L2 while every row block passes over them; rows are split too when
// there are too few panel tasks to keep the threads busy).
template <class Args>
static void run_tiled(const WeightGeometry& w, int64_t m,
                      void (*gemv)(const Args&, int64_t, int64_t, int64_t, int64_t),
                      void (*gemm)(const Args&, int64_t, int64_t, int64_t, int64_t), const Args& args) {
  ThreadPool& pool = ThreadPool::global();
  const int64_t work = m * w.npanels * w.nr * w.padded_k();
  if (m == 1) {
    // A few tasks per thread, taken dynamically: a thread that is slow to start (or a core
    // taken by another process) leaves its share to the others.
    constexpr int64_t kTasksPerThread = 4, kMinPanelsPerTask = 4;
    const int64_t tasks = work < kMinParallelWork ? 1
        : std::max<int64_t>(1, std::min(pool.num_threads() * kTasksPerThread, w.npanels / kMinPanelsPerTask));
    auto task = [&](int64_t t) { gemv(args, 0, 1, w.npanels * t / tasks, w.npanels * (t + 1) / tasks); };
    pool.run(tasks, TaskRef(task));
    return;
  }
  const int threads = work < kMinParallelWork ? 1 : pool.num_threads();
  constexpr int64_t kPanelsPerTask = 4;
  const int64_t panel_tasks = ceil_div(w.npanels, kPanelsPerTask);
  const int64_t row_tasks = panel_tasks >= 2 * threads ? 1
      : std::min(ceil_div(m, 4), ceil_div(2 * threads, panel_tasks));
  const int64_t rows_per_task = round_up(ceil_div(m, row_tasks), 4);
  auto task = [&](int64_t t) {
    const int64_t pt = t % panel_tasks, rt = t / panel_tasks;
    const int64_t p0 = pt * kPanelsPerTask, p1 = std::min(w.npanels, p0 + kPanelsPerTask);
    const int64_t m0 = rt * rows_per_task, m1 = std::min(m, m0 + rows_per_task);
    if (m0 < m1) gemm(args, m0, m1, p0, p1);
  };
  if (threads == 1) {
    for (int64_t t = 0; t < panel_tasks * row_tasks; ++t) task(t);
  } else {
    pool.run(panel_tasks * row_tasks, TaskRef(task));
  }
}

void matmul_int8(const MatmulRequest& r) {
  if (r.m <= 0) return;
  const WeightGeometry& w = *r.w;
  const KernelTable& kt = kernels_for_weight(w);
  const int64_t kpad = w.padded_k(), ldq = activation_stride(kpad);
  Scratch& s = tl_scratch;
  s.q.resize(static_cast<size_t>(r.m * ldq));
  s.scale.resize(static_cast<size_t>(r.m * w.nblocks));
  s.sum.resize(static_cast<size_t>(r.m * w.nblocks));
  ThreadPool& pool = ThreadPool::global();

  const ActQuantArgs qa{r.x, r.dtype, r.ldx, w.k, w.block, w.nblocks, r.act_block,
                        s.q.data(), ldq, s.scale.data(), s.sum.data()};
  if (r.m * w.k >= kMinParallelWork / 16) {
    pool.parallel_for(r.m, 4, [&](int64_t m0, int64_t m1) { kt.quantize_acts(qa, m0, m1); });
  } else {
    kt.quantize_acts(qa, 0, r.m);
  }

  const int idx = w.bits == 8 ? 1 : 0;
  const int32_t shift = kt.code_shift[idx] - w.zero_point();
  s.scaled_sum.resize(s.sum.size());
  s.shifted_sum.resize(s.sum.size());
  for (size_t i = 0; i < s.sum.size(); ++i) {
    s.scaled_sum[i] = s.scale[i] * float(s.sum[i]);
    s.shifted_sum[i] = shift * s.sum[i];
  }
  const Int8MatmulArgs args{&w, r.packed,
                            {s.q.data(), ldq, s.scale.data(), s.sum.data(), s.scaled_sum.data(),
                             s.shifted_sum.data()},
                            r.bias, r.y, r.ldy};
  run_tiled(w, r.m, kt.gemv[idx], kt.gemm[idx], args);
}

namespace {

// fp16 activations for the FP16-arithmetic kernels: copied zero-padded to the padded K, every
// (row, block) scaled by a power of two so that its absmax lies in [8, 16) (fp16_path.h); the
// scale is exact unless a value becomes an fp16 subnormal (far below the block's largest).
HalfMatmulArgs prepare_half_acts(const MatmulRequest& r, Scratch& s) {
  const WeightGeometry& w = *r.w;
  const int64_t kpad = w.padded_k();
  s.xh.resize(static_cast<size_t>(r.m * kpad));
  s.xsum.resize(static_cast<size_t>(r.m * w.nblocks));  // holds 2^-ex
  const auto* x = static_cast<const uint16_t*>(r.x);
  float buf[256];
  for (int64_t m = 0; m < r.m; ++m) {
    for (int64_t b = 0; b < w.nblocks; ++b) {
      const int64_t k0 = b * w.block, k1 = std::min(w.k, k0 + w.block);
      float absmax = 0.f;
      bool nan = false;
      for (int64_t k = k0; k < k1; ++k) {
        buf[k - k0] = half_to_float(x[m * r.ldx + k]);
        nan |= std::isnan(buf[k - k0]);
        absmax = std::max(absmax, std::fabs(buf[k - k0]));
      }
      const float norm = nan ? 1.f : fp16_path::pow2_normalizer(absmax, fp16_path::kActTop);
      uint16_t* out = s.xh.data() + m * kpad + k0;
      for (int64_t k = k0; k < k1; ++k) out[k - k0] = float_to_half(buf[k - k0] * norm);
      for (int64_t k = k1; k < k0 + w.block; ++k) out[k - k0] = 0;
      s.xsum[m * w.nblocks + b] = 1.f / norm;
    }
  }
  return {&w, r.packed, s.xh.data(), kpad, s.xsum.data(), r.bias, r.y, r.ldy};
}

}  // namespace

void matmul_float16_twin(const MatmulRequest& r) {
  if (r.m <= 0) return;
  if (r.dtype != DType::f16) throw std::invalid_argument("the FP16-arithmetic path takes float16 activations");
  const HalfMatmulArgs args = prepare_half_acts(r, tl_scratch);
  run_tiled(*r.w, r.m, half_float_matmul_twin, half_float_matmul_twin, args);
}

void matmul_float(const MatmulRequest& r) {
  if (r.m <= 0) return;
  const WeightGeometry& w = *r.w;
  const KernelTable& kt = kernels_for_weight(w);
  const int idx = w.bits == 8 ? 1 : 0;
  if (r.dtype == DType::f16 && kt.gemv_half[idx] != nullptr) {
    const HalfMatmulArgs args = prepare_half_acts(r, tl_scratch);
    run_tiled(w, r.m, kt.gemv_half[idx], kt.gemm_half[idx], args);
    return;
  }
  const int64_t kpad = w.padded_k();
  Scratch& s = tl_scratch;
  s.xf.resize(static_cast<size_t>(r.m * kpad));
  s.xsum.resize(static_cast<size_t>(r.m * w.nblocks));
  const FloatActArgs fa{r.x, r.dtype, r.ldx, w.k, w.block, w.nblocks, s.xf.data(), kpad, s.xsum.data()};
  float absmax = kt.prepare_float_acts(fa, 0, r.m);
  // Position-scaled accumulators reach |x| * 2^32 * K: far beyond any real activation, but keep
  // absurd ones finite by scaling x down by an exact power of two (undone in the epilogue).
  float unscale = 1.f;
  if (absmax > 0x1p60f && std::isfinite(absmax)) {
    unscale = 0x1p64f;
    for (float& v : s.xf) v *= 0x1p-64f;
    for (float& v : s.xsum) v *= 0x1p-64f;
  }
  const FloatMatmulArgs args{&w, r.packed, s.xf.data(), kpad, s.xsum.data(), unscale, r.bias, r.y, r.ldy};
  run_tiled(w, r.m, kt.gemv_float[idx], kt.gemm_float[idx], args);
}

}  // namespace qlinear
