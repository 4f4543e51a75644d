// One-off measurement behind a design choice (docs/PERF.md, "CPU kernels"): is OpenBLAS's sgemm
// faster than our blocked GEMM on f32 weights for prefill shapes? Not part of the build (it needs
// libopenblas-dev); build it by hand against a build tree:
//   g++ -O3 -std=c++20 -Isrc bench/micro/cpu_gemm_openblas_compare.cpp \
//       build/<dir>/src/libpagellm_backend_cpu.a build/<dir>/src/libpagellm_core.a \
//       -lopenblas -pthread -o cpu_gemm_openblas_compare
//   OPENBLAS_NUM_THREADS=<t> PAGELLM_NUM_THREADS=<t> ./cpu_gemm_openblas_compare
// Prints GFLOP/s (best of 10 after a warm-up) for out[n, M] = x[n, K] @ w[M, K]^T.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/backend.h"

int main() {
  using namespace pagellm;
  auto be = make_cpu_backend(true);
  struct Shape { int n, m, k; };
  for (Shape s : {Shape{128, 2048, 2048}, Shape{512, 2048, 2048}, Shape{128, 8192, 2048},
                  Shape{128, 2048, 8192}, Shape{32, 4096, 4096}}) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1, 1);
    std::vector<float> x(size_t(s.n) * s.k), w(size_t(s.m) * s.k), o1(size_t(s.n) * s.m), o2(o1.size());
    for (auto& v : x) v = dist(rng);
    for (auto& v : w) v = dist(rng);
    Tensor xt(x.data(), DType::kF32, {s.n, s.k}), wt(w.data(), DType::kF32, {s.m, s.k});
    Tensor ot(o1.data(), DType::kF32, {s.n, s.m});
    auto best = [](auto&& fn) {
      fn();
      double b = 1e30;
      for (int i = 0; i < 10; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        b = std::min(b, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return b;
    };
    const double t_ours = best([&] { be->matmul(xt, wt, Tensor(), ot); });
    const double t_blas = best([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.n, s.m, s.k, 1.0f, x.data(), s.k,
                  w.data(), s.k, 0.0f, o2.data(), s.m);
    });
    double max_diff = 0;
    for (size_t i = 0; i < o1.size(); ++i) max_diff = std::max(max_diff, double(std::abs(o1[i] - o2[i])));
    const double flop = 2.0 * s.n * s.m * s.k;
    std::printf("n=%4d M=%5d K=%5d  %s %7.1f GFLOP/s  openblas %7.1f GFLOP/s  max|diff| %.2e\n",
                s.n, s.m, s.k, be->name().c_str(), flop / t_ours / 1e9, flop / t_blas / 1e9, max_diff);
  }
}
