// A small persistent thread pool (no OpenMP): the calling thread plus num_threads - 1 workers.
// Workers spin briefly after a job (decode issues thousands of short jobs back to back), then
// sleep on a condition variable. One job runs at a time; a call made while another thread's
// job runs, or from inside a job, runs inline on the calling thread, so concurrent callers
// never deadlock or wait on each other.
//
// Tasks are handed out dynamically, and the caller waits for the tasks, not for the workers: a
// worker that is not running when a job starts (descheduled on a busy machine, still waking
// up) simply does not join it, and the caller does its share. Without that, a machine with
// more runnable threads than cores turns every one of decode's short jobs into a wait of a
// scheduler time slice.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace qlinear {

// A non-owning reference to a callable void(int64_t): no allocation per job.
class TaskRef {
 public:
  template <class F>
  TaskRef(F& f) : obj_(&f), call_([](void* o, int64_t t) { (*static_cast<F*>(o))(t); }) {}
  void operator()(int64_t task) const { call_(obj_, task); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t);
};

class ThreadPool {
 public:
  static ThreadPool& global();
  ~ThreadPool();

  int num_threads() const { return num_threads_.load(std::memory_order_relaxed); }
  void set_num_threads(int n);  // n >= 1; waits for a running job to finish

  // Calls fn(task) for each task in [0, ntasks), tasks handed out dynamically to the caller and
  // the workers; returns when all are done.
  void run(int64_t ntasks, TaskRef fn);

  // Splits [0, n) into at most num_threads() contiguous chunks of at least `grain` items and
  // calls fn(begin, end) for each.
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(num_threads(), (n + grain - 1) / grain));
    auto task = [&](int64_t c) { fn(n * c / chunks, n * (c + 1) / chunks); };
    run(chunks, TaskRef(task));
  }

 private:
  explicit ThreadPool(int n);
  void start_workers(int count);
  void stop_workers();
  void worker_loop(uint64_t seen);
  void work_on_job();

  std::atomic<int> num_threads_{1};
  std::mutex job_mutex_;            // held by the thread whose job is running
  std::vector<std::thread> workers_;

  bool try_join(uint64_t gen);

  // The current job, written by its owner before it opens the job.
  const TaskRef* job_fn_ = nullptr;
  int64_t job_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<int64_t> tasks_done_{0};
  // (generation of the open job << 16) | workers inside it. A worker joins only while its
  // generation is open; the owner closes the job (generation bits 0) when every task is done
  // and then waits for the workers inside to leave.
  std::atomic<uint64_t> job_state_{0};

  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
};

}  // namespace qlinear
