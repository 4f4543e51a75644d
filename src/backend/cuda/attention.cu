// Paged attention over the KV cache, for decode (one query per sequence) and ragged prefill.
// All softmax math is fp32; K/V are read from the cache in bf16.
//
// Decode (max_seqlen_q == 1): one thread block per (sequence, KV head, KV split), so the G query
// heads of a GQA group share every K/V load. A block scores its chunk of the context exactly (the
// scores fit in shared memory), then writes either the final output (one split) or its
// unnormalized partial sum with the chunk's max and sum of exponentials; a second kernel merges
// the splits (log-sum-exp rescaling). Splitting long contexts keeps all SMs busy at small batch.
// The number of splits is planned on the host from max_seqlen_kv; each sequence then cuts its own
// context into that many chunks of whole warps-worth of keys, read on the device. So a launch
// planned for a bound (a CUDA graph recorded for max_model_len) serves every shorter context, and
// short sequences beside long ones still spread over all splits.
//
// Prefill: the tensor-core kernel of attention_prefill.cu wherever its shape and alignment
// conditions hold (head dims that are multiples of 8, 16-byte aligned rows: every model's layout).
// The kernel here is the fallback for the rest: one block per (tile of 16 queries, sequence, query
// head) walks tiles of 32 keys from the cache (cached prefix included), with causal and
// sliding-window masks and an online softmax (running max and sum, rescaled accumulators), on
// CUDA cores with fp32 dot products from shared memory.
#include <algorithm>

#include "backend/cuda/attention_prefill.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeHeadTile = 8;     // query heads accumulated per pass over V
constexpr int kDecodeKeys = 8;         // keys a warp loads before using any of them
constexpr int kMaxChunk = 1024;        // KV tokens per decode split, at most
constexpr int kMinChunk = 64;          // below this, splitting costs more than it gains
constexpr int kSmemSoftBudget = 64 * 1024;
constexpr int kSmemHardLimit = 227 * 1024;  // sm_90's opt-in maximum per block (sm_80: 163 KiB)

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

struct DecodePlan {
  int chunk = 0, n_splits = 1, group = 1, dmax = 0;
  size_t smem = 0;
};

