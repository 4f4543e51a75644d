// Paged attention over the KV cache, for decode (one query per sequence) and ragged prefill.
// All softmax math is fp32; K/V are read from the cache in bf16.
//
// Decode (max_seqlen_q == 1): one thread block per (sequence, KV head, KV split), so the G query
// heads of a GQA group share every K/V load, read in 16-byte pieces with many loads in flight per
// lane; the scores go through tensor cores where the shapes allow. A block scores its split of
// the context exactly (the scores fit in shared memory), then writes either the final output
// (one split) or its unnormalized partial sum with the split's max and sum of exponentials; the
// last split of a (sequence, KV head) to finish, counted by an atomic, merges them all
// (log-sum-exp rescaling) in the same launch. Where the splits of a (sequence, KV head) fit one
// thread-block cluster (sm_90, up to 16 blocks), they merge through distributed shared memory
// instead: each block pushes its partial sums into the blocks that merge them, one cluster
// barrier, and every block merges a share of the outputs; no partial results in global memory,
// no fence, no atomic. Splitting long contexts keeps all SMs busy at
// small batch. The number of splits is planned on the host from max_seqlen_kv and the batch size;
// each sequence then cuts its own context, on the device, into chunks of whole warps-worth of
// keys: as many as fill the GPU at that batch size, or more where its context needs them (a chunk
// holds at most the plan's chunk of keys). So a launch planned for a bound (a CUDA graph recorded
// for max_model_len) serves every shorter context without cutting it finer than a launch planned
// for that context would.
//
// Prefill: the tensor-core kernel of attention_prefill.cu wherever its shape and alignment
// conditions hold (head dims that are multiples of 8, 16-byte aligned rows: every model's layout).
// The kernel here is the fallback for the rest: one block per (tile of 16 queries, sequence, query
// head) walks tiles of 32 keys from the cache (cached prefix included), with causal and
// sliding-window masks and an online softmax (running max and sum, rescaled accumulators), on
// CUDA cores with fp32 dot products from shared memory.
//
// Both kernels here are launched overlapped with the kernel before (device_utils.cuh) and wait for
// it in pdl_wait() before touching what it may write: q and this step's cache rows come from the
// kernels before, the split counters from the previous decode launch's reset. The decode kernel
// reads the step's metadata and block table before its wait (device_utils.cuh, early loads).
#include <cooperative_groups.h>

#include <algorithm>

#include "backend/cuda/attention_prefill.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"

