// The device sampler's lean path: a call whose every row only takes the argmax (greedy, no edits,
// no logprobs, not skipped) needs one pass over its logits and none of the general kernel's
// machinery (sampling.cu: the edit bitmap, the key ranges the other modes need, cluster
// exchanges of a dozen statistics). Each row is spread over G blocks of a plain grid; each block
// reduces its slice to (argmax, first NaN, first +inf, anything above -inf), and the row's last
// block to finish (an atomic count) merges the G partials and writes the row's result. The
// result is the general kernel's, field for field (op test Sampling.GreedyRowsTakeTheLeanKernel).
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;     // tokens a thread loads at once (16 bytes of bf16)
constexpr int kUnroll = 4;  // such loads a thread has in flight
constexpr int kMaxGroup = 32;
// Below this many tokens a block, a row takes fewer blocks: the merge would cost more than the
// extra blocks save.
constexpr int32_t kMinSlice = 8192;

// What a slice (then the whole row) holds: its argmax among values above -inf (the lowest id on
// ties; -0 and +0 tie, as the general kernel's keys do), its first NaN and first +inf, and
// whether any value is above -inf. INT_MAX: none.
struct ArgmaxStats {
  float best;
  int32_t best_id;
  int32_t first_nan;
  int32_t first_inf;
  int32_t finite;
};

__device__ __forceinline__ ArgmaxStats empty_stats() {
  return {-INFINITY, INT_MAX, INT_MAX, INT_MAX, 0};
}

__device__ __forceinline__ void consider(ArgmaxStats& s, float r, int32_t t) {
  if (!(r < INFINITY)) {  // NaN or +inf: the row is an error
    if (r != r) {
      s.first_nan = min(s.first_nan, t);
    } else {
      s.first_inf = min(s.first_inf, t);
    }
  } else if (r > -INFINITY) {
    s.finite = 1;
    if (r > s.best || (r == s.best && t < s.best_id)) {
      s.best = r;
      s.best_id = t;
    }
  }
}

__device__ __forceinline__ void merge(ArgmaxStats& s, const ArgmaxStats& o) {
  s.first_nan = min(s.first_nan, o.first_nan);
  s.first_inf = min(s.first_inf, o.first_inf);
  s.finite |= o.finite;
  if (o.best_id != INT_MAX &&
      (s.best_id == INT_MAX || o.best > s.best || (o.best == s.best && o.best_id < s.best_id))) {
    s.best = o.best;
    s.best_id = o.best_id;
  }
}

__device__ __forceinline__ ArgmaxStats warp_merge(ArgmaxStats s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgmaxStats u;
    u.best = __shfl_xor_sync(0xffffffffu, s.best, o);
    u.best_id = __shfl_xor_sync(0xffffffffu, s.best_id, o);
    u.first_nan = __shfl_xor_sync(0xffffffffu, s.first_nan, o);
    u.first_inf = __shfl_xor_sync(0xffffffffu, s.first_inf, o);
    u.finite = __shfl_xor_sync(0xffffffffu, s.finite, o);
    merge(s, u);
  }
  return s;
}

struct GreedyArgs {
  const char* logits;
  bool bf16;
  int64_t row_bytes;  // between logits rows
  int32_t vocab;
  int32_t n_rows;
  int32_t group;                         // blocks a row
  int32_t slice;                         // tokens a block, a multiple of kVec
  const DeviceSampleRow* rows;           // on the device; null when logits_row has them
  int32_t logits_row[kGreedyParamRows];  // the rows' logits rows, when n_rows fits
  DeviceSampleResult* results;
  int32_t* handover;      // null, or [0] = n_rows, [1 + i] = row i's token for the next step
  ArgmaxStats* partials;  // [n_rows * group]
  int32_t* counters;      // [n_rows], zero between calls
};

