// Device sampling: the CPU Sampler's contract (sample/sampler.h, logits_processors.h, logprobs.h)
// on the GPU, so a step's logits never leave the device; only the tokens, their logprobs and a
// status per row come back.
//
// One row of logits is handled by a group of G blocks (G = 1, or a thread-block cluster of up to 8
// on sm_90 when there are few rows: batch 1 spreads a 128K row over 8 SMs). Block b of the group
// owns the contiguous slice [b * slice, (b + 1) * slice) of the row; every row-wide quantity
// (max, counts, histograms, prefix sums) is reduced per block and then combined across the
// cluster through distributed shared memory, always in rank order, so every block of the group
// sees the same bits and takes the same branches.
//
// Per row, in the CPU's order:
//   1. one pass over the raw row: finiteness (the row error names the first NaN / +inf), the raw
//      max and key range (logprobs), and the processed row's max / argmax / finite count / key
//      range. "Processed" = the raw row with the sparse edits (logit_bias, min_tokens
//      suppression, penalties) applied on the fly: a per-slice bitmap marks edited tokens, whose
//      value is recomputed from the raw logit with the CPU's exact fp32 operations, and then a
//      grammar's mask (when the row has one) sends every token it leaves out to -inf. The raw row
//      is never written.
//   2. greedy: the argmax (lowest id on ties). Otherwise, on s = (x - max) / T and
//      w = exp_nonpositive(s) computed bit for bit as on the CPU (no FMA contraction):
//      top-k by radix select on the order-preserving bits of x (exact k, ties at the cut resolved
//      by id); when k is at most kListCap the k candidates are gathered into shared memory,
//      sorted, and top-p, min-p and the draw run there. Otherwise top-p's cut is a radix select
//      on the probability mass (double histograms) and the draw an ordered prefix sum over the
//      row. The draw is the inverse CDF over the kept set in ascending token id order, masses in
//      double, u = uniform01(seed, step) (sample/sample_rng.h).
//   3. logprobs of the raw row: log-sum-exp in double, the sampled token's rank, and the top-N by
//      the same radix select.
// Sums are associated differently than on the CPU (trees instead of a sequential loop), so a
// draw or a top-p cut whose u lands within rounding (~1e-15 relative) of a boundary may differ;
// everything else, tokens, ranks and the top-N lists, is identical.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/util_ptx.cuh>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "sample/sample_rng.h"

namespace pagellm::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;                            // consecutive tokens per lane per chunk
constexpr int kChunk = 32 * kVec;                  // tokens per warp-wide chunk: one coalesced step
constexpr int kUnroll = 2;                         // chunks a warp has in flight
constexpr int kScanItems = 4;                      // chunk sums per thread in ordered scans
constexpr int kMaxChunks = kThreads * kScanItems;  // per block: slices up to 512K tokens
constexpr int kBinBits = 11;
constexpr int kBins = 1 << kBinBits;  // radix-select histogram bins per pass
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kListCap = 2048;  // candidates sorted in shared memory
constexpr int kListItems = kListCap / kThreads;
constexpr int kMaxGroup = 8;  // blocks per row (portable cluster size)
constexpr int kExchBytes = 64;
static_assert(kBinsPerThread == 4 && kListItems == 4, "scan item counts");

// exp_nonpositive of sample/sample_math.h, operation for operation; the _rn intrinsics keep nvcc
// from contracting a multiply and an add into an FMA, which would change the last bit.
constexpr float kExpMinArg = -87.33654f;  // sample_math.h: ln(FLT_MIN)

__device__ __forceinline__ float exp_np(float s) {
  const float x = s < kExpMinArg ? kExpMinArg : (s > 0.0f ? 0.0f : s);
  constexpr float kRound = 12582912.0f;
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), kRound), kRound);
  constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723212e-6f;
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, kLn2Hi)), __fmul_rn(n, kLn2Lo));
  float p = 1.0f / 720.0f;
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 120.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 24.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 6.0f);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  const int e = static_cast<int>(n) + 127;
  const float scale = __int_as_float(e << 23);
  return s < kExpMinArg ? 0.0f : __fmul_rn(p, scale);
}

// s = (x - max) / T as the CPU rounds it.
__device__ __forceinline__ float scaled(float x, float m, float t) {
  return __fdiv_rn(__fsub_rn(x, m), t);
}