namespace pagellm::cuda {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeHeadTile = 8;     // query heads accumulated per pass over V
constexpr int kDecodeMinBlocks = 4;    // resident decode blocks per SM the registers must allow
constexpr int kDecodeLoads = 4;  // 16-byte row loads per lane per group (two groups in flight)
constexpr int kMaxChunk = 1024;        // KV tokens per decode split, at most
constexpr int kMinChunk = 64;          // below this, splitting costs more than it gains
constexpr int kMaxWalk = 8;            // pieces of its context one decode block may walk
constexpr int kMaxDecodeBlockSize = 16384;  // DecodePlan::blk_magic's range
constexpr int kSmemSoftBudget = 64 * 1024;
constexpr int kSmemHardLimit = 227 * 1024;  // sm_90's opt-in maximum per block (sm_80: 163 KiB)
constexpr int kMaxCluster = 16;  // sm_90's largest thread-block cluster (non-portable above 8)
constexpr int kPortableCluster = 8;
// Clusters above the portable size only for blocks of at most this much shared memory (what
// device_cluster_limit() checks the device can schedule).
constexpr int kLargeClusterSmem = kSmemSoftBudget + 16 * 1024;

constexpr int kPrefillThreads = 128;
constexpr int kBq = 16;  // queries per prefill tile
constexpr int kBk = 32;  // keys per prefill tile
constexpr int kThreadsPerRow = kPrefillThreads / kBq;  // 8 threads share one query row

__device__ __forceinline__ const bf16* cache_row(const CacheView& c, const int32_t* table,
                                                 int32_t pos, int32_t block_size, int64_t head) {
  const int64_t blk = table[pos / block_size];
  return static_cast<const bf16*>(c.data) + blk * c.stride_block + (pos % block_size) * c.stride_tok +
         head * c.stride_head;
}

__device__ __forceinline__ float cap_score(float s, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

// How a decode launch divides its work: n_splits blocks for each (sequence, KV head), each
// sequence cutting its own span into at most that many chunks of whole 32-key pieces (see
// fill_splits), so a launch planned for a bound also serves every shorter context. (Cutting the
// keys of the whole batch into equal pieces instead, a whole number of waves, measured the same at
// equal lengths and made the grid and scratch grow with a graph's planned bound: docs/perf-history
// "Ninth round".)
struct DecodePlan {
  int chunk = 0, n_splits = 1, group = 1, dmax = 0;
  // Splits that fill the GPU at this batch size: no sequence is cut into more pieces than this,
  // even when the plan's bound (a graph's max_model_len) allows more splits: at 512 sequences
  // planned for 8192 tokens, a 640-token context is one piece, not 7 merged pieces of 96 keys.
  int fill_splits = 1;
  // The shortest piece a sequence cuts (min_chunk(), a multiple of 32): a launch planned for a
  // long bound (a graph's context tier) has short chunks to spare, and without this floor a
  // 600-token context planned for 8,192 became 19 pieces of 32 keys instead of the 10 of 64 that
  // a launch planned for its own length makes.
  int min_chunk = 32;
  int blk_cap = 0;  // cache blocks a split's keys can touch: chunk / block_size + 2
  // ceil(2^32 / (2 * block_size)): __umulhi(2q + 1, blk_magic) == q / block_size for the in-split
  // positions q (< block_size + chunk; exact while (2q + 1) * 2 * block_size < 2^32, so block
  // sizes up to kMaxDecodeBlockSize), one multiply instead of a division or a branch per row.
  uint32_t blk_magic = 0;
  int64_t slots = 0;  // partial results the workspace holds (0: one split, nothing is merged)
  // Blocks per (sequence, KV head): block x attends pieces x, x + grid_splits, ... of its
  // sequence's context (see plan_decode), so the grid does not grow with the bound.
  int grid_splits = 1;
  size_t smem = 0;
  // > 0: the launch runs in clusters of this many blocks, one per split of a (sequence, KV head)
  // (grid_splits == n_splits: no walk), which merge through distributed shared memory; slots is
  // then 0 (no workspace, no counters).
  int cluster = 0;
};

int dmax_for(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

// The shortest split the plan makes: kMinChunk, or PAGELLM_DECODE_MIN_CHUNK (a multiple of 32
// from 32 to kMaxChunk; to measure the batch-1 trade between more blocks and a longer merge).
int64_t min_chunk() {
  static const int64_t v = tuning::integer("PAGELLM_DECODE_MIN_CHUNK", kMinChunk);
  return v;
}

int device_cluster_limit();  // below the kernels: it asks the device about one of them

// The most blocks a clustered launch puts in one cluster: kMaxCluster, or PAGELLM_DECODE_CLUSTER
// (0 turns clusters off, to measure them; 2 to 16), within what the device schedules
// (device_cluster_limit(): 0 before sm_90).
int max_cluster() {
  static const int64_t v = tuning::integer("PAGELLM_DECODE_CLUSTER", kMaxCluster);
  return std::min(static_cast<int>(v), device_cluster_limit());
}

// Shared memory of one decode block for a chunk of `chunk` keys (layout above attend_split).
// The scores region also holds the merge weights of the last split ([G][n_splits]), so it is
// sized for max(chunk, n_splits) (scores_cap); a clustered launch adds its P.V sums.
int64_t decode_smem_bytes(int group, int dmax, int64_t chunk, int64_t scores_cap, int block_size,
                          bool clustered) {
  const int64_t tile = std::min(group, kDecodeHeadTile);
  return (chunk / block_size + 2) * 2 * static_cast<int64_t>(sizeof(void*)) +
         static_cast<int64_t>(group) * dmax * 2 + kDecodeWarps * tile * dmax * 4 +
         static_cast<int64_t>(group) * scores_cap * 4 + 2 * group * 4 +
         (clustered ? (2 * static_cast<int64_t>(group) * dmax + kMaxCluster) * 4 +
                          static_cast<int64_t>(kMaxCluster) * group * 2 * 4
                    : 0);
}

DecodePlan plan_decode(const AttentionArgs& a, int n_sms) {
  DecodePlan p;
  p.group = a.hq / a.hkv;
  p.dmax = dmax_for(std::max(a.head_dim, a.head_dim_v));
  int64_t max_len = std::max(a.max_seqlen_kv, 1);
  if (a.window > 0) max_len = std::min<int64_t>(max_len, a.window);
  const int bs = std::max(a.block_size, 1);
  // The longest chunk whose scores fit the soft budget (scores and block bases grow with it).
  const int64_t fixed = decode_smem_bytes(p.group, p.dmax, 0, 0, bs, false);
  const int64_t per_key = static_cast<int64_t>(p.group) * 4 + (2 * sizeof(void*) + bs - 1) / bs;
  int64_t cap = (kSmemSoftBudget - fixed) / per_key / 32 * 32;
  cap = std::clamp<int64_t>(cap, 32, kMaxChunk);
  // Enough blocks for two waves over the SMs, but no chunk shorter than kMinChunk.
  const int64_t items = static_cast<int64_t>(a.n_seqs) * a.hkv;
  const int64_t want_splits = std::max<int64_t>(1, (2 * n_sms + items - 1) / items);
  int64_t chunk = (max_len + want_splits - 1) / want_splits;
  chunk = (chunk + 31) / 32 * 32;
  chunk = std::clamp<int64_t>(chunk, std::min<int64_t>(min_chunk(), cap), cap);
  p.chunk = static_cast<int>(chunk);
  p.fill_splits = static_cast<int>(want_splits);  // <= 2 * n_sms
  p.min_chunk = static_cast<int>(min_chunk());
  p.blk_cap = static_cast<int>(chunk / bs + 2);
  p.blk_magic = static_cast<uint32_t>(((uint64_t{1} << 32) + 2 * bs - 1) / (2 * bs));
  p.n_splits = static_cast<int>((max_len + chunk - 1) / chunk);
  // A launch planned for a long bound (a graph's 131,072-key context tier) has n_splits pieces of
  // every (sequence, KV head), nearly all empty for short contexts; each was a block that left at
  // once, and at 512 sequences those 524K blocks doubled the call (docs/perf-history, seventeenth
  // round). So a block walks up to kMaxWalk pieces, while the grid keeps at least two waves of the
  // blocks the SMs hold at once (so at batch 1 every piece of a 131,072-key context still has its
  // own block).
  const int64_t resident = 2 * static_cast<int64_t>(n_sms) * kDecodeMinBlocks;
  p.grid_splits = static_cast<int>(std::min<int64_t>(
      p.n_splits,
      std::max<int64_t>((p.n_splits + kMaxWalk - 1) / kMaxWalk, (resident + items - 1) / items)));
  // Every piece its own block and few enough pieces for a cluster: the splits merge in the
  // cluster's shared memory instead of through global partials and the last block's reads
  // (a batch-1 step's attention is a chain of latencies, and that merge was its tail).
  const int64_t scores_cap = std::max<int64_t>(chunk, p.n_splits);
  const int64_t clustered_smem = decode_smem_bytes(p.group, p.dmax, chunk, scores_cap, bs, true);
  if (p.n_splits > 1 && p.grid_splits == p.n_splits && p.n_splits <= max_cluster() &&
      (p.n_splits <= kPortableCluster || clustered_smem <= kLargeClusterSmem))
    p.cluster = p.n_splits;
  p.slots = p.n_splits > 1 && p.cluster == 0 ? items * p.n_splits : 0;
  p.smem = static_cast<size_t>(
      p.cluster > 0 ? clustered_smem
                    : decode_smem_bytes(p.group, p.dmax, chunk, scores_cap, bs, false));
  return p;
}

// 8 bf16 (16 bytes) of a cache row starting at element e of a row of n elements, for the
// decode kernel's lanes that cover dims up to DMAX >= n. kAligned: rows and strides are multiples
// of 8 elements on 16-byte boundaries, so one vector load serves; a lane past the row's end loads
// the row's last 8 elements again rather than predicating the load (its dims meet q's zero
// padding in the scores, and its P.V sums are never written out). Otherwise element loads (odd
// head dims or strides), zeros past the end.
template <bool kAligned>
__device__ __forceinline__ uint4 load_row8(const bf16* row, int e, int n) {
  if constexpr (kAligned) {
    return *reinterpret_cast<const uint4*>(row + min(e, n - 8));
  } else {
    union {
      uint4 v;
      bf16 h[8];
    } u;
#pragma unroll
    for (int i = 0; i < 8; ++i) u.h[i] = e + i < n ? row[e + i] : from_float<bf16>(0.0f);
    return u.v;
  }
}

// Sums N values over each group of Off * 2 consecutive lanes ("transposed" reduction): at each of
// the first log2(N) levels a lane keeps one half of its values and sends the other half to its
// partner, so the N sums cost N - 1 + log2(group / N) shuffles instead of N * log2(group).
// Afterwards v[0] holds the sum of value reduced_index<Off * 2, N>(lane).
template <int Off, int N>
__device__ __forceinline__ void transpose_reduce(float* v, int lane) {
  if constexpr (Off >= 1) {
    if constexpr (N > 1) {
      const bool upper = lane & Off;
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const float send = upper ? v[i] : v[i + N / 2];
        const float keep = upper ? v[i + N / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, Off);
      }
      transpose_reduce<Off / 2, N / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], Off);
      transpose_reduce<Off / 2, 1>(v, lane);
    }
  }
}
template <int Group, int N>
__device__ __forceinline__ int reduced_index(int lane) {
  int idx = 0;
#pragma unroll
  for (int n = N, off = Group / 2; n > 1; n /= 2, off /= 2)
    if (lane & off) idx += n / 2;
  return idx;
}

