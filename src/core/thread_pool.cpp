#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace pagellm {

ThreadPool::ThreadPool(int n_threads) {
  n_threads = std::max(1, n_threads);
  for (int i = 0; i + 1 < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* v = std::getenv("PAGELLM_NUM_THREADS")) {
      int n = std::atoi(v);
      if (n > 0) return n;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (next_chunk_ < n_chunks_) {
      const int c = next_chunk_++;
      const auto* job = job_;
      const int64_t b = c * job_chunk_, e = std::min(job_n_, b + job_chunk_);
      lock.unlock();
      (*job)(b, e);
      lock.lock();
      if (++chunks_done_ == n_chunks_) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = std::max<int64_t>(1, n / grain);
  const int64_t n_chunks = std::min<int64_t>(max_chunks, n_threads());
  if (n_chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = (n + n_chunks - 1) / n_chunks;
  n_chunks_ = static_cast<int>((n + job_chunk_ - 1) / job_chunk_);
  next_chunk_ = 0;
  chunks_done_ = 0;
  ++generation_;
  cv_work_.notify_all();
  // The caller works too.
  while (next_chunk_ < n_chunks_) {
    const int c = next_chunk_++;
    const int64_t b = c * job_chunk_, e = std::min(job_n_, b + job_chunk_);
    lock.unlock();
    fn(b, e);
    lock.lock();
    ++chunks_done_;
  }
  cv_done_.wait(lock, [&] { return chunks_done_ == n_chunks_; });
  job_ = nullptr;
}

}  // namespace pagellm
