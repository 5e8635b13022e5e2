#include "qlinear/core/matmul.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "qlinear/core/fp16_path.h"
#include "qlinear/core/threadpool.h"

namespace qlinear {

namespace {

// Per calling thread, reused across calls: decode issues thousands of calls, none allocates.
struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  std::vector<float> scaled_sum;
  std::vector<int32_t> shifted_sum;
  std::vector<int32_t> sum16;  // block formats
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

namespace {

// Whether the table has a kernel of the weight's block format.
bool has_block_kernel(const KernelTable& kt, Format f, bool float_acts) {
  const auto has = [f](const auto& kernels) {
    for (const auto& k : kernels)
      if (k.format == f) return true;
    return false;
  };
  return float_acts ? has(kt.blocks_float) : has(kt.blocks);
}

// A block format's kernels: the active level's where it has them, else the scalar ones.
const KernelTable& block_kernels_for(const WeightGeometry& w, bool float_acts) {
  const KernelTable& kt = active_kernels();
  return has_block_kernel(kt, w.format, float_acts) ? kt : scalar_kernels();
}

}  // namespace

const KernelTable& kernels_for_weight(const WeightGeometry& w) {
  if (w.is_block_format()) return block_kernels_for(w, false);
  const KernelTable* table = table_for(active_kernels(), w);
  return table != nullptr ? *table : scalar_kernels();
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

namespace {

// The kernels of an M-row request: the first descriptor (in the table's order of preference)
// that serves M takes the whole multiples of its m_unit; the first that serves the rows left
// and reads the same activation packing (code_shift) takes them.
template <class U>
struct Plan {
  struct Segment { const U* k; int64_t m0, m1; };
  Segment seg[2];
  int count = 0;
};

template <class U>
const U* first_serving(const std::vector<U>& kernels, int bits, Format format, int64_t m, const U* like) {
  for (const U& k : kernels)
    if (k.format == format && k.serves(bits, m) && (like == nullptr || k.code_shift == like->code_shift)) return &k;
  return nullptr;
}

template <class U>
Plan<U> plan(const std::vector<U>& kernels, const WeightGeometry& w, int64_t m) {
  const int bits = w.bits;
  Plan<U> p;
  const U* k = first_serving(kernels, bits, w.format, m, static_cast<const U*>(nullptr));
  if (k == nullptr) throw std::logic_error("no kernel serves " + std::to_string(m) + " rows of " + std::to_string(bits) + "-bit weights");
  const int64_t whole = m / k->m_unit * k->m_unit;
  p.seg[p.count++] = {k, 0, whole};
  if (whole < m) {
    const U* rest = first_serving(kernels, bits, w.format, m - whole, k);
    if (rest == nullptr) throw std::logic_error("no kernel serves the last " + std::to_string(m - whole) + " rows");
    p.seg[p.count++] = {rest, whole, m};
  }
  return p;
}

// Runs kernel k on rows [m0, m1) over the thread pool. One row (GEMV): panels split over a few
// tasks per thread, taken dynamically (a thread that is slow to start, or a core taken by
// another process, leaves its share to the others). More rows (GEMM): tasks of a few panels,
// whose weights stay in L2 while every row block passes over them; rows are split too (in the
// kernel's row units) when there are too few panel tasks to keep the threads busy.
template <class U, class Args>
void run_kernel(const WeightGeometry& w, const U& k, int64_t m0, int64_t m1, const Args& args) {
  ThreadPool& pool = ThreadPool::global();
  const int64_t m = m1 - m0, np = k.np;
  const int64_t work = m * w.npanels * w.nr * w.padded_k();
  constexpr int64_t kStreamedRows = 8;  // a batch of decode steps: still a stream of the weights
  if (m <= std::max<int64_t>(k.mr, kStreamedRows)) {
    // A GEMV, or a GEMM of a few rows (a panel's tiles pass over it while it is in L1): one
    // long weight stream per thread (AVX2 on Zen 4, 8 rows in two 4-row tiles: the step's
    // matmuls 20.1 -> 17.8 ms). Two tasks per thread, taken dynamically: the first `threads`
    // cover 3/4 of the panels, the last `threads` the rest, so each thread streams one long run
    // and the threads finish together on short ones; a thread that is slow to start (or a core taken by another
    // process) leaves its share to the others. More, shorter tasks measured slower (each
    // restart of a weight stream costs), e.g. decode of a 0.5B model at 2 threads 142 -> 151
    // tokens/s going from 4 equal tasks per thread to this.
    constexpr int64_t kMinPanelsPerTask = 4;
    const int64_t threads = work < kMinParallelWork ? 1
        : std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), w.npanels / (2 * kMinPanelsPerTask)));
    const int64_t tasks = threads == 1 ? 1 : 2 * threads, long_part = w.npanels * 3 / 4;
    // task boundaries on whole register tiles (np panels)
    const auto bound = [&](int64_t t) {
      const int64_t b = tasks == 1 ? w.npanels * t
          : t <= threads ? long_part * t / threads
                         : long_part + (w.npanels - long_part) * (t - threads) / threads;
      return std::min(w.npanels, round_up(b, np));
    };
    auto task = [&](int64_t t) {
      if (bound(t) < bound(t + 1)) k.fn(args, m0, m1, bound(t), bound(t + 1));
    };
    pool.run(tasks, TaskRef(task));
    return;
  }
  const int threads = work < kMinParallelWork ? 1 : pool.num_threads();
  const int64_t panels_per_task = round_up(4, np);
  const int64_t row_unit = k.m_unit > 1 ? k.m_unit : k.mr;
  const int64_t panel_tasks = ceil_div(w.npanels, panels_per_task);
  const int64_t row_tasks = panel_tasks >= 2 * threads ? 1
      : std::min(ceil_div(m, row_unit), ceil_div(2 * threads, panel_tasks));
  const int64_t rows_per_task = round_up(ceil_div(m, row_tasks), row_unit);
  auto task = [&](int64_t t) {
    const int64_t pt = t % panel_tasks, rt = t / panel_tasks;
    const int64_t p0 = pt * panels_per_task, p1 = std::min(w.npanels, p0 + panels_per_task);
    const int64_t r0 = m0 + rt * rows_per_task, r1 = std::min(m1, r0 + rows_per_task);
    if (r0 < r1) k.fn(args, r0, r1, p0, p1);
  };
  if (threads == 1) {
    for (int64_t t = 0; t < panel_tasks * row_tasks; ++t) task(t);
  } else {
    pool.run(panel_tasks * row_tasks, TaskRef(task));
  }
}

template <class U, class Args>
void run_plan(const WeightGeometry& w, const Plan<U>& p, const Args& args) {
  for (int i = 0; i < p.count; ++i) run_kernel(w, *p.seg[i].k, p.seg[i].m0, p.seg[i].m1, args);
}

// The sums of every 16 int8 activations (the block formats' sub-block sums).
void sums_of_16(const int8_t* q, int64_t ldq, int64_t m, int64_t kpad, int32_t* out) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < kpad / 16; ++j) {
      int32_t t = 0;
      for (int l = 0; l < 16; ++l) t += q[i * ldq + 16 * j + l];
      out[i * (kpad / 16) + j] = t;
    }
}