// Zeros the outputs of n_heads query heads from h0 of query token q_tok: a padding sequence of a
// graph batch (a query, no context) gets 0, not NaN or stale values.
__device__ __forceinline__ void zero_heads(const AttentionArgs& a, int q_tok, int h0, int n_heads) {
  const int Dv = a.head_dim_v;
  for (int idx = threadIdx.x; idx < n_heads * Dv; idx += kDecodeThreads) {
    bf16* o =
        static_cast<bf16*>(a.out) + q_tok * a.o_stride_tok + (h0 + idx / Dv) * a.o_stride_head;
    o[idx % Dv] = from_float<bf16>(0.0f);
  }
}

// Where head kvh's rows of each cache block of a split starting at key `begin` start, K and V,
// into the first 2 x p.blk_cap pointers of shared memory: computed once, so a row load needs no
// table load and no 64-bit stride products (the per-row address had been ~30 instructions a
// 16-byte load: docs/perf-history "Tenth round"). It reads only the step's block table, which no
// kernel of the step writes, so the decode kernel does it before pdl_wait() for its first piece.
__device__ __forceinline__ void stage_block_bases(const AttentionArgs& a, const DecodePlan& p,
                                                  unsigned char* smem, int s, int kvh,
                                                  int32_t begin, int32_t n_tok) {
  const bf16** kbase = reinterpret_cast<const bf16**>(smem);
  const bf16** vbase = kbase + p.blk_cap;
  const int bs = a.block_size;
  const int32_t first_blk = begin / bs;
  const int n_blk = (begin - first_blk * bs + n_tok - 1) / bs + 1;
  const int32_t* table = a.block_tables + s * a.block_table_ld;
  for (int i = threadIdx.x; i < n_blk; i += kDecodeThreads) {
    const int64_t b = table[first_blk + i];
    kbase[i] = static_cast<const bf16*>(a.k_cache.data) + b * a.k_cache.stride_block +
               kvh * a.k_cache.stride_head;
    vbase[i] = static_cast<const bf16*>(a.v_cache.data) + b * a.v_cache.stride_block +
               kvh * a.v_cache.stride_head;
  }
}

// A decode block's shared memory (layout above attend_split): tile is the block's accumulator
// rows per pass over V.
struct DecodeSmem {
  const bf16** kbase;
  const bf16** vbase;
  bf16* qs;
  float* red;
  float* scores;
  float* ml;
  float* pv;     // a clustered launch's P.V sums of this split, [G][DMAX]
  float* pv_in;  // the shares of the splits' sums this block merges, [n][share] (push_split)
  float* ml_in;  // and their (m, l), [n][G][2]
};

template <int DMAX>
__device__ __forceinline__ DecodeSmem smem_layout(const DecodePlan& p, unsigned char* smem, int G,
                                                  int tile) {
  DecodeSmem m;
  m.kbase = reinterpret_cast<const bf16**>(smem);
  m.vbase = m.kbase + p.blk_cap;
  m.qs = reinterpret_cast<bf16*>(m.vbase + p.blk_cap);
  m.red = reinterpret_cast<float*>(m.qs + static_cast<size_t>(G) * DMAX);
  m.scores = m.red + static_cast<size_t>(kDecodeWarps) * tile * DMAX;
  m.ml = m.scores + static_cast<size_t>(G) * max(p.chunk, p.n_splits);
  m.pv = m.ml + 2 * G;
  m.pv_in = m.pv + static_cast<size_t>(G) * DMAX;
  m.ml_in = m.pv_in + static_cast<size_t>(G) * DMAX + kMaxCluster;
  return m;
}