// Eight logits from token t0 of `row` (t0 a multiple of kVec); those at or past `hi` are never
// considered, so what they hold does not matter.
__device__ __forceinline__ void load8(const char* row, bool is_bf16, bool vec, int32_t t0,
                                      int32_t hi, float (&v)[kVec]) {
  if (vec && t0 + kVec <= hi) {
    if (is_bf16) {
      unpack_bf16x8(*reinterpret_cast<const uint4*>(row + int64_t{t0} * 2), v);
    } else {
      const float4 a = *reinterpret_cast<const float4*>(row + int64_t{t0} * 4);
      const float4 b = *reinterpret_cast<const float4*>(row + int64_t{t0} * 4 + 16);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
      v[7] = b.w;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int32_t t = t0 + j;
    v[j] = t >= hi   ? 0.0f
           : is_bf16 ? __bfloat162float(reinterpret_cast<const bf16*>(row)[t])
                     : reinterpret_cast<const float*>(row)[t];
  }
}

// The row's result from its merged statistics, in the general kernel's order of precedence.
__device__ void finish_row(const GreedyArgs& a, int row_index, const ArgmaxStats& s) {
  DeviceSampleStatus status = DeviceSampleStatus::kOk;
  int32_t detail = -1;
  if (s.first_nan != INT_MAX || s.first_inf != INT_MAX) {
    const bool nan_first = s.first_nan < s.first_inf;
    status = nan_first ? DeviceSampleStatus::kNan : DeviceSampleStatus::kPosInf;
    detail = nan_first ? s.first_nan : s.first_inf;
  } else if (!s.finite) {
    status = DeviceSampleStatus::kAllNegInf;
  }
  const bool ok = status == DeviceSampleStatus::kOk;
  DeviceSampleResult* res = a.results + row_index;
  res->token = ok ? s.best_id : -1;
  res->status = status;
  res->detail = detail;
  res->logprob = 0.0f;
  res->rank = 0;
  res->n_top = 0;
  if (a.handover != nullptr) {  // as sampled_token_for (device_sample.h) reads a result
    a.handover[1 + row_index] = ok && s.best_id >= 0 ? s.best_id : 0;
    if (row_index == 0) a.handover[0] = a.n_rows;
  }
}

__global__ void __launch_bounds__(kThreads) greedy_sample_kernel(GreedyArgs a) {
  __shared__ ArgmaxStats warp_stats[kWarps];
  __shared__ bool last;
  pdl_wait();  // the logits come from the kernel before (launch_overlapped)
  pdl_allow_next();
  const int row_index = static_cast<int>(blockIdx.x / a.group);
  const int g = static_cast<int>(blockIdx.x % a.group);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t lr = a.rows != nullptr ? a.rows[row_index].logits_row : a.logits_row[row_index];
  const char* row = a.logits + int64_t{lr} * a.row_bytes;
  const bool vec = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
  const int32_t lo = min(g * a.slice, a.vocab), hi = min(lo + a.slice, a.vocab);

  ArgmaxStats s = empty_stats();
  for (int32_t base = lo + threadIdx.x * kVec; base < hi; base += kThreads * kVec * kUnroll) {
    float v[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t t0 = base + u * kThreads * kVec;
      if (t0 < hi) load8(row, a.bf16, vec, t0, hi, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t t0 = base + u * kThreads * kVec;
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (t0 + j < hi) consider(s, v[u][j], t0 + j);
    }
  }
  s = warp_merge(s);
  if (lane == 0) warp_stats[warp] = s;
  __syncthreads();
  if (warp != 0) return;
  s = lane < kWarps ? warp_stats[lane] : empty_stats();
  s = warp_merge(s);
  if (a.group == 1) {
    if (lane == 0) finish_row(a, row_index, s);
    return;
  }
  // Publish this slice's statistics; the row's last block to arrive merges them all.
  if (lane == 0) {
    a.partials[int64_t{row_index} * a.group + g] = s;
    __threadfence();
    last = atomicAdd(&a.counters[row_index], 1) == a.group - 1;
  }
  __syncwarp();
  if (!last) return;
  __threadfence();  // the other blocks' partials, published before their count, are visible
  s = empty_stats();
  if (lane < a.group) {
    const volatile ArgmaxStats* p = a.partials + int64_t{row_index} * a.group + lane;
    s = {p->best, p->best_id, p->first_nan, p->first_inf, p->finite};
  }
  s = warp_merge(s);
  if (lane == 0) {
    a.counters[row_index] = 0;  // for the next call, which the stream orders after this one
    finish_row(a, row_index, s);
  }
}

}  // namespace

namespace {

// Scratch for `rows` rows: the counters, then (16-byte aligned) the partials.
int64_t counters_bytes(int32_t rows) {
  return (int64_t{rows} * static_cast<int64_t>(sizeof(int32_t)) + 15) / 16 * 16;
}

}  // namespace

int64_t greedy_sample_scratch_bytes(int32_t rows) {
  return counters_bytes(rows) +
         int64_t{rows} * kMaxGroup * static_cast<int64_t>(sizeof(ArgmaxStats));
}

void launch_greedy_sample(const GreedySampleLaunch& l, cudaStream_t stream) {
  if (l.n_rows <= 0) return;
  PAGELLM_CHECK(l.dtype == DType::kBF16 || l.dtype == DType::kF32);
  PAGELLM_CHECK(l.vocab > 0 && l.scratch != nullptr && l.n_rows <= l.scratch_rows);
  PAGELLM_CHECK(l.rows != nullptr || l.n_rows <= kGreedyParamRows);
  // Blocks a row: slices of at least kMinSlice tokens, at most kMaxGroup of them, and no more
  // blocks in all than two waves of one block an SM.
  int32_t group =
      std::max<int32_t>(1, std::min<int32_t>(kMaxGroup, (l.vocab + kMinSlice - 1) / kMinSlice));
  while (group > 1 && int64_t{l.n_rows} * group > 2 * int64_t{l.n_sms}) group = (group + 1) / 2;
  int32_t slice = (l.vocab + group - 1) / group;
  slice = (slice + kVec - 1) / kVec * kVec;
  group = (l.vocab + slice - 1) / slice;  // no empty block
  GreedyArgs a{};
  a.logits = static_cast<const char*>(l.logits);
  a.bf16 = l.dtype == DType::kBF16;
  a.row_bytes = l.ld * (a.bf16 ? 2 : 4);
  a.vocab = l.vocab;
  a.n_rows = l.n_rows;
  a.group = group;
  a.slice = slice;
  if (l.host_rows != nullptr && l.n_rows <= kGreedyParamRows) {
    for (int32_t i = 0; i < l.n_rows; ++i) a.logits_row[i] = l.host_rows[i].logits_row;
  } else {
    a.rows = l.rows;
  }
  a.results = l.results;
  a.handover = l.handover;
  auto* scratch = static_cast<char*>(l.scratch);
  a.counters = reinterpret_cast<int32_t*>(scratch);
  a.partials = reinterpret_cast<ArgmaxStats*>(scratch + counters_bytes(l.scratch_rows));
  launch_overlapped(greedy_sample_kernel, dim3(static_cast<unsigned>(l.n_rows * group)),
                    dim3(kThreads), 0, stream, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