int dmax_for(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

DecodePlan plan_decode(const AttentionArgs& a, int n_sms) {
  DecodePlan p;
  p.group = a.hq / a.hkv;
  p.dmax = dmax_for(std::max(a.head_dim, a.head_dim_v));
  int64_t max_len = std::max(a.max_seqlen_kv, 1);
  if (a.window > 0) max_len = std::min<int64_t>(max_len, a.window);
  const int64_t q_bytes = static_cast<int64_t>(p.group) * p.dmax * 2;
  const int64_t per_token = static_cast<int64_t>(p.group) * 4;
  const int64_t fixed_bytes =
      q_bytes + static_cast<int64_t>(kDecodeWarps) * std::min(p.group, kDecodeHeadTile) * p.dmax * 4;
  int64_t cap = (kSmemSoftBudget - fixed_bytes) / per_token / 32 * 32;
  cap = std::clamp<int64_t>(cap, 32, kMaxChunk);
  // Enough blocks for two waves over the SMs, but no chunk shorter than kMinChunk.
  const int64_t blocks = static_cast<int64_t>(a.n_seqs) * a.hkv;
  const int64_t want_splits = std::max<int64_t>(1, (2 * n_sms + blocks - 1) / blocks);
  int64_t chunk = (max_len + want_splits - 1) / want_splits;
  chunk = (chunk + 31) / 32 * 32;
  chunk = std::clamp<int64_t>(chunk, std::min<int64_t>(kMinChunk, cap), cap);
  p.chunk = static_cast<int>(chunk);
  p.n_splits = static_cast<int>((max_len + chunk - 1) / chunk);
  const int64_t red_bytes =
      static_cast<int64_t>(kDecodeWarps) * std::min(p.group, kDecodeHeadTile) * p.dmax * 4;
  p.smem = static_cast<size_t>(per_token * chunk + q_bytes + p.group * 8 + red_bytes);
  return p;
}

// Shared memory: scores f32 [G][chunk] | m, l f32 [G][2] | q bf16 [G][DMAX] |
//                PV partial sums f32 [kDecodeWarps][min(G, kDecodeHeadTile)][DMAX].
// Both passes over the context keep many loads in flight, which is what decode attention is bound
// by: QK takes kDecodeKeys keys per warp per iteration (all their K loads issued before any math),
// PV spreads keys over the warps (each lane owns DMAX / 32 contiguous V dims, so a warp reads whole
// rows) and sums the warps' partial results through shared memory at the end.
template <int DMAX>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_kernel(AttentionArgs a, int chunk, int n_splits, float* __restrict__ part_acc,
                  float* __restrict__ part_ml) {
  extern __shared__ float smem[];
  const int split = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q_tok = a.cu_seqlens_q[s];
  if (a.cu_seqlens_q[s + 1] - q_tok <= 0) return;  // no query for this sequence in this step
  const int G = a.hq / a.hkv, D = a.head_dim, Dv = a.head_dim_v;
  const int tile = min(G, kDecodeHeadTile);
  float* scores = smem;
  float* ml = scores + static_cast<size_t>(G) * chunk;
  bf16* qs = reinterpret_cast<bf16*>(ml + 2 * G);
  float* red = reinterpret_cast<float*>(qs + static_cast<size_t>(G) * DMAX);
  const int32_t* table = a.block_tables + s * a.block_table_ld;
  const int32_t pos = a.seq_lens_kv[s] - 1;
  const int32_t lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  // This sequence's chunk: its span over n_splits, rounded up to 32 keys; <= chunk (the plan's
  // bound, which sizes shared memory) because the plan covers the longest span.
  const int32_t span = pos + 1 - lo;
  const int32_t my_chunk = min(chunk, (span + n_splits - 1) / n_splits + 31 & ~31);
  const int32_t begin = lo + split * my_chunk;
  const int32_t n_tok = max(0, min(begin + my_chunk, pos + 1) - begin);
  const int h0 = kvh * G;

  const bf16* q = static_cast<const bf16*>(a.q) + q_tok * a.q_stride_tok;
  for (int idx = tid; idx < G * D; idx += kDecodeThreads) {
    const int g = idx / D, e = idx % D;
    qs[g * DMAX + e] = q[(h0 + g) * a.q_stride_head + e];
  }
  __syncthreads();

  // Scores: a warp per key, kDecodeKeys keys per iteration; lanes hold pairs of K elements,
  // reused for every head of the group.
  constexpr int kPairs = DMAX / 64;
  for (int t0 = warp * kDecodeKeys; t0 < n_tok; t0 += kDecodeWarps * kDecodeKeys) {
    float2 kr[kDecodeKeys][kPairs];
#pragma unroll
    for (int u = 0; u < kDecodeKeys; ++u) {
      const bool valid = t0 + u < n_tok;
      const bf16* krow = valid ? cache_row(a.k_cache, table, begin + t0 + u, a.block_size, kvh) : nullptr;
#pragma unroll
      for (int c = 0; c < kPairs; ++c) {
        const int e = 2 * (lane + 32 * c);
        kr[u][c] = valid && e < D
                       ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(krow + e))
                       : make_float2(0.0f, 0.0f);
      }
    }
    for (int g = 0; g < G; ++g) {
      float2 qv[kPairs];
#pragma unroll
      for (int c = 0; c < kPairs; ++c) {
        const int e = 2 * (lane + 32 * c);
        qv[c] = e < D ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(qs + g * DMAX + e))
                      : make_float2(0.0f, 0.0f);
      }
      float dot[kDecodeKeys];
#pragma unroll
      for (int u = 0; u < kDecodeKeys; ++u) {
        dot[u] = 0.0f;
#pragma unroll
        for (int c = 0; c < kPairs; ++c) dot[u] += qv[c].x * kr[u][c].x + qv[c].y * kr[u][c].y;
      }
#pragma unroll
      for (int u = 0; u < kDecodeKeys; ++u) dot[u] = warp_sum(dot[u]);
      if (lane == 0) {
#pragma unroll
        for (int u = 0; u < kDecodeKeys; ++u)
          if (t0 + u < n_tok) scores[g * chunk + t0 + u] = cap_score(dot[u] * a.scale, a.softcap);
      }
    }
  }
  __syncthreads();

  // Exact softmax over the chunk, per head: scores become exp(s - m), and (m, l) are kept.
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

  // P . V: warp w takes keys w, w + kDecodeWarps, ...; lane owns dims [e0, e0 + kDims).
  constexpr int kDims = DMAX / 32;
  const int e0 = lane * kDims;
  for (int g0 = 0; g0 < G; g0 += tile) {
    const int gn = min(tile, G - g0);
    float acc[kDecodeHeadTile][kDims];
#pragma unroll
    for (int gg = 0; gg < kDecodeHeadTile; ++gg)
#pragma unroll
      for (int d = 0; d < kDims; ++d) acc[gg][d] = 0.0f;
    if (e0 < Dv) {
      for (int t0 = warp; t0 < n_tok; t0 += kDecodeWarps * kDecodeKeys) {
        float2 vr[kDecodeKeys][kDims / 2];
#pragma unroll
        for (int u = 0; u < kDecodeKeys; ++u) {
          const int t = t0 + u * kDecodeWarps;
          const bf16* vrow = t < n_tok ? cache_row(a.v_cache, table, begin + t, a.block_size, kvh) : nullptr;
#pragma unroll
          for (int c = 0; c < kDims / 2; ++c) {
            const int e = e0 + 2 * c;
            vr[u][c] = t < n_tok && e < Dv
                           ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vrow + e))
                           : make_float2(0.0f, 0.0f);
          }
        }
#pragma unroll
        for (int u = 0; u < kDecodeKeys; ++u) {
          const int t = t0 + u * kDecodeWarps;
          if (t >= n_tok) break;
#pragma unroll
          for (int gg = 0; gg < kDecodeHeadTile; ++gg) {
            if (gg < gn) {
              const float p = scores[(g0 + gg) * chunk + t];
#pragma unroll
              for (int c = 0; c < kDims / 2; ++c) {
                acc[gg][2 * c] += p * vr[u][c].x;
                acc[gg][2 * c + 1] += p * vr[u][c].y;
              }
            }
          }
        }
      }
    }
    // Sum the warps' partial results.