// Order-preserving 32-bit key of a float (larger float, larger key); -0 and +0 share one key.
__device__ __forceinline__ uint32_t canon_bits(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b << 1) == 0 ? 0u : b;
}
__device__ __forceinline__ uint32_t ord_key(float x) {
  const uint32_t b = canon_bits(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// A prefix of the token order (logit descending, id ascending) given by its last element:
// token t with reduced key rk is in when rk > key, or rk == key and t <= id. `all`: every
// candidate is in.
struct Cut {
  uint32_t key = 0;
  int32_t id = INT_MAX;
  bool all = true;
  __device__ bool has(uint32_t rk, int32_t t) const {
    return all || rk > key || (rk == key && t <= id);
  }
};

struct RowStats {
  uint32_t n_bad;     // raw NaN or +inf
  int32_t first_nan;  // lowest such ids (INT_MAX: none)
  int32_t first_inf;
  uint32_t n_finite_raw;
  uint32_t raw_kmin, raw_kmax;  // keys over the raw values (no NaN / +inf)
  uint32_t raw_low;             // OR of their low 16 bits: 0 for bf16 logits
  uint32_t n_finite;            // processed row: finite count
  uint32_t kmin;                // min key of the finite processed values
  uint32_t low;                 // OR of their low 16 bits
  unsigned long long best;      // max of (key << 32) | ~id: the argmax, lowest id on ties
};
struct CombineStats {
  __device__ RowStats operator()(const RowStats& a, const RowStats& b) const {
    RowStats r;
    r.n_bad = a.n_bad + b.n_bad;
    r.first_nan = min(a.first_nan, b.first_nan);
    r.first_inf = min(a.first_inf, b.first_inf);
    r.n_finite_raw = a.n_finite_raw + b.n_finite_raw;
    r.raw_kmin = min(a.raw_kmin, b.raw_kmin);
    r.raw_kmax = max(a.raw_kmax, b.raw_kmax);
    r.raw_low = a.raw_low | b.raw_low;
    r.n_finite = a.n_finite + b.n_finite;
    r.kmin = min(a.kmin, b.kmin);
    r.low = a.low | b.low;
    r.best = a.best > b.best ? a.best : b.best;
    return r;
  }
};

struct Sum2 {
  double sum;
  uint32_t count;
};
struct AddSum2 {
  __device__ Sum2 operator()(const Sum2& a, const Sum2& b) const {
    return {a.sum + b.sum, a.count + b.count};
  }
};
struct AddD {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MinI {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return min(a, b); }
};
struct MaxI {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return max(a, b); }
};

// The bin a radix pass picks: j counts bins from the top (largest keys).
struct BinPick {
  int32_t j;
  uint32_t count;
  double above;  // count or mass of the bins above it
};
struct MinPick {
  __device__ BinPick operator()(const BinPick& a, const BinPick& b) const {
    return a.j <= b.j ? a : b;
  }
};
struct MaxPick {
  __device__ BinPick operator()(const BinPick& a, const BinPick& b) const {
    return a.j >= b.j ? a : b;
  }
};

// Where an ordered scan crosses its target: the first chunk and the cumulative sum before it.
struct ChunkPick {
  int32_t chunk;
  double start;
};
struct MinChunk {
  __device__ ChunkPick operator()(const ChunkPick& a, const ChunkPick& b) const {
    return a.chunk <= b.chunk ? a : b;
  }
};

using ReduceStats = cub::BlockReduce<RowStats, kThreads>;
using ReduceSum2 = cub::BlockReduce<Sum2, kThreads>;
using ReduceD = cub::BlockReduce<double, kThreads>;
using ReduceI = cub::BlockReduce<int32_t, kThreads>;
using ReducePick = cub::BlockReduce<BinPick, kThreads>;
using ReduceChunk = cub::BlockReduce<ChunkPick, kThreads>;
using ScanU = cub::BlockScan<uint32_t, kThreads>;
using ScanD = cub::BlockScan<double, kThreads>;

union TempStorage {
  typename ReduceStats::TempStorage stats;
  typename ReduceSum2::TempStorage sum2;
  typename ReduceD::TempStorage d;
  typename ReduceI::TempStorage i;
  typename ReducePick::TempStorage pick;
  typename ReduceChunk::TempStorage chunk;
  typename ScanU::TempStorage scan_u;
  typename ScanD::TempStorage scan_d;
};

struct SampleArgs {
  const void* logits;
  bool bf16;
  int64_t ld;  // elements between logits rows
  int32_t vocab;
  const DeviceSampleRow* rows;
  const DeviceSampleEdit* edits;
  const uint32_t* masks;
  DeviceSampleResult* results;
  int32_t group;  // blocks per row
  int32_t slice;  // tokens per block, a multiple of kChunk
  int32_t n_rows;
  int32_t* handover;  // SampleLaunch::handover
};

// Dynamic shared memory: [hist_count u32 | hist_mass f64] or, when a list is being sorted,
// [list u64 | list_w f32] (the two are never live together); then the chunk sums; then the bitmap
// of edited tokens.
constexpr int kHistBytes = kBins * 4 + kBins * 8;
constexpr int kListBytes = kListCap * 8 + kListCap * 4;
constexpr int kUnionBytes = kHistBytes > kListBytes ? kHistBytes : kListBytes;

// Per-thread view of the row and of this block's slice.
struct Ctx {
  const char* row;  // logits row
  bool bf16;
  bool aligned;  // 16-byte aligned row: vector loads
  int32_t vocab;
  int32_t lo, hi;  // this block's tokens [lo, hi)
  int32_t n_chunks;
  int group, rank;
  int phase;  // alternates the cluster exchange slots
  const DeviceSampleEdit* edits;
  int32_t e_lo, e_hi;  // edits of this slice
  float repetition, presence, frequency;
  uint32_t* hist_count;
  double* hist_mass;
  unsigned long long* list;
  float* list_w;
  double* chunk_sum;
  const uint8_t* edited;  // bitmap over [lo, lo + slice)
  const uint8_t* mask;    // the row's grammar mask as bytes (token t: bit t % 8 of byte t / 8)
  unsigned char* exch;    // 2 x kExchBytes, read by the other blocks of the cluster
  unsigned char* bcast;   // kExchBytes, block-local broadcast
  uint32_t* list_count;
  TempStorage* temp;
};

// --- cluster plumbing: a group of one block needs none of it; sm_80 builds only ever use one ---

__device__ __forceinline__ void group_sync(const Ctx& c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (c.group > 1) {
    cg::this_cluster().sync();
    return;
  }
#endif
  __syncthreads();
}

template <typename T>
__device__ __forceinline__ T* peer(T* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().map_shared_rank(p, rank);
#else
  (void)rank;
  return p;
#endif
}

// Broadcasts thread 0's value to the block.
template <typename T>
__device__ T block_bcast(Ctx& c, const T& v) {
  static_assert(sizeof(T) <= kExchBytes, "broadcast slot too small");
  __syncthreads();  // the slot may still be read from the previous broadcast
  T* out = reinterpret_cast<T*>(c.bcast);
  if (threadIdx.x == 0) *out = v;
  __syncthreads();
  const T r = *out;
  __syncthreads();
  return r;
}

// Combines a block value (valid in thread 0) over the group, in rank order; every thread of every
// block gets the same result.
template <typename T, typename Op>
__device__ T group_reduce(Ctx& c, const T& v, Op op) {
  static_assert(sizeof(T) <= kExchBytes, "exchange slot too small");
  T* out = reinterpret_cast<T*>(c.bcast);
  if (c.group == 1) {
    if (threadIdx.x == 0) *out = v;
    __syncthreads();
    const T r = *out;
    __syncthreads();
    return r;
  }
  T* slot = reinterpret_cast<T*>(c.exch + c.phase * kExchBytes);
  c.phase ^= 1;
  if (threadIdx.x == 0) *slot = v;
  group_sync(c);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    T mine = v;
    if (lane < c.group) mine = *peer(slot, lane);
    T acc = cub::ShuffleIndex<32>(mine, 0, 0xffffffffu);
    for (int r = 1; r < c.group; ++r) acc = op(acc, cub::ShuffleIndex<32>(mine, r, 0xffffffffu));
    if (lane == 0) *out = acc;
  }
  __syncthreads();
  const T r = *out;
  __syncthreads();
  return r;
}