// Thread-block cluster barriers (sm_90), each thread of every block of the cluster taking part:
// arrive without ordering (it says only that the block has started), arrive releasing the
// block's earlier writes to shared memory of the cluster, and wait (acquiring the others').
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// One block's split: keys [begin, begin + n_tok) of sequence s for KV head kvh, split `split` of
// the n_parts that hold keys, whose partial results sit in workspace slots slot0 + i. kDecodeWarps
// warps; each lane keeps the next rows' loads in flight while it uses the
// current ones. Pass 1 scores the split's keys for every head of the GQA group, each K row loaded
// once for all of them: on tensor cores where the shapes allow (the kernel is bound by its
// instructions more than by memory: docs/perf-history "Ninth round"), else on CUDA cores with the
// per-row dot products summed over a row's lanes by transpose_reduce. Then an exact softmax per
// head over the split, then pass 2 streams the V rows, each lane accumulating its 8 dims for a
// tile of heads. A whole context (one part) writes the output; otherwise the part writes its
// unnormalized sum with its max and sum of exponentials, and the last part to finish, counted
// by an atomic, merges them all (log-sum-exp rescaling). In a clustered launch the sum stays in
// shared memory (pv) for push_split.
//
// Shared memory: K and V row bases of the split's cache blocks, bf16 pointers [2][blk_cap] |
//                q bf16 [G][DMAX] | PV partial sums f32 [kDecodeWarps][tile][DMAX] |
//                scores f32 [G][max(chunk, n_splits)] | m, l f32 [G][2] |
//                clustered: P.V sums f32 [G][DMAX] | pushed sums f32 [G][DMAX] + kMaxCluster |
//                pushed (m, l) f32 [kMaxCluster][G][2].
// kG: the GQA group size when known at compile time (1, 2, 4 or 8: the head loops unroll and the
// P.V accumulators are exactly the group's), 0 for any other size (tiles of kDecodeHeadTile).
template <int DMAX, bool kAligned, int kG>
__device__ __forceinline__ void attend_split(const AttentionArgs& a, const DecodePlan& p,
                                             unsigned char* smem, int s, int kvh, int q_tok,
                                             int32_t begin, int32_t n_tok, int split, int64_t slot0,
                                             int n_parts, bool staged, float* __restrict__ part_acc,
                                             float* __restrict__ part_ml,
                                             int32_t* __restrict__ counters) {
  constexpr int L = DMAX / 8;             // lanes per cache row
  constexpr int KPW = 32 / L;             // rows per warp-wide load
  constexpr int KW = KPW * kDecodeLoads;  // rows per warp per group
  static_assert(L >= kDecodeLoads, "transpose_reduce needs a lane per loaded row");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kTile = kG > 0 ? kG : kDecodeHeadTile;  // accumulator rows per pass over V
  const int G = kG > 0 ? kG : a.hq / a.hkv, D = a.head_dim, Dv = a.head_dim_v;
  const int tile = min(G, kTile);
  const int chunk = p.chunk;  // the scores' row stride
  const DecodeSmem sm = smem_layout<DMAX>(p, smem, G, tile);
  const bf16** kbase = sm.kbase;
  const bf16** vbase = sm.vbase;
  bf16* qs = sm.qs;
  float* red = sm.red;
  float* scores = sm.scores;
  float* ml = sm.ml;
  const int h0 = kvh * G;
  const int bs = a.block_size;
  const int begin_in = begin % bs;  // the split's first key within its first block
  // The row bases (staged: already in shared memory, the decode kernel wrote them before its
  // wait, and a barrier followed).
  if (!staged) {
    stage_block_bases(a, p, smem, s, kvh, begin, n_tok);
    __syncthreads();
  }

  // Row t of the split, clamped to its last row: a load past the split reads a real row whose
  // scores and weights are never used, so no branch guards the loads. (32-bit token strides:
  // launch_attention checks.)
  const int k_tok = static_cast<int>(a.k_cache.stride_tok);
  const int v_tok = static_cast<int>(a.v_cache.stride_tok);
  auto row = [&](const bf16* const* base, int stride_tok, int t) {
    const uint32_t q = static_cast<uint32_t>(min(t, n_tok - 1) + begin_in);
    const uint32_t b = __umulhi(2u * q + 1u, p.blk_magic);  // q / bs
    const bf16* r = base[b] + static_cast<int64_t>(static_cast<int>(q - b * bs)) * stride_tok;
    __builtin_assume(__isGlobal(r));  // global loads, not generic ones (the base came from smem)
    return r;
  };
  const int sub = lane % L, kk = lane / L, e0 = sub * 8;
  // Scores on tensor cores: 16-byte rows, a GQA group that fits one 8-column tile, and head dims
  // up to 128 (a lane holds two steps of 2 x DMAX / 32 pieces of K rows).
  constexpr bool kMmaScores = kAligned && kG >= 1 && kG <= 8 && DMAX <= 128;

  // Lane's share of one group of rows: rows t0 + u * KPW + kk for u < kDecodeLoads (past the
  // split: the last row again). A warp's groups are kStride rows apart.
  auto load_group = [&](const bf16* const* base, int stride_tok, int n, int t0,
                        uint4(&raw)[kDecodeLoads]) {
#pragma unroll
    for (int u = 0; u < kDecodeLoads; ++u)
      raw[u] = load_row8<kAligned>(row(base, stride_tok, t0 + u * KPW + kk), e0, n);
  };
  constexpr int kStride = kDecodeWarps * KW;

  // The first group of V rows is requested with the first K rows: V does not depend on the scores,
  // and a short split (of a batch-1 step) then costs one memory round, not two. On tensor cores
  // both go out before q's loads too (K does not depend on q either); on CUDA cores, whose
  // registers are short, after q is in shared memory.
  uint4 v_first[kDecodeLoads];
  constexpr int J = DMAX / 32;  // tensor cores: 16-byte pieces of one key a lane loads
  const int r = lane >> 2, c = lane & 3;
  // Tensor cores: lane (r, c) loads dims 32j + 8c .. + 7 of keys t0 + r and t0 + r + 8 (below).
  auto load_keys = [&](int t0, uint4(&raw)[2][J]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const bf16* key = row(kbase, k_tok, t0 + r + 8 * half);
#pragma unroll
      for (int j = 0; j < J; ++j) raw[half][j] = load_row8<true>(key, 32 * j + 8 * c, D);
    }
  };
  uint4 k_first[2][J];
  if constexpr (kMmaScores) {
    load_group(vbase, v_tok, Dv, warp * KW, v_first);
    load_keys(warp * 16, k_first);
  }
  // q, zero-padded to DMAX: lanes past the head dim multiply zeros, never stale shared memory.
  const bf16* q = static_cast<const bf16*>(a.q) + q_tok * a.q_stride_tok;
  for (int idx = tid; idx < G * DMAX; idx += kDecodeThreads) {
    const int g = idx / DMAX, e = idx % DMAX;
    qs[idx] = e < D ? q[(h0 + g) * a.q_stride_head + e] : from_float<bf16>(0.0f);
  }
  __syncthreads();
  if constexpr (!kMmaScores) load_group(vbase, v_tok, Dv, warp * KW, v_first);

  // Pass 1: scores.
  if constexpr (kMmaScores) {
    // On tensor cores: S^T = K . Q^T, one m16n8k16 product per 16 keys and 16 dims, the keys as
    // rows (A, straight from the cache rows in registers) and the heads as columns (B, q in
    // registers for the whole split). The dot product does not care in which order it takes the
    // dims, so each lane's 16-byte piece of a key feeds its A registers as loaded: lane (r, c)
    // (r = lane / 4, c = lane % 4) loads dims 32j + 8c .. + 7 of keys r and r + 8 of the step,
    // and k-step 2j + h takes the words 2h, 2h + 1 of piece j as its logical dims (2c, 2c + 1)
    // and (2c + 8, 2c + 9); q's columns follow the same order. A warp takes 16 keys a step, the
    // warps interleaved; the next step's rows are loaded before this step's products.
    uint32_t qb[J][2][2];  // [j][h][b0, b1]: head r's dims 32j + 8c + 4h + {0,1} / {2,3}
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const uint4 w = r < G ? *reinterpret_cast<const uint4*>(qs + r * DMAX + 32 * j + 8 * c)
                            : make_uint4(0, 0, 0, 0);
      qb[j][0][0] = w.x;
      qb[j][0][1] = w.y;
      qb[j][1][0] = w.z;
      qb[j][1][1] = w.w;
    }
    constexpr int kKeyStride = kDecodeWarps * 16;
    uint4 cur[2][J], nxt[2][J] = {};
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < J; ++j) cur[half][j] = k_first[half][j];
    for (int t0 = warp * 16; t0 < n_tok; t0 += kKeyStride) {
      if (t0 + kKeyStride < n_tok) load_keys(t0 + kKeyStride, nxt);
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const uint32_t lo[4] = {cur[0][j].x, cur[0][j].y, cur[0][j].z, cur[0][j].w};
        const uint32_t hi[4] = {cur[1][j].x, cur[1][j].y, cur[1][j].z, cur[1][j].w};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t af[4] = {lo[2 * h], hi[2 * h], lo[2 * h + 1], hi[2 * h + 1]};
          mma_bf16(acc, af, qb[j][h][0], qb[j][h][1]);
        }
      }
      // acc: keys t0 + r (0, 1) and t0 + r + 8 (2, 3), heads 2c (0, 2) and 2c + 1 (1, 3).
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int g = 2 * c + (i & 1), t = t0 + r + 8 * (i >> 1);
        if (g < G && t < n_tok) scores[g * chunk + t] = cap_score(acc[i] * a.scale, a.softcap);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < J; ++j) cur[half][j] = nxt[half][j];
    }
  } else {
    // On CUDA cores. Software-pipelined: the next group's loads are issued before this group's
    // math, so each warp always has a group in flight.
    uint4 cur[kDecodeLoads], nxt[kDecodeLoads];
#pragma unroll
    for (int u = 0; u < kDecodeLoads; ++u) nxt[u] = make_uint4(0, 0, 0, 0);
    load_group(kbase, k_tok, D, warp * KW, cur);
    for (int t0 = warp * KW; t0 < n_tok; t0 += kStride) {
      if (t0 + kStride < n_tok) load_group(kbase, k_tok, D, t0 + kStride, nxt);
      float kf[kDecodeLoads][8];
#pragma unroll
      for (int u = 0; u < kDecodeLoads; ++u) unpack_bf16x8(cur[u], kf[u]);
      const int u_mine = reduced_index<L, kDecodeLoads>(lane);
      const int t_mine = t0 + u_mine * KPW + kk;
      const bool writer = (lane & (L / kDecodeLoads - 1)) == 0 && t_mine < n_tok;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float qf[8];
        unpack_bf16x8(*reinterpret_cast<const uint4*>(qs + g * DMAX + e0), qf);
        float dot[kDecodeLoads];
#pragma unroll
        for (int u = 0; u < kDecodeLoads; ++u) {
          float d = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) d = fmaf(qf[i], kf[u][i], d);
          dot[u] = d;
        }
        transpose_reduce<L / 2, kDecodeLoads>(dot, lane);
        if (writer) scores[g * chunk + t_mine] = cap_score(dot[0] * a.scale, a.softcap);
      }