// Activation packing for an int8 request read by kernels of the given code_shift.
Int8MatmulArgs pack_int8_acts(const KernelTable& kt, const MatmulRequest& r, int32_t code_shift, bool threaded) {
  const WeightGeometry& w = *r.w;
  const int64_t kpad = w.padded_k(), ldq = activation_stride(kpad);
  Scratch& s = tl_scratch;
  s.q.resize(static_cast<size_t>(r.m * ldq));
  for (auto* v : {&s.scale, &s.scaled_sum}) v->resize(static_cast<size_t>(r.m * w.nblocks));
  for (auto* v : {&s.sum, &s.shifted_sum}) v->resize(static_cast<size_t>(r.m * w.nblocks));
  const int64_t ld16 = kpad / 16;
  if (w.is_block_format()) s.sum16.resize(static_cast<size_t>(r.m * ld16));
  const ActQuantArgs qa{r.x, r.dtype, r.ldx, w.k, w.block, w.nblocks, r.act_block,
                        s.q.data(), ldq, s.scale.data(), s.sum.data(),
                        s.scaled_sum.data(), s.shifted_sum.data(), code_shift - w.zero_point()};
  if (threaded && r.m * w.k >= kMinParallelWork / 16) {
    ThreadPool::global().parallel_for(r.m, 4, [&](int64_t m0, int64_t m1) { kt.quantize_acts(qa, m0, m1); });
  } else {
    kt.quantize_acts(qa, 0, r.m);
  }
  if (w.is_block_format()) sums_of_16(s.q.data(), ldq, r.m, kpad, s.sum16.data());
  return {&w, r.packed,
          {s.q.data(), ldq, s.scale.data(), s.sum.data(), s.scaled_sum.data(), s.shifted_sum.data(),
           w.is_block_format() ? s.sum16.data() : nullptr, ld16},
          r.bias, r.y, r.ldy};
}

}  // namespace