#pragma unroll
    for (int gg = 0; gg < kDecodeHeadTile; ++gg) {
      if (gg < gn) {
#pragma unroll
        for (int d = 0; d < kDims; ++d) red[(warp * tile + gg) * DMAX + e0 + d] = acc[gg][d];
      }
    }
    __syncthreads();
    for (int idx = tid; idx < gn * Dv; idx += kDecodeThreads) {
      const int gg = idx / Dv, e = idx % Dv, g = g0 + gg, h = h0 + g;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) v += red[(w * tile + gg) * DMAX + e];
      if (n_splits == 1) {
        // l >= 1 when the query's own key is in the chunk; 0 only for a padding sequence with no
        // context (graph batches), whose output is then 0 rather than NaN.
        const float l = ml[2 * g + 1];
        bf16* o = static_cast<bf16*>(a.out) + q_tok * a.o_stride_tok + h * a.o_stride_head;
        o[e] = from_float<bf16>(l > 0.0f ? v / l : 0.0f);
      } else {
        const int64_t slot = (static_cast<int64_t>(s) * a.hq + h) * n_splits + split;
        part_acc[slot * Dv + e] = v;
        if (e == 0) {
          part_ml[2 * slot] = ml[2 * g];
          part_ml[2 * slot + 1] = ml[2 * g + 1];
        }
      }
    }
    __syncthreads();  // red is reused by the next head tile
  }
}

// Merges the splits of one (sequence, query head): out = sum_i e^(m_i - M) acc_i /
// sum_i e^(m_i - M) l_i, skipping empty splits (l_i == 0: past this sequence's context).
__global__ void decode_reduce_kernel(AttentionArgs a, int n_splits,
                                     const float* __restrict__ part_acc,
                                     const float* __restrict__ part_ml) {
  const int h = blockIdx.x, s = blockIdx.y;
  const int q_tok = a.cu_seqlens_q[s];
  if (a.cu_seqlens_q[s + 1] - q_tok <= 0) return;
  const int64_t base = (static_cast<int64_t>(s) * a.hq + h) * n_splits;
  float m_all = -INFINITY;
  for (int i = 0; i < n_splits; ++i)
    if (part_ml[2 * (base + i) + 1] > 0.0f) m_all = fmaxf(m_all, part_ml[2 * (base + i)]);
  float l_all = 0.0f;
  for (int i = 0; i < n_splits; ++i) {
    const float l = part_ml[2 * (base + i) + 1];
    if (l > 0.0f) l_all += expf(part_ml[2 * (base + i)] - m_all) * l;
  }
  const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;  // 0: a padding sequence, no context
  bf16* o = static_cast<bf16*>(a.out) + q_tok * a.o_stride_tok + h * a.o_stride_head;
  for (int e = threadIdx.x; e < a.head_dim_v; e += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < n_splits; ++i) {
      const float l = part_ml[2 * (base + i) + 1];
      if (l > 0.0f) acc += expf(part_ml[2 * (base + i)] - m_all) * part_acc[(base + i) * a.head_dim_v + e];
    }
    o[e] = from_float<bf16>(acc * inv);
  }
}