// Exclusive prefix (over lower ranks) and total of a per-block double, in rank order.
__device__ void group_prefix(Ctx& c, double block_total, double& before, double& total) {
  if (c.group == 1) {
    before = 0.0;
    total = block_total;
    return;
  }
  double* slot = reinterpret_cast<double*>(c.exch + c.phase * kExchBytes);
  double* out = reinterpret_cast<double*>(c.bcast);
  c.phase ^= 1;
  if (threadIdx.x == 0) *slot = block_total;
  group_sync(c);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const double mine = lane < c.group ? *peer(slot, lane) : 0.0;
    double acc = 0.0, b = 0.0;
    for (int r = 0; r < c.group; ++r) {
      if (r == c.rank) b = acc;
      acc += __shfl_sync(0xffffffffu, mine, r);
    }
    if (lane == 0) {
      out[0] = b;
      out[1] = acc;
    }
  }
  __syncthreads();
  before = out[0];
  total = out[1];
  __syncthreads();
}

// Sums the blocks' histograms (bins [0, nbins)) so every block holds the group's.
__device__ void group_histogram(Ctx& c, int nbins, bool mass) {
  __syncthreads();
  if (c.group == 1) return;
  group_sync(c);  // every block's local histogram is complete
  uint32_t cnt[kBinsPerThread];
  double ms[kBinsPerThread];
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    const int b = threadIdx.x + q * kThreads;
    cnt[q] = 0;
    ms[q] = 0.0;
    if (b < nbins) {
      for (int r = 0; r < c.group; ++r) {
        cnt[q] += peer(c.hist_count, r)[b];
        if (mass) ms[q] += peer(c.hist_mass, r)[b];
      }
    }
  }
  group_sync(c);  // every block has read every other's
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    const int b = threadIdx.x + q * kThreads;
    if (b < nbins) {
      c.hist_count[b] = cnt[q];
      if (mass) c.hist_mass[b] = ms[q];
    }
  }
  __syncthreads();
}

// --- reading the row ---

__device__ __forceinline__ float load_one(const Ctx& c, int32_t t) {
  if (c.bf16) {
    const uint16_t h = reinterpret_cast<const uint16_t*>(c.row)[t];
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
  }
  return reinterpret_cast<const float*>(c.row)[t];
}

// Tokens t0 .. t0+7 (those below hi; the rest are left 0 and must be ignored by the caller).
__device__ __forceinline__ void load8(const Ctx& c, int32_t t0, float (&v)[kVec]) {
  if (c.aligned && t0 + kVec <= c.hi) {
    if (c.bf16) {
      const uint4 q = *reinterpret_cast<const uint4*>(c.row + static_cast<int64_t>(t0) * 2);
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    } else {
      const float4* p = reinterpret_cast<const float4*>(c.row + static_cast<int64_t>(t0) * 4);
      const float4 a = p[0], b = p[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
      v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = t0 + i < c.hi ? load_one(c, t0 + i) : 0.0f;
}

// The processed logit of an edited token: the CPU's logit_bias, suppress_tokens and
// apply_penalties, in that order, with the same fp32 operations.
__device__ float apply_edit(const Ctx& c, int32_t t, float raw) {
  int32_t a = c.e_lo, b = c.e_hi;  // the bitmap guarantees t is there
  while (a < b) {
    const int32_t mid = (a + b) >> 1;
    if (c.edits[mid].token < t) {
      a = mid + 1;
    } else {
      b = mid;
    }
  }
  const DeviceSampleEdit e = c.edits[a];
  float v = raw;
  if (e.flags & kEditBias) v = __fadd_rn(v, e.bias);
  if (e.flags & kEditSuppress) v = -INFINITY;
  if (e.flags & kEditRepetition) {
    const float r = c.repetition;
    float nv = v > 0.0f ? fminf(__fdiv_rn(v, r), FLT_MAX) : fmaxf(__fmul_rn(v, r), -FLT_MAX);
    if (v == -INFINITY) nv = -INFINITY;  // masked stays masked
    v = nv;
  }
  if (e.output_count > 0)
    v = __fsub_rn(
        v, __fadd_rn(__fmul_rn(static_cast<float>(e.output_count), c.frequency), c.presence));
  return v;
}

// Tokens t0 .. t0 + 7 (t0 a multiple of 8) processed: the edits, then the grammar mask, whose
// byte t0 / 8 holds exactly these eight tokens' bits (the words are little-endian).
__device__ __forceinline__ void process8(const Ctx& c, int32_t t0, const float (&raw)[kVec],
                                         float (&x)[kVec]) {
  uint32_t bits = 0;
  if (c.e_hi > c.e_lo && t0 < c.hi) bits = c.edited[(t0 - c.lo) >> 3];
#pragma unroll
  for (int i = 0; i < kVec; ++i) x[i] = raw[i];
  if (bits != 0) {
    for (int i = 0; i < kVec; ++i)
      if ((bits >> i) & 1u) x[i] = apply_edit(c, t0 + i, raw[i]);
  }
  if (c.mask != nullptr && t0 < c.hi) {
    const uint32_t allowed = c.mask[t0 >> 3];
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      if (!((allowed >> i) & 1u)) x[i] = -INFINITY;
  }
}

// Calls f(chunk, t0, raw[8], processed[8]) for every chunk of the block's slice; lane l of a warp
// gets tokens t0 = lo + chunk * kChunk + l * kVec .. t0 + 7 (only those < hi are real). Chunks are
// warp-uniform, so f may use warp collectives.
template <typename F>
__device__ __forceinline__ void for_each_chunk(const Ctx& c, F&& f) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int c0 = warp * kUnroll; c0 < c.n_chunks; c0 += kWarps * kUnroll) {
    float raw[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u < c.n_chunks) load8(c, c.lo + (c0 + u) * kChunk + lane * kVec, raw[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int ch = c0 + u;
      if (ch < c.n_chunks) {
        const int32_t t0 = c.lo + ch * kChunk + lane * kVec;
        float x[kVec];
        process8(c, t0, raw[u], x);
        f(ch, t0, raw[u], x);
      }
    }
  }
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// --- ordered scan: the first token where a running sum in ascending id order crosses a target ---

// val(t, raw, x) >= 0 per token. Finds the lowest t with offset + sum_{t' <= t} val(t') > target
// (strict) or >= target, where target = `target`, or frac * (total of val) when frac >= 0. A token
// with val 0 is never returned. When rounding leaves no crossing, returns the last token with
// val > 0; -1 when there is none.
template <typename ValFn>
__device__ int32_t ordered_find(Ctx& c, ValFn val, double offset, double target, double frac,
                                bool strict) {
  const int lane = threadIdx.x & 31;
  int32_t last = -1;
  for_each_chunk(c, [&](int ch, int32_t t0, const float(&raw)[kVec], const float(&x)[kVec]) {
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (t0 + i < c.hi) {
        const double v = val(t0 + i, raw[i], x[i]);
        s += v;
        if (v > 0.0) last = t0 + i;
      }
    }
    s = warp_sum_d(s);
    if (lane == 0) c.chunk_sum[ch] = s;
  });
  __syncthreads();
  double it[kScanItems], ex[kScanItems], block_total;
#pragma unroll
  for (int q = 0; q < kScanItems; ++q) {
    const int ch = threadIdx.x * kScanItems + q;
    it[q] = ch < c.n_chunks ? c.chunk_sum[ch] : 0.0;
  }
  ScanD(c.temp->scan_d).ExclusiveSum(it, ex, block_total);
  __syncthreads();
  double before, total;
  group_prefix(c, block_total, before, total);
  if (frac >= 0.0) target = __dmul_rn(frac, total);
  const double base = offset + before;
  ChunkPick mine{INT_MAX, 0.0};
#pragma unroll
  for (int q = 0; q < kScanItems; ++q) {
    const int ch = threadIdx.x * kScanItems + q;
    if (ch < c.n_chunks && mine.chunk == INT_MAX && it[q] > 0.0) {
      const double start = base + ex[q];
      const double end = start + it[q];
      if (strict ? end > target : end >= target) mine = {ch, start};
    }
  }
  const ChunkPick pick = block_bcast(c, ReduceChunk(c.temp->chunk).Reduce(mine, MinChunk()));
  // This block's first crossing chunk, walked by warp 0; the group's answer is the lowest token.
  int32_t found = -1;
  int32_t* found_s = reinterpret_cast<int32_t*>(c.bcast);
  if (pick.chunk != INT_MAX && threadIdx.x < 32) {
    const int32_t t0 = c.lo + pick.chunk * kChunk + lane * kVec;
    float raw[kVec], x[kVec];
    load8(c, t0, raw);
    process8(c, t0, raw, x);
    double v[kVec], lane_sum = 0.0;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      v[i] = t0 + i < c.hi ? val(t0 + i, raw[i], x[i]) : 0.0;
      lane_sum += v[i];
    }
    double inc = lane_sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    double excl = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) excl = 0.0;
    double cum = pick.start + excl;
    int32_t hit = -1, lane_last = -1;
    for (int i = 0; i < kVec; ++i) {
      if (v[i] > 0.0) {
        lane_last = t0 + i;
        cum += v[i];
        if (hit < 0 && (strict ? cum > target : cum >= target)) hit = t0 + i;
      }
    }
    const unsigned hits = __ballot_sync(0xffffffffu, hit >= 0);
    if (hits != 0) {
      found = __shfl_sync(0xffffffffu, hit, __ffs(hits) - 1);
    } else {
      // Rounding put the crossing past this chunk's last term: that term is the answer.
      const unsigned any = __ballot_sync(0xffffffffu, lane_last >= 0);
      found = any != 0 ? __shfl_sync(0xffffffffu, lane_last, 31 - __clz(any)) : -1;
    }
    if (lane == 0) *found_s = found;
  }
  __syncthreads();
  if (pick.chunk != INT_MAX) found = *found_s;
  __syncthreads();
  last = ReduceI(c.temp->i).Reduce(last, MaxI());
  __syncthreads();
  // Across the group: the lowest block that found a crossing wins; else the last positive term.
  const int32_t found_any = group_reduce(c, found < 0 ? INT_MAX : found, MinI());
  last = group_reduce(c, last, MaxI());
  return found_any != INT_MAX ? found_any : last;
}