#pragma unroll
      for (int u = 0; u < kDecodeLoads; ++u) cur[u] = nxt[u];
    }
  }
  __syncthreads();

  // Exact softmax over the split, per head: scores become exp(s - m), and (m, l) are kept.
  for (int g = warp; g < G; g += kDecodeWarps) {
    float m = -INFINITY;
    for (int t = lane; t < n_tok; t += 32) m = fmaxf(m, scores[g * chunk + t]);
    m = warp_max(m);
    float l = 0.0f;
    for (int t = lane; t < n_tok; t += 32) {
      const float e = expf(scores[g * chunk + t] - m);
      scores[g * chunk + t] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) {
      ml[2 * g] = m;
      ml[2 * g + 1] = l;
    }
  }
  __syncthreads();

  // Pass 2: P . V for a tile of heads at a time; lane accumulates dims [e0, e0 + 8) of its rows.
  const int64_t my_slot = slot0 + split;
  for (int g0 = 0; g0 < G; g0 += tile) {
    const int gn = min(tile, G - g0);
    float acc[kTile][8];
#pragma unroll
    for (int gg = 0; gg < kTile; ++gg)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[gg][i] = 0.0f;
    uint4 cur[kDecodeLoads], nxt[kDecodeLoads];
#pragma unroll
    for (int u = 0; u < kDecodeLoads; ++u) nxt[u] = make_uint4(0, 0, 0, 0);
    if (g0 == 0) {
#pragma unroll
      for (int u = 0; u < kDecodeLoads; ++u) cur[u] = v_first[u];
    } else {
      load_group(vbase, v_tok, Dv, warp * KW, cur);
    }
    for (int t0 = warp * KW; t0 < n_tok; t0 += kStride) {
      if (t0 + kStride < n_tok) load_group(vbase, v_tok, Dv, t0 + kStride, nxt);
#pragma unroll
      for (int u = 0; u < kDecodeLoads; ++u) {
        const int t = t0 + u * KPW + kk;
        if (t < n_tok) {
          float vf[8];
          unpack_bf16x8(cur[u], vf);
#pragma unroll
          for (int gg = 0; gg < kTile; ++gg) {
            if (gg < gn) {
              const float pr = scores[(g0 + gg) * chunk + t];
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[gg][i] = fmaf(pr, vf[i], acc[gg][i]);
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kDecodeLoads; ++u) cur[u] = nxt[u];
    }
    // Sum the rows a warp held side by side (lanes kk * L + sub), then the warps.
#pragma unroll
    for (int gg = 0; gg < kTile; ++gg) {
      if (gg < gn) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int off = L; off < 32; off *= 2)
            acc[gg][i] += __shfl_xor_sync(0xffffffffu, acc[gg][i], off);
        if (kk == 0) {
#pragma unroll
          for (int i = 0; i < 8; ++i) red[(warp * tile + gg) * DMAX + e0 + i] = acc[gg][i];
        }
      }
    }
    __syncthreads();
    for (int idx = tid; idx < gn * Dv; idx += kDecodeThreads) {
      const int gg = idx / Dv, e = idx % Dv, g = g0 + gg, h = h0 + g;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) v += red[(w * tile + gg) * DMAX + e];
      if (n_parts == 1) {
        // l >= 1: the split holds at least one key.
        const float l = ml[2 * g + 1];
        bf16* o = static_cast<bf16*>(a.out) + q_tok * a.o_stride_tok + h * a.o_stride_head;
        o[e] = from_float<bf16>(l > 0.0f ? v / l : 0.0f);
      } else if (p.cluster > 0) {
        sm.pv[g * DMAX + e] = v;
      } else {
        const int64_t slot = my_slot * G + g;
        part_acc[slot * Dv + e] = v;
        if (e == 0) {
          part_ml[2 * slot] = ml[2 * g];
          part_ml[2 * slot + 1] = ml[2 * g + 1];
        }
      }
    }
    __syncthreads();  // red is reused by the next head tile
  }
  if (n_parts == 1 || p.cluster > 0) return;

  // Arrival: every thread's partials are made visible device-wide before the block counts itself;
  // the block that brings the count to n_parts merges, and sees every other block's partials.
  __shared__ bool merge_here;
  __threadfence();
  __syncthreads();
  int32_t* counter = counters + static_cast<int64_t>(s) * a.hkv + kvh;
  if (tid == 0) merge_here = atomicAdd(counter, 1) == n_parts - 1;
  __syncthreads();
  if (!merge_here) return;
  __threadfence();

  // out = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i over the parts of each head. The
  // weights go where the scores were.
  const int n_live = n_parts;
  float* wgt = scores;  // [G][n_live]
  for (int g = warp; g < G; g += kDecodeWarps) {
    float m_all = -INFINITY;
    for (int i = lane; i < n_live; i += 32) {
      const float* ml_i = part_ml + 2 * ((slot0 + i) * G + g);
      if (__ldcg(ml_i + 1) > 0.0f) m_all = fmaxf(m_all, __ldcg(ml_i));
    }
    m_all = warp_max(m_all);
    float l_all = 0.0f;
    for (int i = lane; i < n_live; i += 32) {
      const float* ml_i = part_ml + 2 * ((slot0 + i) * G + g);
      const float l = __ldcg(ml_i + 1);
      const float w = l > 0.0f ? expf(__ldcg(ml_i) - m_all) : 0.0f;
      wgt[g * n_live + i] = w;
      l_all += w * l;
    }
    l_all = warp_sum(l_all);
    const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
    for (int i = lane; i < n_live; i += 32) wgt[g * n_live + i] *= inv;
  }
  __syncthreads();
  // kOut outputs per thread, so the loads of each part go out together.
  constexpr int kOut = 4;
  for (int idx0 = tid; idx0 < G * Dv; idx0 += kDecodeThreads * kOut) {
    float v[kOut];
    int off[kOut];
    const float* w[kOut];
#pragma unroll
    for (int j = 0; j < kOut; ++j) {
      const int idx = min(idx0 + j * kDecodeThreads, G * Dv - 1);  // past the end: a valid repeat
      const int g = idx / Dv, e = idx % Dv;
      off[j] = g * Dv + e;
      w[j] = wgt + g * n_live;
      v[j] = 0.0f;
    }
#pragma unroll 2
    for (int i = 0; i < n_live; ++i) {
      const float* src = part_acc + (slot0 + i) * G * Dv;
#pragma unroll
      for (int j = 0; j < kOut; ++j) v[j] = fmaf(w[j][i], __ldcg(src + off[j]), v[j]);
    }
#pragma unroll
    for (int j = 0; j < kOut; ++j) {
      const int idx = idx0 + j * kDecodeThreads;
      if (idx >= G * Dv) break;
      const int g = idx / Dv, e = idx % Dv, h = h0 + g;
      bf16* o = static_cast<bf16*>(a.out) + q_tok * a.o_stride_tok + h * a.o_stride_head;
      o[e] = from_float<bf16>(v[j]);
    }
  }
  if (tid == 0) *counter = 0;  // ready for the next launch (graph replays reuse the counters)
}

