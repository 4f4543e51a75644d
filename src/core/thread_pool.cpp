#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "core/tuning.h"

namespace pagellm {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// How long an idle thread polls for new work before blocking.
std::chrono::microseconds spin_time() {
  static const std::chrono::microseconds us(tuning::integer("PAGELLM_SPIN_US"));
  return us;
}

// Polls `ready` for up to spin_time(); true once it holds.
template <typename Pred>
bool spin_until(Pred ready) {
  const auto limit = spin_time();
  if (limit.count() == 0) return ready();
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() - t0 > limit) return ready();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  n_threads = std::max(1, n_threads);
  for (int i = 0; i + 1 < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    const int64_t n = tuning::integer("PAGELLM_NUM_THREADS");
    if (n > 0) return static_cast<int>(n);
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

constexpr int kChunkBits = 20;  // n_threads chunks at most: far below 2^20
constexpr uint64_t kChunkMask = (uint64_t{1} << kChunkBits) - 1;
constexpr int kGenShift = 2 * kChunkBits;

void ThreadPool::run_chunks() {
  uint64_t v = state_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t next = v & kChunkMask, n = (v >> kChunkBits) & kChunkMask;
    if (next >= n) return;  // every chunk of the published job is taken
    if (!state_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;
    const int64_t b = static_cast<int64_t>(next) * job_chunk_, e = std::min(job_n_, b + job_chunk_);
    (*job_)(b, e);
    if (chunks_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<int>(n)) {
      std::lock_guard<std::mutex> lock(mu_);  // pairs with the caller's predicate check
      cv_done_.notify_all();
    }
    v = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;  // generation of the last job looked at
  for (;;) {
    auto has_work = [&] {
      return stop_.load(std::memory_order_acquire) ||
             (state_.load(std::memory_order_acquire) >> kGenShift) != seen;
    };
    if (!spin_until(has_work)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, has_work);
    }
    if (stop_.load()) return;
    seen = state_.load(std::memory_order_acquire) >> kGenShift;
    run_chunks();
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
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = (n + n_chunks - 1) / n_chunks;
  n_chunks_ = static_cast<int>((n + job_chunk_ - 1) / job_chunk_);
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = (state_.load(std::memory_order_relaxed) >> kGenShift) + 1;
  state_.store((gen << kGenShift) | (static_cast<uint64_t>(n_chunks_) << kChunkBits),
               std::memory_order_release);
  {
    // A worker between its predicate check and its wait holds mu_; taking it here means the
    // notify below cannot fall in that gap.
    std::lock_guard<std::mutex> lock(mu_);
  }
  cv_work_.notify_all();
  run_chunks();  // the caller works too
  auto done = [&] { return chunks_done_.load(std::memory_order_acquire) == n_chunks_; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, done);
  }
  job_ = nullptr;
}

}  // namespace pagellm
