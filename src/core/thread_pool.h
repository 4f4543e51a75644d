// A fixed pool of worker threads for data-parallel loops (the CPU backend's matmul and attention).
// parallel_for splits [0, n) into contiguous chunks, runs them on the workers and the caller, and
// returns when all are done. Threads from PAGELLM_NUM_THREADS, default: all hardware threads.
// Idle workers spin for a short while (PAGELLM_SPIN_US microseconds, default 200) before sleeping,
// so back-to-back loops (a decode step is hundreds of small matmuls) do not pay a futex wake-up
// each; chunks are claimed with an atomic counter, not under a lock.
#pragma once

#include <atomic>
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
  // Claims and runs chunks of the current job until none is left.
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;  // guards sleeping on the two condition variables
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  // The current job. Written by parallel_for before state_ publishes it; read by a worker only
  // after it has claimed one of its chunks, and the caller waits for every chunk before writing
  // the next job, so reads and writes never overlap.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int n_chunks_ = 0;
  // generation << 40 | n_chunks << 20 | next chunk: one word, so that a claim (a CAS) can never
  // take a chunk of one job with the bounds of another.
  std::atomic<uint64_t> state_{0};
  std::atomic<int> chunks_done_{0};
  std::atomic<bool> stop_{false};
  std::mutex run_mu_;  // one parallel_for at a time
};

}  // namespace pagellm