// --- radix select ---

// Picks the first bin from the top whose inclusive count reaches `need`.
__device__ BinPick pick_bin_count(Ctx& c, int nbins, uint32_t need) {
  uint32_t it[kBinsPerThread], inc[kBinsPerThread];
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    const int j = threadIdx.x * kBinsPerThread + q;
    it[q] = j < nbins ? c.hist_count[nbins - 1 - j] : 0u;
  }
  ScanU(c.temp->scan_u).InclusiveSum(it, inc);
  __syncthreads();
  BinPick mine{INT_MAX, 0, 0.0};
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    const int j = threadIdx.x * kBinsPerThread + q;
    if (j < nbins && mine.j == INT_MAX && inc[q] >= need)
      mine = {j, it[q], static_cast<double>(inc[q] - it[q])};
  }
  return block_bcast(c, ReducePick(c.temp->pick).Reduce(mine, MinPick()));
}

// Picks the first non-empty bin from the top where above + its inclusive mass reaches target;
// with `fallback`, the last non-empty bin when none does (rounding inside a bin already chosen).
__device__ BinPick pick_bin_mass(Ctx& c, int nbins, double above, double target, bool fallback) {
  double it[kBinsPerThread], ex[kBinsPerThread], total;
  uint32_t cnt[kBinsPerThread];
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    const int j = threadIdx.x * kBinsPerThread + q;
    it[q] = j < nbins ? c.hist_mass[nbins - 1 - j] : 0.0;
    cnt[q] = j < nbins ? c.hist_count[nbins - 1 - j] : 0u;
  }
  ScanD(c.temp->scan_d).ExclusiveSum(it, ex, total);
  __syncthreads();
  BinPick mine{INT_MAX, 0, 0.0};
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    const int j = threadIdx.x * kBinsPerThread + q;
    if (j < nbins && mine.j == INT_MAX && cnt[q] > 0 && above + (ex[q] + it[q]) >= target)
      mine = {j, cnt[q], ex[q]};
  }
  const BinPick p = block_bcast(c, ReducePick(c.temp->pick).Reduce(mine, MinPick()));
  if (p.j != INT_MAX || !fallback) return p;
  BinPick lastp{-1, 0, 0.0};
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    const int j = threadIdx.x * kBinsPerThread + q;
    if (j < nbins && cnt[q] > 0) lastp = {j, cnt[q], ex[q]};
  }
  return block_bcast(c, ReducePick(c.temp->pick).Reduce(lastp, MaxPick()));
}

