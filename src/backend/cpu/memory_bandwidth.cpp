#include "backend/cpu/memory_bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace pagellm {
namespace {

int64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (f >> key >> value) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

int64_t last_level_cache_bytes() {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return l3;
  // sysconf may not know (containers, some libcs): ask sysfs, index3 being the L3 on x86.
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
  int64_t kib = 0;
  if (f >> kib) return kib * 1024;  // "491520K"
  return int64_t{64} << 20;
}

float scalar_sum(const float* x, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) s0 += x[i], s1 += x[i + 1], s2 += x[i + 2], s3 += x[i + 3];
  for (; i < n; ++i) s0 += x[i];
  return s0 + s1 + s2 + s3;
}

}  // namespace

double measure_read_bandwidth_gbs() {
  // Four times the LLC defeats it; at least 1 GiB so small-cache machines still measure DRAM; at
  // most 2 GiB and a quarter of available memory so the probe never pushes the machine to swap.
  int64_t bytes = std::max<int64_t>(int64_t{1} << 30, 4 * last_level_cache_bytes());
  bytes = std::min<int64_t>(bytes, int64_t{2} << 30);
  bytes = std::min<int64_t>(bytes, available_memory_bytes() / 4);
  bytes = bytes / 4096 * 4096;
  if (bytes < (int64_t{64} << 20)) return 0.0;
  void* mem = std::aligned_alloc(4096, static_cast<size_t>(bytes));
  if (!mem) return 0.0;
  std::unique_ptr<void, decltype(&std::free)> guard(mem, &std::free);
  float* data = static_cast<float*>(mem);
  const int64_t n = bytes / 4;

  ThreadPool& pool = ThreadPool::global();
  constexpr int64_t kGrain = int64_t{1} << 20;  // floats per chunk at least (4 MiB)
  // First touch from the pool's threads, so pages land where they will be read (NUMA).
  pool.parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) data[i] = 1.0f;
  });

  const cpu::Kernels* k = cpu::cpu_kernels();
  auto sum = k ? k->read_sum : &scalar_sum;
  std::atomic<float> sink{0.0f};  // keeps the reads from being optimized away
  double best = 0.0;
  for (int run = 0; run < 10; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      const float s = sum(data + b, e - b);
      float cur = sink.load(std::memory_order_relaxed);
      while (!sink.compare_exchange_weak(cur, cur + s, std::memory_order_relaxed)) {
      }
    });
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / secs / 1e9);
  }
  return sink.load() < 0 ? 0.0 : best;
}

}  // namespace pagellm
