// Shared set-up of the CUDA micro-benchmarks: the backend (made once per process, or why not),
// a paged KV cache with its attention metadata, and timing kReps back-to-back calls with the
// backend's own timer (CUDA events on its stream).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace pagellm::bench {

// The CUDA backend of device 0, or nullptr with `why` set.
inline Backend* cuda_or_null(std::string& why) {
  static std::unique_ptr<Backend> backend;
  static std::string status;
  static bool tried = false;
  if (!tried) {
    tried = true;
    auto r = make_cuda_backend(0);
    if (r.ok())
      backend = std::move(r).value();
    else
      status = r.status().to_string();
  }
  why = status;
  return backend.get();
}

// The CUDA backend, or nullptr after marking the benchmark skipped with the reason.
inline Backend* cuda_or_skip(benchmark::State& state) {
  std::string why;
  Backend* be = cuda_or_null(why);
  if (be == nullptr) state.SkipWithError(("CUDA backend unavailable: " + why).c_str());
  return be;
}

// n_seqs sequences of `len` cached tokens each in blocks of `block` tokens, sequence s owning
// blocks s * blocks_per_seq ... (the layout a fresh pool hands out), `q_per_seq` queries each (the
// last ones). The metadata lives on the device; max_seqlen_kv is `plan_len` (>= len), the bound a
// step is planned for (a decode graph plans for max_model_len).
struct PagedBatch {
  std::vector<std::unique_ptr<Buffer>> bufs;
  AttentionMeta meta;
  int64_t n_blocks = 0;
};
inline PagedBatch paged_batch(Backend& be, int32_t n_seqs, int32_t len, int32_t q_per_seq,
                              int32_t block, int32_t plan_len) {
  PagedBatch b;
  const int64_t blocks_per_seq = (len + block - 1) / block;
  b.n_blocks = n_seqs * blocks_per_seq;
  std::vector<int32_t> cu(n_seqs + 1), lens(n_seqs, len), table(b.n_blocks);
  for (int32_t s = 0; s <= n_seqs; ++s) cu[s] = s * q_per_seq;
  for (int64_t i = 0; i < b.n_blocks; ++i) table[i] = static_cast<int32_t>(i);
  auto upload = [&](const std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
    b.bufs.push_back(be.allocate(static_cast<int64_t>(v.size()) * 4));
    be.copy_from_host(b.bufs.back()->data(), v.data(), static_cast<int64_t>(v.size()) * 4);
    return b.bufs.back()->view(DType::kI32, shape);
  };
  b.meta.n_seqs = n_seqs;
  b.meta.cu_seqlens_q = upload(cu, {n_seqs + 1});
  b.meta.seq_lens_kv = upload(lens, {n_seqs});
  b.meta.block_tables = upload(table, {n_seqs, blocks_per_seq});
  b.meta.block_size = block;
  b.meta.max_seqlen_q = q_per_seq;
  b.meta.max_seqlen_kv = plan_len;
  b.meta.total_kv_tokens = static_cast<int64_t>(n_seqs) * len;
  int64_t pairs = 0;  // causal (query, key) pairs of one sequence
  for (int32_t i = 0; i < q_per_seq; ++i) pairs += len - q_per_seq + i + 1;
  b.meta.total_qk_pairs = pairs * n_seqs;
  return b;
}

// Seconds per call of `call`, timed as kReps back-to-back calls between two timer marks (launch
// gaps hide behind queued work); one benchmark iteration per interval, manual time.
inline double time_calls(Backend& be, benchmark::State& state, int reps,
                         const std::function<void()>& call) {
  for (int i = 0; i < 3; ++i) call();  // warm-up: plans, workspaces, module loads
  be.synchronize();
  auto timer = be.make_op_timer();
  double total_s = 0.0;
  for (auto _ : state) {
    timer->reset();
    const int a = timer->mark();
    for (int r = 0; r < reps; ++r) call();
    const int b = timer->mark();
    be.synchronize();
    const double s = timer->elapsed_ms(a, b) / 1e3 / reps;
    state.SetIterationTime(s);
    total_s += s;
  }
  return state.iterations() > 0 ? total_s / static_cast<double>(state.iterations()) : 0.0;
}

}  // namespace pagellm::bench
