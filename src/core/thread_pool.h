// A fixed pool of worker threads for data-parallel loops (the CPU backend's matmul and attention).
// parallel_for splits [0, n) into contiguous chunks, runs them on the workers and the caller, and
// returns when all are done. Threads from PAGELLM_NUM_THREADS, default: all hardware threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pagellm {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n); chunks are at least `grain` long.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool.
  static ThreadPool& global();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int n_chunks_ = 0;
  int next_chunk_ = 0;
  int chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::mutex run_mu_;  // one parallel_for at a time
};

}  // namespace pagellm