// The merge of a clustered launch (DecodePlan::cluster). Block r of the cluster merges outputs
// [r * share, (r + 1) * share) of the G x Dv; each split first pushes what those need into that
// block's shared memory (its (m, l) of every head into every block: -inf and 0 for a split
// without keys, whose sums are then never read), all before one cluster barrier. (Each block
// reading the others' sums after a barrier instead, with a second barrier keeping its own alive
// until they were read, was 0.75 us slower a call: docs/perf-history "Twenty-sixth round".)
__device__ __forceinline__ int push_share(int total, int n) {
  return (total + n - 1) / n;
}

template <int DMAX>
__device__ __forceinline__ void push_split(const AttentionArgs& a, const DecodeSmem& sm, int G,
                                           int n, int split, bool has_keys) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int Dv = a.head_dim_v, total = G * Dv, share = push_share(total, n);
  if (has_keys) {
    for (int idx = threadIdx.x; idx < total; idx += kDecodeThreads) {
      const int g = idx / Dv, r = idx / share;
      cluster.map_shared_rank(sm.pv_in, r)[split * share + idx - r * share] =
          sm.pv[g * DMAX + idx - g * Dv];
    }
  }
  for (int idx = threadIdx.x; idx < n * G; idx += kDecodeThreads) {
    const int r = idx / G, g = idx - r * G;
    float* dst = cluster.map_shared_rank(sm.ml_in, r) + 2 * (split * G + g);
    dst[0] = has_keys ? sm.ml[2 * g] : -INFINITY;
    dst[1] = has_keys ? sm.ml[2 * g + 1] : 0.0f;
  }
#else
  (void)a, (void)sm, (void)G, (void)n, (void)split, (void)has_keys;
#endif
}

// After the pushes: the barrier, then this block's share merged from its own shared memory
// (log-sum-exp rescaling, as the global merge). Nothing reads another block's shared memory
// after the barrier, so none waits for a second one.
template <int DMAX>
__device__ __forceinline__ void merge_pushed(const AttentionArgs& a, const DecodeSmem& sm, int G,
                                             int h0, int q_tok, int n, int rank) {
  cluster_arrive_release();
  cluster_wait();
  const int Dv = a.head_dim_v, total = G * Dv, share = push_share(total, n);
  const int begin = rank * share, end = min(total, begin + share);
  for (int idx = begin + static_cast<int>(threadIdx.x); idx < end; idx += kDecodeThreads) {
    const int g = idx / Dv, e = idx - g * Dv, j = idx - begin;
    float m_all = -INFINITY, l_all = 0.0f, v = 0.0f;
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
      const float m = sm.ml_in[2 * (i * G + g)], l = sm.ml_in[2 * (i * G + g) + 1];
      const float x = sm.pv_in[i * share + j];
      if (l > 0.0f) {     // a split without keys adds nothing (its sums were never pushed)
        if (m > m_all) {  // rescale what is summed so far to the new maximum
          const float r = expf(m_all - m);  // 0 on the first split (m_all = -inf)
          l_all *= r;
          v *= r;
          m_all = m;
        }
        const float w = expf(m - m_all);
        l_all = fmaf(w, l, l_all);
        v = fmaf(w, x, v);
      }
    }
    bf16* o = static_cast<bf16*>(a.out) + q_tok * a.o_stride_tok + (h0 + g) * a.o_stride_head;
    o[e] = from_float<bf16>(l_all > 0.0f ? v / l_all : 0.0f);
  }
}