__device__ __forceinline__ int bin_shift(uint32_t span) {
  const int bits = 32 - __clz(span);
  return bits > kBinBits ? bits - kBinBits : 0;
}
__device__ __forceinline__ uint32_t bin_hi(uint32_t lo, uint32_t hi, int shift) {
  const unsigned long long h = static_cast<unsigned long long>(lo) + (1ull << shift) - 1ull;
  return h < hi ? static_cast<uint32_t>(h) : hi;
}

// Value of token t for a select: the raw logit (every token counts) or the processed one (finite
// ones only).
template <bool kRaw>
__device__ __forceinline__ bool select_value(float raw, float x, float& v) {
  v = kRaw ? raw : x;
  return kRaw || x > -INFINITY;
}

// The k-th token of the order among the candidates (exact k; ties at the cut resolved by id), on
// keys reduced by g bits. [lo, hi] holds every candidate's reduced key; n_cand candidates.
template <bool kRaw>
__device__ Cut select_by_count(Ctx& c, int g, uint32_t lo, uint32_t hi, uint32_t n_cand,
                               uint32_t k) {
  Cut cut;
  if (k >= n_cand) return cut;  // all
  uint32_t need = k, n_range = n_cand;
  while (lo != hi) {
    const int shift = bin_shift(hi - lo);
    const int nbins = static_cast<int>((hi - lo) >> shift) + 1;
    for (int b = threadIdx.x; b < nbins; b += kThreads) c.hist_count[b] = 0;
    __syncthreads();
    const uint32_t lo_ = lo, hi_ = hi;
    for_each_chunk(c, [&](int, int32_t t0, const float(&raw)[kVec], const float(&x)[kVec]) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        float v;
        if (t0 + i < c.hi && select_value<kRaw>(raw[i], x[i], v)) {
          const uint32_t rk = ord_key(v) >> g;
          if (rk >= lo_ && rk <= hi_) atomicAdd(&c.hist_count[(rk - lo_) >> shift], 1u);
        }
      }
    });
    group_histogram(c, nbins, false);
    const BinPick p = pick_bin_count(c, nbins, need);
    if (p.j == INT_MAX) break;  // unreachable: the range holds n_range >= need candidates
    const uint32_t b = static_cast<uint32_t>(nbins - 1 - p.j);
    need -= static_cast<uint32_t>(p.above);
    lo = lo + (b << shift);
    hi = bin_hi(lo, hi, shift);
    n_range = p.count;
    if (n_range == need) {  // the whole bin is in
      cut.all = false;
      cut.key = lo;
      cut.id = INT_MAX;
      return cut;
    }
  }
  // n_range candidates share the key lo; the first `need` of them by id are in.
  cut.all = false;
  cut.key = lo;
  const uint32_t key = lo;
  const int32_t id = ordered_find(
      c,
      [&](int32_t, float raw, float x) {
        float v;
        return select_value<kRaw>(raw, x, v) && (ord_key(v) >> g) == key ? 1.0 : 0.0;
      },
      0.0, static_cast<double>(need), -1.0, false);
  cut.id = id >= 0 ? id : INT_MAX;
  return cut;
}

// Top-p's cut: the first token of the order (among finite tokens inside `ck` with w > 0) where
// the cumulative mass reaches target. `all` when rounding leaves the whole mass short of it (the
// CPU then keeps every candidate too).
__device__ Cut select_by_mass(Ctx& c, int g, uint32_t lo, uint32_t hi, double target, const Cut& ck,
                              float m, float t) {
  Cut cut;
  double above = 0.0;
  bool first = true;
  while (lo != hi) {
    const int shift = bin_shift(hi - lo);
    const int nbins = static_cast<int>((hi - lo) >> shift) + 1;
    for (int b = threadIdx.x; b < nbins; b += kThreads) {
      c.hist_count[b] = 0;
      c.hist_mass[b] = 0.0;
    }
    __syncthreads();
    const uint32_t lo_ = lo, hi_ = hi;
    for_each_chunk(c, [&](int, int32_t t0, const float(&raw)[kVec], const float(&x)[kVec]) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (t0 + i < c.hi && x[i] > -INFINITY) {
          const uint32_t rk = ord_key(x[i]) >> g;
          if (rk >= lo_ && rk <= hi_ && ck.has(rk, t0 + i)) {
            const float w = exp_np(scaled(x[i], m, t));
            if (w > 0.0f) {
              const int b = static_cast<int>((rk - lo_) >> shift);
              atomicAdd(&c.hist_count[b], 1u);
              atomicAdd(&c.hist_mass[b], static_cast<double>(w));
            }
          }
        }
      }
    });
    group_histogram(c, nbins, true);
    const BinPick p = pick_bin_mass(c, nbins, above, target, !first);
    if (p.j == INT_MAX || p.j < 0) {
      if (first) return cut;  // all
      break;                  // unreachable: a chosen bin is never empty
    }
    first = false;
    const uint32_t b = static_cast<uint32_t>(nbins - 1 - p.j);
    above += p.above;
    lo = lo + (b << shift);
    hi = bin_hi(lo, hi, shift);
    if (p.count == 1) {  // the bin's only token is the cut
      cut.all = false;
      cut.key = lo;
      cut.id = INT_MAX;
      return cut;
    }
  }
  // Ties: every token left has the same key and weight; walk them by id.
  cut.all = false;
  cut.key = lo;
  const uint32_t key = lo;
  const int32_t id = ordered_find(
      c,
      [&](int32_t tok, float, float x) {
        if (!(x > -INFINITY)) return 0.0;
        const uint32_t rk = ord_key(x) >> g;
        if (rk != key || !ck.has(rk, tok)) return 0.0;
        return static_cast<double>(exp_np(scaled(x, m, t)));
      },
      above, target, -1.0, false);
  cut.id = id >= 0 ? id : INT_MAX;
  return cut;
}

// --- candidate lists in shared memory ---

// Sort key of the token order: ascending = logit descending, id ascending.
__device__ __forceinline__ unsigned long long order_code(uint32_t key, int32_t t) {
  return (static_cast<unsigned long long>(~key) << 32) | static_cast<uint32_t>(t);
}