template <int DMAX>
__global__ void __launch_bounds__(kPrefillThreads) prefill_kernel(AttentionArgs a) {
  // K rows padded by one bf16 pair so the 32 keys a warp scores sit in distinct banks.
  __shared__ bf16 qs[kBq][DMAX];
  __shared__ bf16 ks[kBk][DMAX + 2];
  __shared__ bf16 vs[kBk][DMAX];
  __shared__ float ss[kBq][kBk + 1];
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

template <int DMAX>
void run_decode(const AttentionArgs& a, const DecodePlan& p, void* workspace, cudaStream_t stream) {
  float* part_acc = static_cast<float*>(workspace);
  float* part_ml = part_acc == nullptr
                       ? nullptr
                       : part_acc + static_cast<int64_t>(a.n_seqs) * a.hq * p.n_splits * a.head_dim_v;
  PAGELLM_CHECK_MSG(p.smem <= static_cast<size_t>(kSmemHardLimit),
                    "attention: GQA group too large for the decode kernel's shared memory");
  if (p.smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<DMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(p.smem)));
  const dim3 grid(p.n_splits, a.hkv, a.n_seqs);
  decode_kernel<DMAX><<<grid, kDecodeThreads, p.smem, stream>>>(a, p.chunk, p.n_splits, part_acc,
                                                                 part_ml);
  CUDA_CHECK_LAUNCH();
  if (p.n_splits > 1) {
    decode_reduce_kernel<<<dim3(a.hq, a.n_seqs), 128, 0, stream>>>(a, p.n_splits, part_acc, part_ml);
    CUDA_CHECK_LAUNCH();
  }
}

template <int DMAX>
void run_prefill(const AttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(ceil_div(a.max_seqlen_q, kBq), a.n_seqs, a.hq);
  prefill_kernel<DMAX><<<grid, kPrefillThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t attention_workspace_bytes(const AttentionArgs& a, int n_sms) {
  if (a.max_seqlen_q != 1 || a.n_seqs == 0) return 0;
  const DecodePlan p = plan_decode(a, n_sms);
  if (p.n_splits == 1) return 0;
  return static_cast<int64_t>(a.n_seqs) * a.hq * p.n_splits * (a.head_dim_v + 2) *
         static_cast<int64_t>(sizeof(float));
}

void launch_attention(const AttentionArgs& a, void* workspace, int n_sms, cudaStream_t stream) {
  if (a.n_seqs == 0 || a.max_seqlen_q == 0) return;
  PAGELLM_CHECK_MSG(a.hkv > 0 && a.hq % a.hkv == 0, "attention: query heads not a multiple of KV heads");
  PAGELLM_CHECK_MSG(std::max(a.head_dim, a.head_dim_v) <= 256, "attention: head_dim above 256");
  PAGELLM_CHECK_MSG(a.n_seqs <= 65535 && a.hq <= 65535, "attention: grid too large");
  const int dmax = dmax_for(std::max(a.head_dim, a.head_dim_v));
  if (a.max_seqlen_q == 1) {
    const DecodePlan p = plan_decode(a, n_sms);
    PAGELLM_CHECK_MSG(p.n_splits == 1 || workspace != nullptr, "attention: missing workspace");
    if (dmax == 64) run_decode<64>(a, p, workspace, stream);
    else if (dmax == 128) run_decode<128>(a, p, workspace, stream);
    else run_decode<256>(a, p, workspace, stream);
  } else if (prefill_mma_supported(a)) {
    launch_prefill_mma(a, stream);
  } else {
    if (dmax == 64) run_prefill<64>(a, stream);
    else if (dmax == 128) run_prefill<128>(a, stream);
    else run_prefill<256>(a, stream);
  }
}

}  // namespace pagellm::cuda