// A decode launch (see DecodePlan): block (x, KV head, sequence) attends over pieces x,
// x + grid_splits, ... of its sequence's context, one after the other; each piece writes its own
// partial result (or the output, when it is the only one), and the last piece to finish merges.
template <int DMAX, bool kAligned, int kG>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeMinBlocks)
    decode_kernel(AttentionArgs a, DecodePlan p, float* __restrict__ part_acc,
                  float* __restrict__ part_ml, int32_t* __restrict__ counters) {
  extern __shared__ __align__(16) unsigned char decode_smem[];
  const int G = kG > 0 ? kG : a.hq / a.hkv;
  const int first = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
  // The step's metadata (uploaded before the step; no kernel of it writes them) and the first
  // piece's row bases are read before the wait, so the chain after it starts with the rows
  // themselves. Every thread still waits before leaving (device_utils.cuh).
  const int q_tok = a.cu_seqlens_q[s];
  const bool has_query = a.cu_seqlens_q[s + 1] - q_tok > 0;  // in this step
  const int32_t len = a.seq_lens_kv[s];
  const int32_t lo = a.window > 0 ? max(0, len - a.window) : 0;
  const int32_t span = len - lo;
  // This sequence's chunk: its span over the splits it may take (the grid's, at most as many as
  // fill the GPU), rounded up to 32 keys, at least the plan's floor, and at most the plan's chunk
  // (which sizes shared memory).
  const int splits = min(p.n_splits, p.fill_splits);
  const int32_t my_chunk =
      min(p.chunk, max(p.min_chunk, (max(span, 1) + splits - 1) / splits + 31 & ~31));
  // The pieces holding keys (they alone count in the merge); this block takes the first of them
  // that it attends. Uniform over the block.
  const int n_parts = span > 0 ? min(p.n_splits, (span + my_chunk - 1) / my_chunk) : 0;
  const bool attends = has_query && first < n_parts;
  // The cluster merge's first barrier: arriving says only that this block has started, so a push
  // into its shared memory after the wait finds it there (the wait comes long after).
  const bool merges_in_cluster = p.cluster > 0 && has_query && n_parts > 1;
  if (merges_in_cluster) cluster_arrive_relaxed();
  if (attends) {
    stage_block_bases(a, p, decode_smem, s, kvh, lo + first * my_chunk,
                      min(my_chunk, span - first * my_chunk));
    __syncthreads();
  }
  pdl_wait();        // the kernel before may still be running (launch_overlapped)
  pdl_allow_next();  // the output projection's GEMV may start fetching its weights
  if (!has_query) return;
  if (span <= 0) {  // a padding sequence of a graph batch: a query, no context
    if (first == 0) zero_heads(a, q_tok, kvh * G, G);
    return;
  }
  const int64_t slot0 = (static_cast<int64_t>(s) * a.hkv + kvh) * p.n_splits;
  for (int piece = first; piece < n_parts; piece += p.grid_splits) {
    const int32_t off = piece * my_chunk;
    attend_split<DMAX, kAligned, kG>(a, p, decode_smem, s, kvh, q_tok, lo + off,
                                     min(my_chunk, span - off), piece, slot0, n_parts,
                                     piece == first, part_acc, part_ml, counters);
  }
  // A clustered launch has a block per piece (the loop above ran at most once); the pieces merge
  // in the cluster, unless one piece held the whole context and wrote the output.
  if (merges_in_cluster) {
    const DecodeSmem sm =
        smem_layout<DMAX>(p, decode_smem, G, min(G, kG > 0 ? kG : kDecodeHeadTile));
    cluster_wait();  // the barrier arrived at first: every block of the cluster has started
    push_split<DMAX>(a, sm, G, p.cluster, first, attends);
    merge_pushed<DMAX>(a, sm, G, kvh * G, q_tok, p.cluster, first);
  }
}

template <int DMAX>
__global__ void __launch_bounds__(kPrefillThreads) prefill_kernel(AttentionArgs a) {
  // K rows padded by one bf16 pair so the 32 keys a warp scores sit in distinct banks.
  __shared__ bf16 qs[kBq][DMAX];
  __shared__ bf16 ks[kBk][DMAX + 2];
  __shared__ bf16 vs[kBk][DMAX];
  __shared__ float ss[kBq][kBk + 1];
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int tile = blockIdx.x, s = blockIdx.y, h = blockIdx.z;
  const int tid = threadIdx.x;
  const int q_begin = a.cu_seqlens_q[s];
  const int nq_seq = a.cu_seqlens_q[s + 1] - q_begin;
  const int qt0 = tile * kBq;
  if (qt0 >= nq_seq) return;
  const int nq = min(kBq, nq_seq - qt0);
  const int G = a.hq / a.hkv, kvh = h / G, D = a.head_dim, Dv = a.head_dim_v;
  const int32_t pos0 = a.seq_lens_kv[s] - nq_seq + qt0;  // position of the tile's first query
  const int32_t hi = pos0 + nq - 1;                        // last key any query here can see
  const int32_t lo = a.window > 0 ? max(0, pos0 - a.window + 1) : 0;
  const int32_t* table = a.block_tables + s * a.block_table_ld;

  const bf16* q = static_cast<const bf16*>(a.q);
  for (int idx = tid; idx < kBq * D; idx += kPrefillThreads) {
    const int i = idx / D, e = idx % D;
    qs[i][e] = i < nq ? q[(q_begin + qt0 + i) * a.q_stride_tok + h * a.q_stride_head + e]
                      : from_float<bf16>(0.0f);
  }

  const int row = tid / kThreadsPerRow, sub = tid % kThreadsPerRow;
  constexpr int kCols = DMAX / kThreadsPerRow;  // output dims per thread: sub + 8 * c
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  for (int32_t kb = lo; kb <= hi; kb += kBk) {
    __syncthreads();  // the previous tile (and the q load) is done with shared memory
    for (int idx = tid; idx < kBk * D; idx += kPrefillThreads) {
      const int j = idx / D, e = idx % D;
      const int32_t p = kb + j;
      ks[j][e] = p <= hi ? cache_row(a.k_cache, table, p, a.block_size, kvh)[e] : from_float<bf16>(0.0f);
    }
    for (int idx = tid; idx < kBk * Dv; idx += kPrefillThreads) {
      const int j = idx / Dv, e = idx % Dv;
      const int32_t p = kb + j;
      vs[j][e] = p <= hi ? cache_row(a.v_cache, table, p, a.block_size, kvh)[e] : from_float<bf16>(0.0f);
    }
    __syncthreads();
    for (int idx = tid; idx < kBq * kBk; idx += kPrefillThreads) {
      const int i = idx / kBk, j = idx % kBk;
      const int32_t p = kb + j, qpos = pos0 + i;
      const bool visible = i < nq && p <= qpos && (a.window <= 0 || p > qpos - a.window);
      float sc = -INFINITY;
      if (visible) {
        float dot = 0.0f;
        for (int e = 0; e < D; ++e) dot += to_float(qs[i][e]) * to_float(ks[j][e]);
        sc = cap_score(dot * a.scale, a.softcap);
      }
      ss[i][j] = sc;
    }
    __syncthreads();
    // Online softmax for this thread's query row; the 8 threads of a row compute the same m, l.
    float tile_max = -INFINITY;
    for (int j = 0; j < kBk; ++j) tile_max = fmaxf(tile_max, ss[row][j]);
    const float m_new = fmaxf(m, tile_max);
    if (m_new == -INFINITY) continue;  // nothing visible to this row yet
    const float corr = expf(m - m_new);  // 0 on the first visible tile (m == -inf)
    l *= corr;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] *= corr;
    for (int j = 0; j < kBk; ++j) {
      const float sj = ss[row][j];
      if (sj == -INFINITY) continue;
      const float pj = expf(sj - m_new);
      l += pj;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int e = sub + kThreadsPerRow * c;
        if (e < Dv) acc[c] += pj * to_float(vs[j][e]);
      }
    }
    m = m_new;
  }
  if (row < nq) {
    // l >= 1: every query sees at least its own key.
    const float inv = 1.0f / l;
    bf16* o = static_cast<bf16*>(a.out) + (q_begin + qt0 + row) * a.o_stride_tok + h * a.o_stride_head;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int e = sub + kThreadsPerRow * c;
      if (e < Dv) o[e] = from_float<bf16>(acc[c] * inv);
    }
  }
}