// Appends the tokens with member(t, raw, x) to this block's list; then rank 0 pulls the other
// blocks' lists after its own. Returns the list length in rank 0 (0 elsewhere).
template <typename Member>
__device__ int gather(Ctx& c, Member member) {
  if (threadIdx.x == 0) *c.list_count = 0;
  __syncthreads();
  for_each_chunk(c, [&](int, int32_t t0, const float(&raw)[kVec], const float(&x)[kVec]) {
    for (int i = 0; i < kVec; ++i) {
      uint32_t key;
      if (t0 + i < c.hi && member(t0 + i, raw[i], x[i], key)) {
        const uint32_t slot = atomicAdd(c.list_count, 1u);
        if (slot < kListCap) c.list[slot] = order_code(key, t0 + i);
      }
    }
  });
  __syncthreads();
  int n = min(static_cast<int>(*c.list_count), kListCap);
  if (c.group > 1) {
    group_sync(c);  // every block's list is complete
    if (c.rank == 0) {
      for (int r = 1; r < c.group; ++r) {
        const int nr = min(static_cast<int>(*peer(c.list_count, r)), kListCap - n);
        const unsigned long long* src = peer(c.list, r);
        for (int i = threadIdx.x; i < nr; i += kThreads) c.list[n + i] = src[i];
        n += nr;
      }
    }
    group_sync(c);  // rank 0 has read them
  }
  return c.rank == 0 ? n : 0;
}