namespace {

// A weight of parts: each part's matmul into its columns of y.
template <class Fn>
void for_parts(const MatmulRequest& r, Fn&& fn) {
  for (const WeightPart& part : *r.w->parts) {
    MatmulRequest sub = r;
    sub.w = &part.g;
    sub.packed = r.packed + part.offset;
    sub.bias = r.bias ? r.bias + part.row0 : nullptr;
    sub.y = r.y + part.row0;
    fn(sub);
  }
}

}  // namespace

void matmul_int8(const MatmulRequest& r) {
  if (r.m <= 0) return;
  if (r.w->is_composite()) return for_parts(r, matmul_int8);
  const KernelTable& kt = kernels_for_weight(*r.w);
  const auto p = plan(r.w->is_block_format() ? kt.blocks : kt.int8, *r.w, r.m);
  run_plan(*r.w, p, pack_int8_acts(kt, r, p.seg[0].k->code_shift, true));
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

namespace {

// Float activations copied zero-padded to the padded K with their block sums.
FloatMatmulArgs prepare_float(const KernelTable& kt, const MatmulRequest& r) {
  const WeightGeometry& w = *r.w;
  const int64_t kpad = w.padded_k();
  Scratch& s = tl_scratch;
  s.xf.resize(static_cast<size_t>(r.m * kpad));
  s.xsum.resize(static_cast<size_t>(r.m * w.nblocks));
  const FloatActArgs fa{r.x, r.dtype, r.ldx, w.k, w.block, w.nblocks, s.xf.data(), kpad, s.xsum.data()};
  const float absmax = kt.prepare_float_acts(fa, 0, r.m);
  // Position-scaled accumulators reach |x| * 2^32 * K: far beyond any real activation, but keep
  // absurd ones finite by scaling x down by an exact power of two (undone in the epilogue).
  float unscale = 1.f;
  if (absmax > 0x1p60f && std::isfinite(absmax)) {
    unscale = 0x1p64f;
    for (float& v : s.xf) v *= 0x1p-64f;
    for (float& v : s.xsum) v *= 0x1p-64f;
  }
  return {&w, r.packed, s.xf.data(), kpad, s.xsum.data(), unscale, r.bias, r.y, r.ldy};
}

// The FP16-arithmetic kernels serve fp16 activations where the level has them.
bool takes_half_path(const KernelTable& kt, const MatmulRequest& r) {
  return r.dtype == DType::f16 && !kt.float16.empty();
}

}  // namespace

void matmul_float16_twin(const MatmulRequest& r) {
  if (r.m <= 0) return;
  if (r.dtype != DType::f16) throw std::invalid_argument("the FP16-arithmetic path takes float16 activations");
  const HalfMatmulArgs args = prepare_half_acts(r, tl_scratch);
  const HalfUkernel twin{"half_float_matmul_twin", half_float_matmul_twin, r.w->bits, 1, 1, 1};
  run_kernel(*r.w, twin, 0, r.m, args);
}

void matmul_float(const MatmulRequest& r) {
  if (r.m <= 0) return;
  if (r.w->is_composite()) return for_parts(r, matmul_float);
  const WeightGeometry& w = *r.w;
  if (w.is_block_format()) {
    const KernelTable& kt = block_kernels_for(w, true);
    run_plan(w, plan(kt.blocks_float, w, r.m), prepare_float(kt, r));
    return;
  }
  const KernelTable& kt = kernels_for_weight(w);
  if (takes_half_path(kt, r)) {
    run_plan(w, plan(kt.float16, w, r.m), prepare_half_acts(r, tl_scratch));
  } else {
    run_plan(w, plan(kt.float32, w, r.m), prepare_float(kt, r));
  }
}

namespace {

template <class U>
void describe(const Plan<U>& p, int nr, std::vector<PlannedKernel>& out) {
  for (int i = 0; i < p.count; ++i) {
    const U& k = *p.seg[i].k;
    out.push_back({k.name, k.mr, k.np * nr, p.seg[i].m0, p.seg[i].m1});
  }
}

}  // namespace

std::vector<PlannedKernel> planned_kernels(const WeightGeometry& w, int64_t m, Family family) {
  std::vector<PlannedKernel> out;
  if (m <= 0) return out;
  if (w.is_composite()) {
    for (const WeightPart& part : *w.parts)
      for (const PlannedKernel& k : planned_kernels(part.g, m, family)) out.push_back(k);
    return out;
  }
  if (w.is_block_format()) {
    const bool fl = family != Family::int8;
    const KernelTable& kt = block_kernels_for(w, fl);
    if (fl) describe(plan(kt.blocks_float, w, m), w.nr, out);
    else describe(plan(kt.blocks, w, m), w.nr, out);
    return out;
  }
  const KernelTable& kt = kernels_for_weight(w);
  if (family == Family::int8) describe(plan(kt.int8, w, m), w.nr, out);
  else if (family == Family::float16 && !kt.float16.empty()) describe(plan(kt.float16, w, m), w.nr, out);
  else describe(plan(kt.float32, w, m), w.nr, out);
  return out;
}

namespace {

template <class U>
void check_runs(const KernelTable& kt, const U& k, const MatmulRequest& r) {
  const WeightGeometry& w = *r.w;
  if (k.format != w.format)
    throw std::invalid_argument(std::string(k.name) + " reads another weight format than the weight's");
  if (!w.is_block_format() && kt.isa != Isa::scalar && !table_reads(kt, w))
    throw std::invalid_argument(std::string(k.name) + " reads another layout than the weight's");
  if (!k.serves(w.bits, r.m) || r.m % k.m_unit != 0)
    throw std::invalid_argument(std::string(k.name) + " does not serve " + std::to_string(r.m) + " rows of " +
                                std::to_string(w.bits) + "-bit weights");
}

}  // namespace

void run_ukernel(const KernelTable& kt, Family family, size_t index, const MatmulRequest& r) {
  const WeightGeometry& w = *r.w;
  if (w.is_composite()) throw std::invalid_argument("a weight of parts runs through the driver, not one kernel");
  if (family == Family::int8) {
    const Int8Ukernel& k = (w.is_block_format() ? kt.blocks : kt.int8).at(index);
    check_runs(kt, k, r);
    k.fn(pack_int8_acts(kt, r, k.code_shift, false), 0, r.m, 0, w.npanels);
  } else if (family == Family::float32 || w.is_block_format()) {
    const FloatUkernel& k = (w.is_block_format() ? kt.blocks_float : kt.float32).at(index);
    check_runs(kt, k, r);
    k.fn(prepare_float(kt, r), 0, r.m, 0, w.npanels);
  } else {
    const HalfUkernel& k = kt.float16.at(index);
    check_runs(kt, k, r);
    if (r.dtype != DType::f16) throw std::invalid_argument(std::string(k.name) + " takes float16 activations");
    k.fn(prepare_half_acts(r, tl_scratch), 0, r.m, 0, w.npanels);
  }
}

}  // namespace qlinear