// Whether every cache row the decode kernel reads starts on a 16-byte boundary with a multiple of
// 8 elements, so it can load rows in 16-byte pieces.
bool decode_rows_aligned(const AttentionArgs& a) {
  auto ok = [](const CacheView& c) {
    return reinterpret_cast<uintptr_t>(c.data) % 16 == 0 && c.stride_block % 8 == 0 &&
           c.stride_tok % 8 == 0 && c.stride_head % 8 == 0;
  };
  return a.head_dim % 8 == 0 && a.head_dim_v % 8 == 0 && ok(a.k_cache) && ok(a.v_cache);
}

using DecodeKernel = void (*)(AttentionArgs, DecodePlan, float*, float*, int32_t*);

template <int DMAX>
DecodeKernel decode_kernel_of(bool aligned, int group) {
  if (!aligned) return decode_kernel<DMAX, false, 0>;
  switch (group) {
    case 1:
      return decode_kernel<DMAX, true, 1>;
    case 2:
      return decode_kernel<DMAX, true, 2>;
    case 4:
      return decode_kernel<DMAX, true, 4>;
    case 8:
      return decode_kernel<DMAX, true, 8>;
    default:
      return decode_kernel<DMAX, true, 0>;
  }
}

// The largest cluster of decode blocks the current device schedules, looked up once per device:
// kMaxCluster (a non-portable size) where one cluster of that many blocks of kLargeClusterSmem
// fits (not every sm_90 part or partition need have the room), else the portable size; 0
// before sm_90.
int device_cluster_limit() {
  if (!device_is_sm90()) return 0;
  static std::atomic<int> cache[kMaxCachedDevices];
  return cached_per_device(cache, [](int) {
    const DecodeKernel kernel = decode_kernel<256, true, 0>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kLargeClusterSmem));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kMaxCluster);
    cfg.blockDim = dim3(kDecodeThreads);
    cfg.dynamicSmemBytes = kLargeClusterSmem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kMaxCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    const bool fits =
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0;
    (void)cudaGetLastError();  // a refused query leaves no error behind
    return fits ? kMaxCluster : kPortableCluster;
  });
}

DecodeKernel decode_kernel_of(const AttentionArgs& a, int group, int dmax) {
  const bool aligned = decode_rows_aligned(a);
  return dmax == 64    ? decode_kernel_of<64>(aligned, group)
         : dmax == 128 ? decode_kernel_of<128>(aligned, group)
                       : decode_kernel_of<256>(aligned, group);
}

void run_decode(const AttentionArgs& a, const DecodePlan& p, void* workspace, int32_t* counters,
                cudaStream_t stream) {
  float* part_acc = static_cast<float*>(workspace);
  float* part_ml = part_acc == nullptr
                       ? nullptr
                       : part_acc + p.slots * p.group * static_cast<int64_t>(a.head_dim_v);
  PAGELLM_CHECK_MSG(p.smem <= static_cast<size_t>(kSmemHardLimit),
                    "attention: GQA group too large for the decode kernel's shared memory");
  const DecodeKernel kernel = decode_kernel_of(a, p.group, p.dmax);
  if (p.smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(p.smem)));
  if (p.cluster > kPortableCluster)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  launch_overlapped_in_clusters(kernel, dim3(p.grid_splits, a.hkv, a.n_seqs), dim3(kDecodeThreads),
                                p.smem, stream, static_cast<unsigned>(std::max(p.cluster, 1)), a, p,
                                part_acc, part_ml, counters);
  CUDA_CHECK_LAUNCH();
}

template <int DMAX>
void run_prefill(const AttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(ceil_div(a.max_seqlen_q, kBq), a.n_seqs, a.hq);
  launch_overlapped(prefill_kernel<DMAX>, grid, dim3(kPrefillThreads), 0, stream, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t attention_workspace_bytes(const AttentionArgs& a, int n_sms) {
  if (a.max_seqlen_q != 1 || a.n_seqs == 0) return 0;
  const DecodePlan p = plan_decode(a, n_sms);
  return p.slots * p.group * (a.head_dim_v + 2) * static_cast<int64_t>(sizeof(float));
}

int64_t attention_counters(const AttentionArgs& a, int n_sms) {
  if (a.max_seqlen_q != 1 || a.n_seqs == 0) return 0;
  return plan_decode(a, n_sms).slots == 0 ? 0 : static_cast<int64_t>(a.n_seqs) * a.hkv;
}

void launch_attention(const AttentionArgs& a, void* workspace, int32_t* counters, int n_sms,
                      cudaStream_t stream) {
  if (a.n_seqs == 0 || a.max_seqlen_q == 0) return;
  PAGELLM_CHECK_MSG(a.hkv > 0 && a.hq % a.hkv == 0, "attention: query heads not a multiple of KV heads");
  PAGELLM_CHECK_MSG(std::max(a.head_dim, a.head_dim_v) <= 256, "attention: head_dim above 256");
  PAGELLM_CHECK_MSG(a.n_seqs <= 65535 && a.hq <= 65535, "attention: grid too large");
  PAGELLM_CHECK_MSG(
      a.max_seqlen_q != 1 || (a.block_size <= kMaxDecodeBlockSize &&
                              std::max(a.k_cache.stride_tok, a.v_cache.stride_tok) <= INT32_MAX),
      "attention: cache block size or token stride beyond the decode kernel's range");
  const int dmax = dmax_for(std::max(a.head_dim, a.head_dim_v));
  if (a.max_seqlen_q == 1) {
    const DecodePlan p = plan_decode(a, n_sms);
    PAGELLM_CHECK_MSG(p.slots == 0 || (workspace != nullptr && counters != nullptr),
                      "attention: missing workspace or counters");
    run_decode(a, p, workspace, counters, stream);
  } else if (prefill_mma_supported(a)) {
    launch_prefill_mma(a, stream);
  } else {
    if (dmax == 64) run_prefill<64>(a, stream);
    else if (dmax == 128) run_prefill<128>(a, stream);
    else run_prefill<256>(a, stream);
  }
}

}  // namespace pagellm::cuda