// Sorts list[0, n) ascending (block-wide bitonic sort over the next power of two, padded).
__device__ void sort_list(Ctx& c, int n) {
  int p = 2;
  while (p < n) p <<= 1;
  for (int i = n + threadIdx.x; i < p; i += kThreads) c.list[i] = ~0ull;
  __syncthreads();
  for (int k = 2; k <= p; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < p; i += kThreads) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const unsigned long long a = c.list[i], b = c.list[ixj];
          const bool up = (i & k) == 0;
          if ((a > b) == up) {
            c.list[i] = b;
            c.list[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The top-k path once the k candidates are in rank 0's list (rank 0 only): top-p on the
// top-k-renormalized mass, min-p, then the draw in ascending id order. Mirrors the CPU's use_k
// branch of build_kept / sample_truncated.
__device__ int32_t draw_from_list(Ctx& c, int n, float m, float t, float top_p, float s_min,
                                  double u) {
  if (n <= 0) return -1;
  sort_list(c, n);
  double it[kListItems], ex[kListItems], total;
  float s[kListItems];
#pragma unroll
  for (int q = 0; q < kListItems; ++q) {
    const int j = threadIdx.x * kListItems + q;
    s[q] = 0.0f;
    it[q] = 0.0;
    if (j < n) {
      const float x = key_float(~static_cast<uint32_t>(c.list[j] >> 32));
      s[q] = scaled(x, m, t);
      const float w = exp_np(s[q]);
      c.list_w[j] = w;
      it[q] = w;
    }
  }
  ScanD(c.temp->scan_d).ExclusiveSum(it, ex, total);
  __syncthreads();
  int32_t len = n;
  if (top_p < 1.0f) {
    const double target = __dmul_rn(static_cast<double>(top_p), total);
    int32_t first = INT_MAX;
#pragma unroll
    for (int q = 0; q < kListItems; ++q) {
      const int j = threadIdx.x * kListItems + q;
      if (j < n && first == INT_MAX && ex[q] + it[q] >= target) first = j;
    }
    first = block_bcast(c, ReduceI(c.temp->i).Reduce(first, MinI()));
    if (first != INT_MAX) len = first + 1;
  }
  // Kept: the first len entries with s >= s_min (the best one always: s = 0). Re-key them by id
  // for the draw, carrying their position for the weight.
#pragma unroll
  for (int q = 0; q < kListItems; ++q) {
    const int j = threadIdx.x * kListItems + q;
    if (j < n) {
      const bool kept = j < len && (j == 0 || s[q] >= s_min);
      const uint32_t tok = static_cast<uint32_t>(c.list[j]);
      c.list[j] =
          kept ? (static_cast<unsigned long long>(tok) << 32) | static_cast<uint32_t>(j) : ~0ull;
    }
  }
  __syncthreads();
  sort_list(c, n);
  double w2[kListItems], ex2[kListItems], total2;
  int32_t n_kept_part = 0;
#pragma unroll
  for (int q = 0; q < kListItems; ++q) {
    const int j = threadIdx.x * kListItems + q;
    w2[q] = 0.0;
    if (j < n && c.list[j] != ~0ull) {
      w2[q] = c.list_w[static_cast<uint32_t>(c.list[j])];
      ++n_kept_part;
    }
  }
  ScanD(c.temp->scan_d).ExclusiveSum(w2, ex2, total2);
  __syncthreads();
  const int32_t n_kept = cub::BlockReduce<int32_t, kThreads>(c.temp->i).Sum(n_kept_part);
  __syncthreads();
  const double target = __dmul_rn(u, total2);
  int32_t first = INT_MAX;
#pragma unroll
  for (int q = 0; q < kListItems; ++q) {
    const int j = threadIdx.x * kListItems + q;
    if (j < n && first == INT_MAX && w2[q] > 0.0 && ex2[q] + w2[q] > target) first = j;
  }
  first = ReduceI(c.temp->i).Reduce(first, MinI());
  __syncthreads();
  int32_t* out = reinterpret_cast<int32_t*>(c.bcast);
  if (threadIdx.x == 0) {
    const int32_t j = first != INT_MAX ? first : n_kept - 1;  // rounding: the last kept token
    out[0] = j >= 0 ? static_cast<int32_t>(c.list[j] >> 32) : -1;
  }
  __syncthreads();
  const int32_t tok = out[0];
  __syncthreads();
  return tok;
}

// --- the kernel ---

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ TempStorage temp;
  __shared__ __align__(16) unsigned char exch[2 * kExchBytes];
  __shared__ __align__(16) unsigned char bcast[kExchBytes];
  __shared__ uint32_t list_count;
  __shared__ int32_t slice_edits[2];

  Ctx c;
  c.group = a.group;
  c.rank = static_cast<int>(blockIdx.x % a.group);
  const int row_index = static_cast<int>(blockIdx.x / a.group);
  const DeviceSampleRow row = a.rows[row_index];
  c.row = static_cast<const char*>(a.logits) +
          static_cast<int64_t>(row.logits_row) * a.ld * (a.bf16 ? 2 : 4);
  c.bf16 = a.bf16;
  c.aligned = (reinterpret_cast<uintptr_t>(c.row) & 15u) == 0;
  c.vocab = a.vocab;
  c.lo = min(c.rank * a.slice, a.vocab);
  c.hi = min(c.lo + a.slice, a.vocab);
  c.n_chunks = (c.hi - c.lo + kChunk - 1) / kChunk;
  c.phase = 0;
  c.edits = a.edits;
  c.mask = row.mask_word >= 0 ? reinterpret_cast<const uint8_t*>(a.masks + row.mask_word) : nullptr;
  c.repetition = row.repetition;
  c.presence = row.presence;
  c.frequency = row.frequency;
  c.hist_count = reinterpret_cast<uint32_t*>(dyn);
  c.hist_mass = reinterpret_cast<double*>(dyn + kBins * 4);
  c.list = reinterpret_cast<unsigned long long*>(dyn);
  c.list_w = reinterpret_cast<float*>(dyn + kListCap * 8);
  c.chunk_sum = reinterpret_cast<double*>(dyn + kUnionBytes);
  c.edited = reinterpret_cast<const uint8_t*>(dyn + kUnionBytes + (a.slice / kChunk) * 8);
  c.exch = exch;
  c.bcast = bcast;
  c.list_count = &list_count;
  c.temp = &temp;

  // This slice's edits (sorted by token) and their bitmap.
  if (threadIdx.x < 2) {
    const int32_t bound = threadIdx.x == 0 ? c.lo : c.hi;
    int32_t x = row.edit_begin, y = row.edit_end;
    while (x < y) {
      const int32_t mid = (x + y) >> 1;
      if (a.edits[mid].token < bound) {
        x = mid + 1;
      } else {
        y = mid;
      }
    }
    slice_edits[threadIdx.x] = x;
  }
  uint32_t* bitmap = reinterpret_cast<uint32_t*>(dyn + kUnionBytes + (a.slice / kChunk) * 8);
  for (int i = threadIdx.x; i < a.slice / 32; i += kThreads) bitmap[i] = 0;
  __syncthreads();
  c.e_lo = slice_edits[0];
  c.e_hi = slice_edits[1];
  for (int32_t e = c.e_lo + threadIdx.x; e < c.e_hi; e += kThreads) {
    const int32_t off = a.edits[e].token - c.lo;
    atomicOr(&bitmap[off >> 5], 1u << (off & 31));
  }
  __syncthreads();

  // 1. Statistics of the raw and processed row.
  RowStats st{0, INT_MAX, INT_MAX, 0, UINT_MAX, 0, 0, 0, UINT_MAX, 0, 0ull};
  for_each_chunk(c, [&](int, int32_t t0, const float(&raw)[kVec], const float(&x)[kVec]) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int32_t t = t0 + i;
      if (t >= c.hi) continue;
      const float r = raw[i];
      if (!(r < INFINITY)) {
        ++st.n_bad;
        if (r != r) {
          st.first_nan = min(st.first_nan, t);
        } else {
          st.first_inf = min(st.first_inf, t);
        }
        continue;
      }
      const uint32_t kr = ord_key(r);
      st.raw_kmin = min(st.raw_kmin, kr);
      st.raw_kmax = max(st.raw_kmax, kr);
      st.raw_low |= canon_bits(r) & 0xFFFFu;
      st.n_finite_raw += r > -INFINITY;
      if (x[i] > -INFINITY) {
        const uint32_t k = ord_key(x[i]);
        ++st.n_finite;
        st.kmin = min(st.kmin, k);
        st.low |= canon_bits(x[i]) & 0xFFFFu;
        const unsigned long long code =
            (static_cast<unsigned long long>(k) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(t));
        st.best = code > st.best ? code : st.best;
      }
    }
  });
  st = ReduceStats(temp.stats).Reduce(st, CombineStats());
  __syncthreads();
  st = group_reduce(c, st, CombineStats());

  DeviceSampleResult* res = a.results + row_index;
  DeviceSampleStatus status = DeviceSampleStatus::kOk;
  int32_t detail = -1;
  if (st.n_bad > 0) {
    const bool nan_first = st.first_nan < st.first_inf;
    status = nan_first ? DeviceSampleStatus::kNan : DeviceSampleStatus::kPosInf;
    detail = nan_first ? st.first_nan : st.first_inf;
  } else if (st.n_finite_raw == 0) {
    status = DeviceSampleStatus::kAllNegInf;
  } else if (row.flags & kSampleSkip) {
    status = DeviceSampleStatus::kSkipped;
  } else if (st.n_finite == 0) {
    status = DeviceSampleStatus::kNothingToSample;
  }

  int32_t token = -1;
  if (status == DeviceSampleStatus::kOk) {
    if (row.flags & kSampleGreedy) {
      token = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(st.best & 0xFFFFFFFFull));
    } else {
      // 2. Temperature, top-k, top-p, min-p, draw.
      const uint32_t kmax = static_cast<uint32_t>(st.best >> 32);
      const float m = key_float(kmax);
      const float tmp = row.temperature;
      const int g = st.low == 0 ? 16 : 0;
      const uint32_t lo = st.kmin >> g, hi = kmax >> g;
      const bool use_k =
          row.top_k > 0 && row.top_k < a.vocab && static_cast<uint32_t>(row.top_k) < st.n_finite;
      const double u = uniform01(row.seed, row.step);
      Cut ck;
      if (use_k)
        ck = select_by_count<false>(c, g, lo, hi, st.n_finite, static_cast<uint32_t>(row.top_k));
      if (use_k && row.top_k <= kListCap) {
        const int n = gather(c, [&](int32_t t, float, float x, uint32_t& key) {
          if (!(x > -INFINITY)) return false;
          key = ord_key(x);
          return ck.has(key >> g, t);
        });
        int32_t tok = -1;
        if (c.rank == 0) tok = draw_from_list(c, n, m, tmp, row.top_p, row.s_min, u);
        token = group_reduce(c, tok, MaxI());
      } else {
        Cut cp;
        if (row.top_p < 1.0f) {
          double z = 0.0;
          for_each_chunk(c, [&](int, int32_t t0, const float(&)[kVec], const float(&x)[kVec]) {
#pragma unroll
            for (int i = 0; i < kVec; ++i)
              if (t0 + i < c.hi && x[i] > -INFINITY && ck.has(ord_key(x[i]) >> g, t0 + i))
                z += static_cast<double>(exp_np(scaled(x[i], m, tmp)));
          });
          z = ReduceD(temp.d).Sum(z);
          __syncthreads();
          z = group_reduce(c, z, AddD());
          const double target = __dmul_rn(static_cast<double>(row.top_p), z);
          cp = select_by_mass(c, g, lo, hi, target, ck, m, tmp);
        }
        const float s_min = row.s_min;
        token = ordered_find(
            c,
            [&](int32_t tok, float, float x) {
              if (!(x > -INFINITY)) return 0.0;
              const uint32_t rk = ord_key(x) >> g;
              if (!ck.has(rk, tok) || !cp.has(rk, tok)) return 0.0;
              const float sc = scaled(x, m, tmp);
              return sc >= s_min ? static_cast<double>(exp_np(sc)) : 0.0;
            },
            0.0, 0.0, u, true);
      }
      if (token < 0) status = DeviceSampleStatus::kNothingToSample;
    }
  }

  // 3. Logprobs of the raw row.
  float logprob = 0.0f;
  int32_t rank = 0, n_top = 0;
  if (status == DeviceSampleStatus::kOk && row.n_logprobs >= 0) {
    const float rt = load_one(c, token);
    const float m_raw = key_float(st.raw_kmax);
    Sum2 part{0.0, 0u};
    for_each_chunk(c, [&](int, int32_t t0, const float(&raw)[kVec], const float(&)[kVec]) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const int32_t t = t0 + i;
        if (t < c.hi) {
          part.sum += static_cast<double>(exp_np(__fsub_rn(raw[i], m_raw)));
          part.count += raw[i] > rt || (raw[i] == rt && t < token);
        }
      }
    });
    part = ReduceSum2(temp.sum2).Reduce(part, AddSum2());
    __syncthreads();
    part = group_reduce(c, part, AddSum2());
    const double lse = static_cast<double>(m_raw) + log(part.sum);
    logprob = static_cast<float>(static_cast<double>(rt) - lse);
    rank = static_cast<int32_t>(part.count) + 1;
    const int32_t top_n = min(row.n_logprobs, min(a.vocab, kDeviceSampleMaxTop));
    if (top_n > 0) {
      const int gr = st.raw_low == 0 ? 16 : 0;
      const Cut cr =
          select_by_count<true>(c, gr, st.raw_kmin >> gr, st.raw_kmax >> gr,
                                static_cast<uint32_t>(a.vocab), static_cast<uint32_t>(top_n));
      const int n = gather(c, [&](int32_t t, float raw, float, uint32_t& key) {
        key = ord_key(raw);
        return cr.has(key >> gr, t);
      });
      if (c.rank == 0) {
        sort_list(c, n);
        n_top = min(n, top_n);
        for (int j = threadIdx.x; j < n_top; j += kThreads) {
          const float x = key_float(~static_cast<uint32_t>(c.list[j] >> 32));
          res->top_token[j] = static_cast<int32_t>(static_cast<uint32_t>(c.list[j]));
          res->top_logprob[j] = static_cast<float>(static_cast<double>(x) - lse);
        }
      }
    }
  }

  if (c.rank == 0 && threadIdx.x == 0) {
    const bool ok = status == DeviceSampleStatus::kOk;
    res->token = ok ? token : -1;
    res->status = status;
    res->detail = detail;
    res->logprob = logprob;
    res->rank = rank;
    res->n_top = n_top;
    if (a.handover != nullptr) {  // as sampled_token_for (device_sample.h) reads the result
      a.handover[1 + row_index] = ok && token >= 0 ? token : 0;
      if (row_index == 0) a.handover[0] = a.n_rows;
    }
  }
  // No block may leave while another can still read its shared memory.
  if (c.group > 1) group_sync(c);
}

}  // namespace

