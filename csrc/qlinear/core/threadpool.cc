#include "qlinear/core/threadpool.h"

#include <algorithm>
#include <cstdlib>

#include "qlinear/core/cpu.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define QLINEAR_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define QLINEAR_PAUSE() __asm__ volatile("yield")
#else
#define QLINEAR_PAUSE() ((void)0)
#endif

namespace qlinear {

namespace {
thread_local bool tl_inside_job = false;
constexpr int kSpinIterations = 1 << 16;  // ~1-2 ms of PAUSE before a worker sleeps
}  // namespace

// Default thread count: QLINEAR_NUM_THREADS if set, else the (fast) physical cores.
static int default_threads() {
  if (const char* env = std::getenv("QLINEAR_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return cpu_features().physical_cores;
}

ThreadPool& ThreadPool::global() {
  // Leaked on purpose: workers must not be joined during static destruction at exit.
  static ThreadPool* pool = new ThreadPool(default_threads());
  return *pool;
}

ThreadPool::ThreadPool(int n) { set_num_threads(n); }

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::set_num_threads(int n) {
  n = std::max(1, n);
  std::lock_guard<std::mutex> lock(job_mutex_);
  if (n == num_threads() && int(workers_.size()) == n - 1) return;
  stop_workers();
  num_threads_.store(n);
  start_workers(n - 1);
}

void ThreadPool::start_workers(int count) {
  stopping_.store(false);
  // Workers start from the current generation: a job published before a worker thread first
  // runs is still seen as new by it.
  const uint64_t gen = generation_.load();
  for (int i = 0; i < count; ++i) workers_.emplace_back([this, gen] { worker_loop(gen); });
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stopping_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::work_on_job() {
  const int64_t ntasks = job_tasks_;
  int64_t done = 0;
  for (int64_t t = next_task_.fetch_add(1, std::memory_order_relaxed); t < ntasks;
       t = next_task_.fetch_add(1, std::memory_order_relaxed)) {
    (*job_fn_)(t);
    ++done;
  }
  if (done) tasks_done_.fetch_add(done, std::memory_order_release);
}

bool ThreadPool::try_join(uint64_t gen) {
  uint64_t s = job_state_.load(std::memory_order_acquire);
  while ((s >> 16) == (gen & ((uint64_t(1) << 48) - 1)))
    if (job_state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) return true;
  return false;
}

void ThreadPool::worker_loop(uint64_t seen) {
  tl_inside_job = true;  // a job's task that calls run() again runs inline
  for (;;) {
    uint64_t gen = seen;
    for (int spin = 0; spin < kSpinIterations; ++spin) {
      gen = generation_.load(std::memory_order_acquire);
      if (gen != seen || stopping_.load(std::memory_order_relaxed)) break;
      QLINEAR_PAUSE();
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      sleepers_.fetch_add(1);
      wake_.wait(lock, [&] {
        // seq_cst pairs with run(): either it sees this sleeper or this sees its generation.
        return generation_.load() != seen || stopping_.load();
      });
      sleepers_.fetch_sub(1);
      gen = generation_.load(std::memory_order_acquire);
    }
    if (stopping_.load()) return;
    seen = gen;
    if (try_join(gen)) {
      work_on_job();
      job_state_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

void ThreadPool::run(int64_t ntasks, TaskRef fn) {
  if (ntasks <= 0) return;
  const auto run_inline = [&] {
    const bool was_inside = tl_inside_job;
    tl_inside_job = true;
    for (int64_t t = 0; t < ntasks; ++t) fn(t);
    tl_inside_job = was_inside;
  };
  if (ntasks == 1 || num_threads() == 1 || tl_inside_job) return run_inline();
  std::unique_lock<std::mutex> lock(job_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || workers_.empty()) return run_inline();

  job_fn_ = &fn;
  job_tasks_ = ntasks;
  next_task_.store(0, std::memory_order_relaxed);
  tasks_done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
  job_state_.store((gen & ((uint64_t(1) << 48) - 1)) << 16, std::memory_order_release);  // open
  generation_.store(gen);  // seq_cst: see worker_loop
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> sleep_lock(sleep_mutex_);
    wake_.notify_all();
  }
  tl_inside_job = true;
  work_on_job();
  tl_inside_job = false;
  const auto wait = [](auto&& done) {
    for (int spin = 0; !done(); ++spin) {
      if (spin < kSpinIterations) QLINEAR_PAUSE();
      else std::this_thread::yield();
    }
  };
  wait([&] { return tasks_done_.load(std::memory_order_acquire) == ntasks; });
  // Close the job, then let the workers inside leave before its state may be reused.
  uint64_t s = job_state_.load(std::memory_order_relaxed);
  while (!job_state_.compare_exchange_weak(s, s & 0xFFFF, std::memory_order_acq_rel)) {
  }
  wait([&] { return (job_state_.load(std::memory_order_acquire) & 0xFFFF) == 0; });
}

}  // namespace qlinear