int64_t sample_shared_bytes(int32_t slice) {
  return kUnionBytes + (slice / kChunk) * 8 + slice / 8;
}

void launch_sample(const SampleLaunch& l, cudaStream_t stream) {
  if (l.n_rows <= 0) return;
  PAGELLM_CHECK(l.dtype == DType::kBF16 || l.dtype == DType::kF32);
  PAGELLM_CHECK(l.vocab > 0);
  // Blocks per row: spread few rows over the SMs with a cluster (sm_90), keeping >= 8K tokens per
  // block; a slice holds at most kMaxChunks chunks.
  const int32_t max_slice = kMaxChunks * kChunk;
  int group = 1;
  if (l.cluster_ok) {
    while (group * 2 <= kMaxGroup && static_cast<int64_t>(l.n_rows) * group * 2 <= l.n_sms &&
           l.vocab / (group * 2) >= 8192)
      group *= 2;
    while (static_cast<int64_t>(group) * max_slice < l.vocab && group < kMaxGroup) group *= 2;
  }
  if (l.force_group > 0) group = l.force_group;
  PAGELLM_CHECK_MSG(group == 1 || l.cluster_ok, "sample: clusters need sm_90");
  int32_t slice = (l.vocab + group - 1) / group;
  slice = (slice + kChunk - 1) / kChunk * kChunk;
  PAGELLM_CHECK_MSG(slice <= max_slice, "sample: vocabulary too large for the device sampler");
  group = (l.vocab + slice - 1) / slice;  // no empty block
  const int64_t smem = sample_shared_bytes(slice);
  // The attribute belongs to the function on the current device: raise it once per new maximum.
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> smem_set[kMaxDevices];
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= kMaxDevices || smem > smem_set[dev].load()) {
    CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    if (dev < kMaxDevices) smem_set[dev].store(smem);
  }
  SampleArgs args;
  args.logits = l.logits;
  args.bf16 = l.dtype == DType::kBF16;
  args.ld = l.ld;
  args.vocab = l.vocab;
  args.rows = l.rows;
  args.edits = l.edits;
  args.masks = l.masks;
  args.results = l.results;
  args.group = group;
  args.slice = slice;
  args.n_rows = l.n_rows;
  args.handover = l.handover;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(l.n_rows * group));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(group);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = group > 1 ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, sample_kernel, args));
}

namespace {

__global__ void take_sampled_tokens_kernel(int32_t* tokens, int64_t n,
                                           const DeviceSampleResult* results, int32_t n_rows) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t t = tokens[i];
    if (t < 0) tokens[i] = sampled_token_for(t, results, n_rows);
  }
}

}  // namespace

void launch_take_sampled_tokens(int32_t* tokens, int64_t n, const DeviceSampleResult* results,
                                int32_t n_rows, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 64));
  take_sampled_tokens_kernel<<<blocks, kThreads, 0, stream>>>(tokens, n, results, n_rows);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace pagellm::cuda
