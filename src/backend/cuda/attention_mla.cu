// Attention over a latent KV cache: DeepSeek-V2/V3 multi-head latent attention (MLA) in the
// absorbed form, and any other head dims above the 256 the kernels of attention.cu and
// attention_prefill.cu cover.
//
// The latent layout: one KV "head" per token, a row of head_dim values (k_pe | c_kv: 64 + 512 =
// 576 for DeepSeek-V2-Lite and V3), of which the columns [v_offset, v_offset + head_dim_v) are
// also V (c_kv, 512 values): the V tensor is a column view of the K rows. Every query head (16 for
// V2-Lite, 128 for V3) reads every row (MQA), so the kernel loads each row once per block and
// uses it for all the block's heads, for the scores and for P.V alike. Separate V rows (head dims
// above 256 without aliasing) are loaded beside the K rows instead.
//
// Work split: one thread block per (query token, KV split, tile of kRows query heads of one KV
// head). Decode is one query token per sequence; a prefill chunk is the same kernel with one
// block per query token (each reads its own causal prefix of the cache, so a prompt of n tokens
// reads the rows n(n+1)/2 times, mostly from L2: correct, not fast; long prompts want the
// expanded form on tensor cores). Splitting the context over blocks (split-KV) keeps the SMs busy
// at batch 1: the host picks the number of splits from the step's bounds (max_seqlen_kv, tokens),
// each block cuts its own token's context into that many chunks of whole key tiles, and a second
// kernel merges the splits (log-sum-exp rescaling; for Backend::attention_project at decode
// sizes, mla_merge_project_kernel also applies each head's matrix, MLA's W_UV, as it merges). A
// launch planned for a bound (a CUDA graph recorded for max_model_len) therefore serves every
// shorter context.
//
// Two kernels with that work split and the same outputs: the DeepSeek shapes (latent rows, dims
// in whole mma steps, see mla_mma_ok) run on tensor cores (mla_mma_kernel), every other shape
// on CUDA cores (mla_attention_kernel). The tensor-core kernel is compute-light enough to stream
// the cache at memory speed; the CUDA-core one is bound by its fp32 FMAs (~30 per cache byte at
// 16 heads). Both are launched overlapped (device_utils.cuh), as is the merge.
//
// Per key tile (kTile keys), the CUDA-core kernel with fp32 arithmetic:
//   rows     cp.async from the paged cache into shared memory, two stages (the next tile loads
//            while this one is used); block-table lookup once per row
//   S = Q K  each warp computes 4 (head x key) micro-tiles of 4 x 4 over 8 slices of the head
//            dim, reduced across the slices with shuffles; q is held in shared memory in fp32,
//            pre-multiplied by the softmax scale
//   softmax  online, per head: running max and sum; the accumulators are rescaled when the max
//            grows; masked keys (past the chunk) score -inf
//   O += P V each thread owns 4 heads x 2*J dims (pairs 64 apart), V read from the same rows
// Shared memory K rows are padded to a word stride of 2 mod 8, so the 4 key rows a warp reads
// per step (8 words each) fall in distinct banks. The tensor-core kernel is described above it.
#include <algorithm>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 16;        // query heads per block (4 micro-tile row groups of 4)
constexpr int kTile = 32;        // keys per tile (8 micro-tile key groups of 4)
constexpr int kSlices = 8;       // head-dim slices of the score products (lanes 0-7 of a group)
constexpr int kStages = 2;       // key tiles in flight
constexpr int kMaxSplits = 256;  // of one token's context
constexpr int kMaxDimV = 1024;   // head_dim_v: pairs 64 apart, 8 per thread
constexpr int kReduceThreads = 128;
constexpr int kSmemHardLimit = 227 * 1024;  // sm_90's opt-in maximum per block (sm_80: 163 KiB)

static_assert(kWarps * 4 * kSlices == kThreads && kRows * kTile == 4 * 4 * kWarps * 4,
              "score micro-tiles: 4 per warp, 4 x 4 (head x key) each, kSlices lanes per tile");
static_assert(kRows == 2 * kWarps && kTile == 32, "softmax: a warp per 2 heads, a lane per key");
static_assert(kThreads == 4 * 64 && kRows == 16, "P.V: 4 groups of 4 heads x 64 dim lanes");

// The shapes of one launch, in 32-bit words (bf16 pairs) where they index shared memory.
struct MlaLayout {
  int d = 0, dv = 0;   // K and V head dims (even)
  int v_offset = -1;   // V's first column inside the K row; -1: separate V rows
  int k_words = 0;     // shared-memory K row stride: >= d / 2, = 2 (mod 8)
  int v_words = 0;     // shared-memory V row stride (separate V rows only)
  int head_tiles = 1;  // ceil(G / kRows)
  int n_splits = 1;
  bool mma = false;  // mla_mma_kernel (else mla_attention_kernel)
  size_t smem = 0;
};

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
// Copies 4 bytes global -> shared asynchronously (sm_80+; the 16-byte form is in mma.cuh).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ float cap_score(float s, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

// Shared memory, in 4-byte units: q f32 [kRows][d] | K rows [kStages][kTile][k_words] |
// V rows [kStages][kTile][v_words] (separate V only) | scores, then probabilities,
// f32 [kRows][kTile + 1] | rescale factors f32 [kRows] | final (max, sum) f32 [kRows][2].
size_t smem_bytes(const MlaLayout& L) {
  const size_t words = static_cast<size_t>(kRows) * L.d +
                       static_cast<size_t>(kStages) * kTile * L.k_words +
                       (L.v_offset < 0 ? static_cast<size_t>(kStages) * kTile * L.v_words : 0) +
                       static_cast<size_t>(kRows) * (kTile + 1) + kRows + 2 * kRows;
  return words * 4;
}

// The keys one block reads: its query token's sequence and that token's causal (or windowed)
// context cut in n_splits chunks of whole tiles, this split's chunk. Trailing splits of a short
// context are empty (n_keys == 0; they still write l = 0, which the merge skips), so the live
// splits of a token are always a prefix.
struct MlaWork {
  int s = 0;           // sequence
  int32_t begin = 0;   // first key position of the split
  int32_t n_keys = 0;  // keys of the split
  int32_t first_new = 0;  // the sequence's first position whose row this step writes
};
__device__ __forceinline__ MlaWork mla_work(const AttentionArgs& a, int n_splits, int tok,
                                            int split) {
  // The token's sequence: the last s with cu[s] <= tok (sequences without queries have
  // cu[s] == cu[s + 1] and are skipped over).
  const int* cu = a.cu_seqlens_q;
  int s_lo = 0, s_hi = a.n_seqs;
  while (s_hi - s_lo > 1) {
    const int mid = (s_lo + s_hi) >> 1;
    if (cu[mid] <= tok)
      s_lo = mid;
    else
      s_hi = mid;
  }
  MlaWork w;
  w.s = s_lo;
  const int n_q = cu[w.s + 1] - cu[w.s];
  w.first_new = a.seq_lens_kv[w.s] - n_q;
  const int32_t pos = w.first_new + (tok - cu[w.s]);
  const int32_t lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int32_t span = max(0, pos + 1 - lo);
  const int32_t per_split = ((span + n_splits - 1) / n_splits + kTile - 1) / kTile * kTile;
  w.begin = lo + split * per_split;
  w.n_keys = max(0, min(w.begin + per_split, pos + 1) - w.begin);
  return w;
}

// J: V pairs per thread per head (pairs dl, dl + 64, ..., dl + 64 (J - 1)); J * 128 >= dv.
template <int J>
__global__ void __launch_bounds__(kThreads, 2)
    mla_attention_kernel(AttentionArgs a, MlaLayout L, float* __restrict__ part_acc,
                         float* __restrict__ part_ml) {
  extern __shared__ float4 smem_raw[];
  pdl_wait();        // launched overlapped: q and the cache rows come from the kernels before
  pdl_allow_next();  // the merge (and W_UV's weights) may start loading
  float* smem = reinterpret_cast<float*>(smem_raw);
  const int tok = blockIdx.x, split = blockIdx.y;
  const int kvh = blockIdx.z / L.head_tiles, ht = blockIdx.z % L.head_tiles;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tok >= a.cu_seqlens_q[a.n_seqs]) return;  // the whole block: before any barrier
  const MlaWork work = mla_work(a, L.n_splits, tok, split);
  const int s = work.s;
  const int32_t begin = work.begin, n_keys = work.n_keys;
  const int n_kt = (n_keys + kTile - 1) / kTile;

  const int G = a.hq / a.hkv;
  const int h0 = kvh * G + ht * kRows;            // first query head of the block
  const int n_rows = min(kRows, G - ht * kRows);  // heads past G are padding rows
  const int dp = L.d >> 1, dvp = L.dv >> 1;       // pairs per row

  float* qs = smem;
  uint32_t* ks = reinterpret_cast<uint32_t*>(qs + kRows * L.d);
  uint32_t* vs = ks + kStages * kTile * L.k_words;
  float* ps = reinterpret_cast<float*>(vs + (L.v_offset < 0 ? kStages * kTile * L.v_words : 0));
  float* corr = ps + kRows * (kTile + 1);
  float* mls = corr + kRows;

  const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.block_table_ld;
  const bf16* kc = static_cast<const bf16*>(a.k_cache.data) + kvh * a.k_cache.stride_head;
  const bf16* vc = static_cast<const bf16*>(a.v_cache.data) + kvh * a.v_cache.stride_head;
  const int bs = a.block_size;

  // Warp w copies rows w, w + kWarps, ... of tile kt; rows past the chunk are left as they are
  // (their scores are masked and P.V stops before them).
  const auto load_tile = [&](int kt, int stage) {
    uint32_t* kdst = ks + stage * kTile * L.k_words;
    uint32_t* vdst = vs + stage * kTile * L.v_words;
    for (int r = warp; r < kTile; r += kWarps) {
      const int t = kt * kTile + r;
      if (t >= n_keys) break;
      const int32_t p = begin + t;
      const int64_t blk = table[p / bs];
      const int64_t off = p % bs;
      const bf16* krow = kc + blk * a.k_cache.stride_block + off * a.k_cache.stride_tok;
      for (int w = lane; w < dp; w += 32)
        cp_async_4(smem_u32(kdst + r * L.k_words + w), krow + 2 * w);
      if (L.v_offset < 0) {
        const bf16* vrow = vc + blk * a.v_cache.stride_block + off * a.v_cache.stride_tok;
        for (int w = lane; w < dvp; w += 32)
          cp_async_4(smem_u32(vdst + r * L.v_words + w), vrow + 2 * w);
      }
    }
  };
  if (n_kt > 0) load_tile(0, 0);
  cp_async_commit();

  // q rows of the block's heads, scaled, in fp32; padding rows are zero. An empty split (past a
  // short context, e.g. in a graph recorded for max_model_len) needs none.
  const bf16* qg = static_cast<const bf16*>(a.q) + static_cast<int64_t>(tok) * a.q_stride_tok;
  for (int idx = tid; idx < (n_kt > 0 ? kRows * dp : 0); idx += kThreads) {
    const int r = idx / dp, c = idx - r * dp;
    float2 v = make_float2(0.0f, 0.0f);
    if (r < n_rows) {
      v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
          qg + static_cast<int64_t>(h0 + r) * a.q_stride_head + 2 * c));
      v.x *= a.scale;
      v.y *= a.scale;
    }
    reinterpret_cast<float2*>(qs + r * L.d)[c] = v;
  }

  // Score micro-tile of this thread: heads 4 rg .. 4 rg + 3, keys 4 kg .. 4 kg + 3, head-dim
  // pairs ds, ds + 8, ...
  const int ds = lane & (kSlices - 1), mt = warp * 4 + (lane >> 3);
  const int rg = mt >> 3, kg = mt & 7;
  // P.V: heads 4 hg .. 4 hg + 3, V pairs dl + 64 j.
  const int hg = tid >> 6, dl = tid & 63;
  float2 acc[4][J];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int j = 0; j < J; ++j) acc[r][j] = make_float2(0.0f, 0.0f);
  // Running max and sum of this warp's two softmax rows (identical in every lane).
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float2* q2 = reinterpret_cast<const float2*>(qs);

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) load_tile(kt + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // tile kt has landed (for this thread's copies) ...
    __syncthreads();     // ... and for everyone's; q too, on the first tile
    const int t0 = kt * kTile;
    const uint32_t* kt_s = ks + stage * kTile * L.k_words;

    // S = (scale q) . k for 16 heads x 32 keys.
    float sacc[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int u = 0; u < 4; ++u) sacc[r][u] = 0.0f;
    for (int pi = ds; pi < dp; pi += kSlices) {
      float2 qv[4], kv[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) qv[r] = q2[(rg * 4 + r) * dp + pi];
#pragma unroll
      for (int u = 0; u < 4; ++u) kv[u] = unpack_bf16x2(kt_s[(kg * 4 + u) * L.k_words + pi]);
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int u = 0; u < 4; ++u)
          sacc[r][u] = fmaf(qv[r].x, kv[u].x, fmaf(qv[r].y, kv[u].y, sacc[r][u]));
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int o = 1; o < kSlices; o <<= 1)
          sacc[r][u] += __shfl_xor_sync(0xffffffffu, sacc[r][u], o);
    if (ds == 0) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int t = kg * 4 + u;
          ps[(rg * 4 + r) * (kTile + 1) + t] =
              t0 + t < n_keys ? cap_score(sacc[r][u], a.softcap) : -INFINITY;
        }
    }
    __syncthreads();

    // Online softmax: warp w owns heads 2w and 2w + 1, lane = key.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp * 2 + i;
      float* prow = ps + r * (kTile + 1);
      const float sv = prow[lane];
      const float m_new = fmaxf(m_run[i], warp_max(sv));
      float p = 0.0f, c = 1.0f;
      if (m_new != -INFINITY) {  // a tile always holds a key of the chunk; kept for safety
        p = sv == -INFINITY ? 0.0f : expf(sv - m_new);
        c = expf(m_run[i] - m_new);  // 0 on the first tile (m_run == -inf)
      }
      l_run[i] = l_run[i] * c + warp_sum(p);
      m_run[i] = m_new;
      prow[lane] = p;
      if (lane == 0) corr[r] = c;
    }
    __syncthreads();

    // O = O * c + P . V over the tile's keys.
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float c = corr[hg * 4 + r];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        acc[r][j].x *= c;
        acc[r][j].y *= c;
      }
    }
    const uint32_t* vt = L.v_offset < 0 ? vs + stage * kTile * L.v_words : kt_s + (L.v_offset >> 1);
    const int v_stride = L.v_offset < 0 ? L.v_words : L.k_words;
    const int tile_keys = min(kTile, n_keys - t0);
    for (int t = 0; t < tile_keys; ++t) {
      float p[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) p[r] = ps[(hg * 4 + r) * (kTile + 1) + t];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int pidx = dl + 64 * j;
        if (pidx < dvp) {
          const float2 v = unpack_bf16x2(vt[t * v_stride + pidx]);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            acc[r][j].x = fmaf(p[r], v.x, acc[r][j].x);
            acc[r][j].y = fmaf(p[r], v.y, acc[r][j].y);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before it is refilled
  }
  cp_async_wait<0>();  // no copy may land after the block exits (none is pending here)

  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mls[2 * (warp * 2 + i)] = m_run[i];
      mls[2 * (warp * 2 + i) + 1] = l_run[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = hg * 4 + r;
    if (row >= n_rows) continue;
    const int h = h0 + row;
    const float m = mls[2 * row], l = mls[2 * row + 1];
    if (L.n_splits == 1) {
      // l >= 1 when the token's own key is in its context; 0 only for a padding token with no
      // context (graph batches), whose output is then 0 rather than NaN.
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      bf16* o = static_cast<bf16*>(a.out) + static_cast<int64_t>(tok) * a.o_stride_tok +
                static_cast<int64_t>(h) * a.o_stride_head;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int pidx = dl + 64 * j;
        if (pidx < dvp)
          reinterpret_cast<__nv_bfloat162*>(o)[pidx] =
              __floats2bfloat162_rn(acc[r][j].x * inv, acc[r][j].y * inv);
      }
    } else {
      // An empty split writes only l = 0: the merge skips its (unwritten) sums.
      const int64_t slot = (static_cast<int64_t>(tok) * a.hq + h) * L.n_splits + split;
      float2* pa = reinterpret_cast<float2*>(part_acc + slot * L.dv);
      if (l > 0.0f) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int pidx = dl + 64 * j;
          if (pidx < dvp) pa[pidx] = acc[r][j];
        }
      }
      if (dl == 0) {
        part_ml[2 * slot] = m;
        part_ml[2 * slot + 1] = l;
      }
    }
  }
}

// The tensor-core form of the kernel above for the DeepSeek shapes (mla_mma_ok): the same blocks,
// splits and outputs, with both products on mma.sync m16n8k16 (bf16 operands, fp32 accumulators).
// The block's 16 heads are exactly the M of one mma, so
//   S = Q K^T  warp w computes keys 8 (w % 4) .. + 7 of the tile over half of the head dim
//              (w / 4); Q and K by ldmatrix from shared memory, the two halves summed in shared
//              memory by the softmax
//   softmax    as above (warp w: heads 2w, 2w + 1; lane = key), P written as two bf16 terms,
//              hi = bf16(p) and lo = bf16(p - hi), so P.V carries p to 2^-17 relative (two mmas
//              per product instead of one, cheap beside the row loads) rather than bf16's 2^-9
//   O += P V   warp w owns dv / 8 output dims (NT n8 tiles) of all 16 heads; V by ldmatrix.trans
//              from the K rows it is a column view of
// Key rows past the split are zero-filled (their P is 0, and 0 x garbage could be NaN).
// Shared rows (Q, K) are d + 8 elements: an odd number of 16-byte chunks, so the 8 rows an
// ldmatrix phase reads fall in distinct banks.
constexpr int kMmaRowPad = 8;            // bf16 elements after each shared Q / K row
constexpr int kScoreStride = kTile + 8;  // f32 per shared score row
constexpr int kPStride = kTile + 8;      // bf16 per shared P row (5 chunks)

size_t mma_smem_bytes(int d) {
  const size_t rs = static_cast<size_t>(d) + kMmaRowPad;
  return (kRows + static_cast<size_t>(kStages) * kTile) * rs * 2 +  // Q, K tiles (bf16)
         2 * kRows * kScoreStride * 4 +                             // score halves (f32)
         2 * kRows * kPStride * 2 +                                 // P hi, lo (bf16)
         3 * kRows * 4;                                             // rescale, (max, sum)
}

// NT: n8 tiles of output dims per warp (dv = 64 NT; even, ldmatrix.trans loads two at a time).
template <int NT>
__global__ void __launch_bounds__(kThreads, 2)
    mla_mma_kernel(AttentionArgs a, MlaLayout L, float* __restrict__ part_acc,
                   float* __restrict__ part_ml) {
  static_assert(kRows == 16 && kWarps == 8 && kTile == 32, "warp roles below");
  static_assert(NT % 2 == 0, "V fragments come two n8 tiles at a time");
  extern __shared__ float4 smem_raw[];
  const int tok = blockIdx.x, split = blockIdx.y;
  const int kvh = blockIdx.z / L.head_tiles, ht = blockIdx.z % L.head_tiles;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The step's metadata (uploaded before the step; no kernel of it writes them) is read before
  // the wait, and so are the first tile's rows of earlier steps (below),
  // so the chain after the wait starts with q and this step's own rows.
  const bool live = tok < a.cu_seqlens_q[a.n_seqs];  // uniform over the block
  const MlaWork work = live ? mla_work(a, L.n_splits, tok, split) : MlaWork{};
  const int n_kt = (work.n_keys + kTile - 1) / kTile;
  const int G = a.hq / a.hkv;
  const int h0 = kvh * G + ht * kRows;            // first query head of the block
  const int n_rows = min(kRows, G - ht * kRows);  // heads past G are zero rows
  const int rs = L.d + kMmaRowPad;                // bf16 per shared Q / K row
  const int cpr = L.d / 8;                        // 16-byte chunks per row

  bf16* qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* ks = qs + kRows * rs;
  float* sp = reinterpret_cast<float*>(ks + kStages * kTile * rs);  // [2][kRows][kScoreStride]
  bf16* p_hi = reinterpret_cast<bf16*>(sp + 2 * kRows * kScoreStride);
  bf16* p_lo = p_hi + kRows * kPStride;
  float* corr = reinterpret_cast<float*>(p_lo + kRows * kPStride);
  float* mls = corr + kRows;

  const int32_t* table = a.block_tables + static_cast<int64_t>(work.s) * a.block_table_ld;
  const bf16* kc = static_cast<const bf16*>(a.k_cache.data) + kvh * a.k_cache.stride_head;
  const int bs = a.block_size;
  // Warp w copies rows w, w + kWarps, ... of tile kt; rows past the split are zeros. `rows`:
  // kAllRows, or the rows of earlier steps (kOldRows: no kernel of this step writes them, so they
  // may be requested before the wait) or the others (kNewRows: past the split, or this step's).
  enum Rows { kAllRows, kOldRows, kNewRows };
  const auto load_tile = [&](int kt, int stage, Rows rows) {
    bf16* dst = ks + stage * kTile * rs;
    for (int r = warp; r < kTile; r += kWarps) {
      const int t = kt * kTile + r;
      const bool valid = t < work.n_keys;
      const int32_t p = work.begin + t;
      const bool old = valid && p < work.first_new;
      if ((rows == kOldRows && !old) || (rows == kNewRows && old)) continue;
      const bf16* row = kc;  // not read when !valid
      if (valid)
        row = kc + table[p / bs] * a.k_cache.stride_block + (p % bs) * a.k_cache.stride_tok;
      for (int c = lane; c < cpr; c += 32)
        cp_async_16(smem_u32(dst + r * rs + c * 8), row + c * 8, valid);
    }
  };
  if (n_kt > 0) load_tile(0, 0, kOldRows);
  pdl_wait();         // launched overlapped: q and this step's rows come from the kernels before
  pdl_allow_next();   // the merge (and W_UV's weights) may start loading
  if (!live) return;  // the whole block: before any barrier
  // q rows of the block's heads (padding rows zero) with the first tile; an empty split (past a
  // short context, e.g. in a graph recorded for max_model_len) loads nothing.
  if (n_kt > 0) {
    const bf16* qg = static_cast<const bf16*>(a.q) + static_cast<int64_t>(tok) * a.q_stride_tok;
    for (int idx = tid; idx < kRows * cpr; idx += kThreads) {
      const int r = idx / cpr, c = idx - r * cpr;
      const bool valid = r < n_rows;
      const bf16* src = valid ? qg + static_cast<int64_t>(h0 + r) * a.q_stride_head + c * 8 : qg;
      cp_async_16(smem_u32(qs + r * rs + c * 8), src, valid);
    }
    load_tile(0, 0, kNewRows);
  }
  cp_async_commit();

  const int g = lane >> 2, q4 = lane & 3;  // fragment row (and row + 8), column pair
  const int key8 = (warp & 3) * 8;         // S: this warp's 8 keys of the tile ...
  const int ks_half = L.d / 32;            // ... and k-steps of 16 over its half of the dim
  const int ks0 = (warp >> 2) * ks_half;
  const int dim0 = warp * NT * 8;  // P.V: this warp's output dims
  const uint32_t q_addr = smem_u32(qs + (lane & 15) * rs + (lane >> 4) * 8);
  const uint32_t p_hi_addr = smem_u32(p_hi + (lane & 15) * kPStride + (lane >> 4) * 8);
  const uint32_t p_lo_addr = smem_u32(p_lo + (lane & 15) * kPStride + (lane >> 4) * 8);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  // Running max and sum of this warp's two softmax rows (identical in every lane).
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) load_tile(kt + 1, stage ^ 1, kAllRows);
    cp_async_commit();
    cp_async_wait<1>();  // tile kt (and q) has landed for this thread's copies ...
    __syncthreads();     // ... and for everyone's
    const bf16* kt_s = ks + stage * kTile * rs;

    // S: lanes 0-7 / 8-15 / 16-23 / 24-31 address the warp's 8 key rows at chunks 0 / 1 / 2 / 3
    // past 2 ks: the B fragments of k-steps ks and ks + 1 in one ldmatrix.
    const uint32_t k_addr = smem_u32(kt_s + (key8 + (lane & 7)) * rs + (lane >> 3) * 8);
    float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int ks_i = ks0; ks_i < ks0 + ks_half; ks_i += 2) {
      uint32_t qa[4], qb[4], kb[4];
      ldmatrix_x4(qa, q_addr + ks_i * 32);
      ldmatrix_x4(qb, q_addr + (ks_i + 1) * 32);
      ldmatrix_x4(kb, k_addr + ks_i * 32);
      mma_bf16(s0, qa, kb[0], kb[1]);
      mma_bf16(s1, qb, kb[2], kb[3]);
    }
    float* sh = sp + (warp >> 2) * kRows * kScoreStride + key8 + 2 * q4;
    *reinterpret_cast<float2*>(sh + g * kScoreStride) = make_float2(s0[0] + s1[0], s0[1] + s1[1]);
    *reinterpret_cast<float2*>(sh + (g + 8) * kScoreStride) =
        make_float2(s0[2] + s1[2], s0[3] + s1[3]);
    __syncthreads();

    // Online softmax: warp w owns heads 2w and 2w + 1, lane = key.
    const int t0 = kt * kTile;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp * 2 + i;
      const float raw =
          (sp[r * kScoreStride + lane] + sp[(kRows + r) * kScoreStride + lane]) * a.scale;
      const float sv = t0 + lane < work.n_keys ? cap_score(raw, a.softcap) : -INFINITY;
      const float m_new = fmaxf(m_run[i], warp_max(sv));
      float p = 0.0f, c = 1.0f;
      if (m_new != -INFINITY) {  // a tile always holds a key of the split; kept for safety
        p = sv == -INFINITY ? 0.0f : expf(sv - m_new);
        c = expf(m_run[i] - m_new);  // 0 on the first tile (m_run == -inf)
      }
      l_run[i] = l_run[i] * c + warp_sum(p);
      m_run[i] = m_new;
      const bf16 hi = __float2bfloat16_rn(p);
      p_hi[r * kPStride + lane] = hi;
      p_lo[r * kPStride + lane] = __float2bfloat16_rn(p - __bfloat162float(hi));
      if (lane == 0) corr[r] = c;
    }
    __syncthreads();

    // O = O * c + (P_hi + P_lo) V. ldmatrix.trans: lanes 0-7 / 8-15 address keys 0-7 / 8-15 of
    // the k-step at the first 8 dims, lanes 16-31 the same keys at the next 8: the B fragments
    // of two n8 tiles.
    const float c_top = corr[g], c_bot = corr[g + 8];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      acc[j][0] *= c_top;
      acc[j][1] *= c_top;
      acc[j][2] *= c_bot;
      acc[j][3] *= c_bot;
    }
    const uint32_t v_addr =
        smem_u32(kt_s + ((lane & 7) + (lane & 8)) * rs + L.v_offset + dim0 + (lane >> 4) * 8);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t ph[4], pl[4];
      ldmatrix_x4(ph, p_hi_addr + kk * 32);
      ldmatrix_x4(pl, p_lo_addr + kk * 32);
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_addr + (kk * 16 * rs + j * 8) * 2);
        mma_bf16(acc[j], ph, vb[0], vb[1]);
        mma_bf16(acc[j], pl, vb[0], vb[1]);
        mma_bf16(acc[j + 1], ph, vb[2], vb[3]);
        mma_bf16(acc[j + 1], pl, vb[2], vb[3]);
      }
    }
    __syncthreads();  // everyone is done with this stage (and the scores, P) before reuse
  }
  cp_async_wait<0>();  // no copy may land after the block exits (none is pending here)

  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mls[2 * (warp * 2 + i)] = m_run[i];
      mls[2 * (warp * 2 + i) + 1] = l_run[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // fragment rows g and g + 8
    const int row = g + 8 * half;
    if (row >= n_rows) continue;
    const int h = h0 + row;
    const float m = mls[2 * row], l = mls[2 * row + 1];
    if (L.n_splits == 1) {
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // 0: a padding token without context
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(
          static_cast<bf16*>(a.out) + static_cast<int64_t>(tok) * a.o_stride_tok +
          static_cast<int64_t>(h) * a.o_stride_head + dim0 + 2 * q4);
#pragma unroll
      for (int j = 0; j < NT; ++j)
        o[4 * j] = __floats2bfloat162_rn(acc[j][2 * half] * inv, acc[j][2 * half + 1] * inv);
    } else {
      // An empty split writes only l = 0: the merge skips its (unwritten) sums.
      const int64_t slot = (static_cast<int64_t>(tok) * a.hq + h) * L.n_splits + split;
      if (l > 0.0f) {
        float2* pa = reinterpret_cast<float2*>(part_acc + slot * L.dv + dim0 + 2 * q4);
#pragma unroll
        for (int j = 0; j < NT; ++j)
          pa[4 * j] = make_float2(acc[j][2 * half], acc[j][2 * half + 1]);
      }
      if (warp == 0 && q4 == 0) {
        part_ml[2 * slot] = m;
        part_ml[2 * slot + 1] = l;
      }
    }
  }
}

// The merge of one (token, query head)'s splits, shared by both merge kernels so that they give
// the same bits: out = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i over the live splits (a
// prefix: l_i > 0), so a launch planned for a long bound (a graph recorded for max_model_len)
// reads only the splits that hold keys.
struct SplitWeights {
  float weight[kMaxSplits];
  float inv_sum;  // 0: a padding token, no context
  int n_live;
};
// Warp 0's part: each live split's weight e^(m_i - M) and 1 / sum_i e^(m_i - M) l_i.
__device__ __forceinline__ void split_weights(const float* __restrict__ part_ml, int64_t base,
                                              int n_splits, SplitWeights& w) {
  const int lane = threadIdx.x & 31;
  float m = -INFINITY;
  unsigned live = 0;
  for (int i = lane; i < n_splits; i += 32) {
    if (part_ml[2 * (base + i) + 1] > 0.0f) {
      m = fmaxf(m, part_ml[2 * (base + i)]);
      live = i + 1;
    }
  }
  m = warp_max(m);
  live = __reduce_max_sync(0xffffffffu, live);
  float l = 0.0f;
  for (int i = lane; i < static_cast<int>(live); i += 32) {
    const float li = part_ml[2 * (base + i) + 1];
    const float wi = li > 0.0f ? expf(part_ml[2 * (base + i)] - m) : 0.0f;
    w.weight[i] = wi;
    l += wi * li;
  }
  l = warp_sum(l);
  if (lane == 0) {
    w.inv_sum = l > 0.0f ? 1.0f / l : 0.0f;
    w.n_live = static_cast<int>(live);
  }
}

// The whole merge, called by every thread of the block (it holds a barrier): this thread's dims
// e0 + j * step (j < E; those at or past dv are neither read nor written), rounded to bf16. The
// partial sums are read kMergeBatch splits at a time, all loads of a batch issued before any is
// summed, the first batch while warp 0 works out the weights (a batch may read splits past the
// live ones, stale values that are never summed); the sums run in split order whatever E is.
constexpr int kMergeBatch = 16;
template <int E>
__device__ __forceinline__ void merge_splits(const float* __restrict__ part_acc,
                                             const float* __restrict__ part_ml, int64_t base,
                                             int n_splits, int dv, int e0, int step,
                                             SplitWeights& w, bf16 (&out)[E]) {
  float v[kMergeBatch][E];
  const auto load_batch = [&](int i0, int bound) {
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b)
#pragma unroll
      for (int j = 0; j < E; ++j) {
        const int e = e0 + j * step;
        v[b][j] = i0 + b < bound && e < dv ? part_acc[(base + i0 + b) * dv + e] : 0.0f;
      }
  };
  load_batch(0, n_splits);
  if (threadIdx.x < 32) split_weights(part_ml, base, n_splits, w);
  __syncthreads();
  const int live = w.n_live;
  float acc[E];
#pragma unroll
  for (int j = 0; j < E; ++j) acc[j] = 0.0f;
  for (int i0 = 0; i0 < live; i0 += kMergeBatch) {
    if (i0 > 0) load_batch(i0, live);
#pragma unroll
    for (int b = 0; b < kMergeBatch; ++b)
#pragma unroll
      for (int j = 0; j < E; ++j)
        if (i0 + b < live) acc[j] += w.weight[i0 + b] * v[b][j];
  }
#pragma unroll
  for (int j = 0; j < E; ++j) out[j] = from_float<bf16>(acc[j] * w.inv_sum);
}

// Merges the splits of one (token, query head) for kReduceThreads dims.
__global__ void __launch_bounds__(kReduceThreads)
    mla_reduce_kernel(AttentionArgs a, int n_splits, const float* __restrict__ part_acc,
                      const float* __restrict__ part_ml) {
  __shared__ SplitWeights sw;
  pdl_wait();  // launched overlapped: the partial results come from the kernel before
  pdl_allow_next();
  const int e = blockIdx.x * kReduceThreads + threadIdx.x;
  const int h = blockIdx.y, tok = blockIdx.z;
  if (tok >= a.cu_seqlens_q[a.n_seqs]) return;
  const int64_t base = (static_cast<int64_t>(tok) * a.hq + h) * n_splits;
  bf16 v[1];
  merge_splits(part_acc, part_ml, base, n_splits, a.head_dim_v, e, 0, sw, v);
  if (e >= a.head_dim_v) return;
  bf16* o = static_cast<bf16*>(a.out) + static_cast<int64_t>(tok) * a.o_stride_tok +
            static_cast<int64_t>(h) * a.o_stride_head;
  o[e] = v[0];
}

// The merge with each head's projection after it (Backend::attention_project: MLA's value
// up-projection W_UV), one kernel instead of the merge and a batched GEMV: a block merges one
// (token, head)'s head_dim_v dims into shared memory, rounded to bf16 as the merge kernel writes
// them, and multiplies them by 8 * RPW rows of that head's matrix, which it requests before its
// wait (weights: no kernel writes them) so they stream in while the attention runs. Each block
// repeats its head's merge (from L2: the partial sums were just written) for its slice of rows;
// a warp takes RPW rows, a lane 8 dims of each 256.
constexpr int kProjThreads = 256;
constexpr int kProjWarps = kProjThreads / 32;

// CHUNKS: a lane's 16-byte pieces of a row (head_dim_v = 256 * CHUNKS); RPW: rows per warp.
template <int CHUNKS, int RPW>
__global__ void __launch_bounds__(kProjThreads)
    mla_merge_project_kernel(AttentionArgs a, int n_splits, const float* __restrict__ part_acc,
                             const float* __restrict__ part_ml, MlaProjection p) {
  constexpr int kDv = 256 * CHUNKS;
  __shared__ SplitWeights sw;
  __shared__ __align__(16) bf16 lat[kDv];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y, tok = blockIdx.z;
  const int row0 = (blockIdx.x * kProjWarps + warp) * RPW;
  const bf16* w_head = static_cast<const bf16*>(p.w) + static_cast<int64_t>(h) * p.w_stride_head;
  const bf16* rows[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r)  // rows past m read row 0 (valid) and are not stored
    rows[r] = w_head + static_cast<int64_t>(row0 + r < p.m ? row0 + r : 0) * p.w_stride_row;
  uint4 wv[CHUNKS][RPW];
  load_trip(wv, rows, 8 * lane, 256, kDv);
  // The step's metadata (uploaded before the step) is read before the wait too.
  const bool live = tok < a.cu_seqlens_q[a.n_seqs];  // uniform over the block
  pdl_wait();  // launched overlapped: the partial results come from the kernel before
  pdl_allow_next();
  if (!live) return;  // the whole block: before any barrier
  const int64_t base = (static_cast<int64_t>(tok) * a.hq + h) * n_splits;
  constexpr int kPerThread = kDv / kProjThreads;
  bf16 v[kPerThread];
  merge_splits(part_acc, part_ml, base, n_splits, kDv, threadIdx.x, kProjThreads, sw, v);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) lat[threadIdx.x + j * kProjThreads] = v[j];
  __syncthreads();
  float acc[RPW] = {};
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const uint4 x = reinterpret_cast<const uint4*>(lat)[lane + 32 * c];
#pragma unroll
    for (int r = 0; r < RPW; ++r) acc[r] += dot8(x, wv[c][r]);
  }
  bf16* o = static_cast<bf16*>(p.out) + static_cast<int64_t>(tok) * p.o_stride_tok +
            static_cast<int64_t>(h) * p.o_stride_head;
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < p.m) o[row0 + r] = from_float<bf16>(v);
  }
}

// Whether mla_mma_kernel takes the launch: V a column view of the K rows (the latent layout) at
// a 16-byte column, dims in whole mma steps (d a multiple of 64: two halves of even k-step
// counts; dv of 128: pairs of n8 tiles over 8 warps, at most 512), every row 16-byte aligned.
bool mla_mma_ok(const AttentionArgs& a, int v_offset) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const CacheView& k = a.k_cache;
  return v_offset >= 0 && v_offset % 8 == 0 && a.head_dim % 64 == 0 && a.head_dim_v % 128 == 0 &&
         a.head_dim_v <= 512 && aligned16(k.data) && k.stride_block % 8 == 0 &&
         k.stride_tok % 8 == 0 && k.stride_head % 8 == 0 && aligned16(a.q) &&
         a.q_stride_tok % 8 == 0 && a.q_stride_head % 8 == 0 &&
         mma_smem_bytes(a.head_dim) <= static_cast<size_t>(kSmemHardLimit);
}

// The most query tokens of a step whose split merge takes Backend::attention_project's product:
// every block of a token re-reads its head's rows of the matrix, so wide steps keep the batched
// GEMM. On the H200, V2-Lite decoded 511.4/510.2 tok/s with the fused merge at one token against
// 496.1/496.9 without, and 8 sequences took 6.454 ms a token against 6.542 (docs/perf-history,
// twenty-fourth round).
constexpr int64_t kProjectMaxTokens = 8;
// The rows of the projection each warp of the fused merge takes (8 warps a block): fewer blocks
// repeat the merge, more start the rows' loads sooner. 4 decoded V2-Lite at 511.4/510.2 tok/s,
// 2 at 506.0/502.7, 8 at 508.2/508.0 (same round).
constexpr int kProjectRowsPerWarp = 4;

MlaLayout plan_mla(const AttentionArgs& a, int64_t n_tokens, int n_sms) {
  MlaLayout L;
  L.d = a.head_dim;
  L.dv = a.head_dim_v;
  L.v_offset = static_cast<int>(attention_v_offset_in_k(a));
  const int dp = L.d / 2;
  L.k_words = dp + ((2 - dp % 8) + 8) % 8;
  L.v_words = L.v_offset < 0 ? L.dv / 2 : 0;
  const int G = a.hq / a.hkv;
  L.head_tiles = (G + kRows - 1) / kRows;
  int64_t max_len = std::max(a.max_seqlen_kv, 1);
  if (a.window > 0) max_len = std::min<int64_t>(max_len, a.window);
  // About one wave of two blocks per SM; no split shorter than one key tile.
  const int64_t blocks = std::max<int64_t>(1, n_tokens * a.hkv * L.head_tiles);
  const int64_t want = (2 * static_cast<int64_t>(n_sms) + blocks - 1) / blocks;
  const int64_t most = std::min<int64_t>(kMaxSplits, (max_len + kTile - 1) / kTile);
  L.n_splits = static_cast<int>(std::clamp<int64_t>(want, 1, most));
  L.mma = mla_mma_ok(a, L.v_offset);
  L.smem = L.mma ? mma_smem_bytes(L.d) : smem_bytes(L);
  return L;
}

// Launches `kernel` (an instantiation of either kernel) over (token, split, KV head x head tile).
void run_mla(void (*kernel)(AttentionArgs, MlaLayout, float*, float*), const AttentionArgs& a,
             const MlaLayout& L, int64_t n_tokens, float* part_acc, float* part_ml,
             cudaStream_t stream) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(L.smem)));
  // Two blocks per SM need most of the shared memory on sm_90 (2 x 99 KiB at 576/512 on tensor
  // cores, 2 x 113 KiB on CUDA cores).
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(L.n_splits),
                  static_cast<unsigned>(a.hkv * L.head_tiles));
  launch_overlapped(kernel, grid, dim3(kThreads), L.smem, stream, a, L, part_acc, part_ml);
}

}  // namespace

int64_t attention_v_offset_in_k(const AttentionArgs& a) {
  const CacheView& k = a.k_cache;
  const CacheView& v = a.v_cache;
  if (k.n_blocks != v.n_blocks || k.block_size != v.block_size || k.heads != v.heads ||
      k.stride_block != v.stride_block || k.stride_tok != v.stride_tok ||
      k.stride_head != v.stride_head)
    return -1;
  const auto kb = reinterpret_cast<uintptr_t>(k.data), vb = reinterpret_cast<uintptr_t>(v.data);
  if (vb < kb || (vb - kb) % 2 != 0) return -1;
  const int64_t off = static_cast<int64_t>((vb - kb) / 2);
  return off + v.dim <= k.dim ? off : -1;
}

bool attention_mla_wanted(const AttentionArgs& a) {
  return a.head_dim > 256 || a.head_dim_v > 256 || attention_v_offset_in_k(a) >= 0;
}

bool attention_mla_projection_fusable(const AttentionArgs& a, int64_t n_tokens, int n_sms,
                                      const MlaProjection& p) {
  const auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const int dv = a.head_dim_v;
  return attention_mla_wanted(a) && a.n_seqs > 0 && n_tokens > 0 && n_tokens <= kProjectMaxTokens &&
         (dv == 256 || dv == 512 || dv == 1024) && p.m > 0 && aligned16(p.w) &&
         p.w_stride_head % 8 == 0 && p.w_stride_row % 8 == 0 &&
         plan_mla(a, n_tokens, n_sms).n_splits > 1;
}

int64_t attention_mla_workspace_bytes(const AttentionArgs& a, int64_t n_tokens, int n_sms) {
  if (a.n_seqs == 0 || n_tokens == 0) return 0;
  const MlaLayout L = plan_mla(a, n_tokens, n_sms);
  if (L.n_splits == 1) return 0;
  return n_tokens * a.hq * L.n_splits * (a.head_dim_v + 2) * static_cast<int64_t>(sizeof(float));
}

void launch_attention_mla(const AttentionArgs& a, int64_t n_tokens, void* workspace, int n_sms,
                          cudaStream_t stream, const MlaProjection* proj) {
  if (a.n_seqs == 0 || n_tokens == 0 || a.max_seqlen_q == 0) return;
  PAGELLM_CHECK_MSG(a.hkv > 0 && a.hq % a.hkv == 0,
                    "attention: query heads not a multiple of KV heads");
  PAGELLM_CHECK_MSG(
      a.head_dim > 0 && a.head_dim % 2 == 0 && a.head_dim_v > 0 && a.head_dim_v % 2 == 0,
      "latent attention: head dims must be even (bf16 pairs)");
  PAGELLM_CHECK_MSG(a.head_dim_v <= kMaxDimV, "latent attention: head_dim_v above 1024");
  PAGELLM_CHECK_MSG(n_tokens <= INT32_MAX && a.hkv * ((a.hq / a.hkv + kRows - 1) / kRows) <= 65535,
                    "latent attention: grid too large");
  const MlaLayout L = plan_mla(a, n_tokens, n_sms);
  PAGELLM_CHECK_MSG(proj == nullptr || attention_mla_projection_fusable(a, n_tokens, n_sms, *proj),
                    "latent attention: the projection cannot be fused into this launch");
  PAGELLM_CHECK_MSG(L.v_offset < 0 || L.v_offset % 2 == 0,
                    "latent attention: V must start at an even column of the K row");
  PAGELLM_CHECK_MSG(L.smem <= static_cast<size_t>(kSmemHardLimit),
                    "latent attention: head dims too large for the kernel's shared memory");
  float* part_acc = static_cast<float*>(workspace);
  float* part_ml = nullptr;
  if (L.n_splits > 1) {
    PAGELLM_CHECK_MSG(workspace != nullptr, "latent attention: missing workspace");
    part_ml = part_acc + n_tokens * a.hq * L.n_splits * static_cast<int64_t>(a.head_dim_v);
  }
  PAGELLM_CHECK_MSG(L.n_splits == 1 || n_tokens <= 65535,
                    "latent attention: too many tokens to merge splits");
  if (L.mma) {
    switch (L.dv / 64) {
      case 2:
        run_mla(mla_mma_kernel<2>, a, L, n_tokens, part_acc, part_ml, stream);
        break;
      case 4:
        run_mla(mla_mma_kernel<4>, a, L, n_tokens, part_acc, part_ml, stream);
        break;
      default:
        run_mla(mla_mma_kernel<8>, a, L, n_tokens, part_acc, part_ml, stream);
        break;
    }
  } else {
    const int pairs = a.head_dim_v / 2;
    if (pairs <= 64)
      run_mla(mla_attention_kernel<1>, a, L, n_tokens, part_acc, part_ml, stream);
    else if (pairs <= 128)
      run_mla(mla_attention_kernel<2>, a, L, n_tokens, part_acc, part_ml, stream);
    else if (pairs <= 256)
      run_mla(mla_attention_kernel<4>, a, L, n_tokens, part_acc, part_ml, stream);
    else
      run_mla(mla_attention_kernel<8>, a, L, n_tokens, part_acc, part_ml, stream);
  }
  if (proj != nullptr) {
    MlaProjection p = *proj;
    const dim3 grid(ceil_div(p.m, kProjWarps * kProjectRowsPerWarp), static_cast<unsigned>(a.hq),
                    static_cast<unsigned>(n_tokens));
    const auto run = [&](auto kernel) {
      launch_overlapped(kernel, grid, dim3(kProjThreads), 0, stream, a, L.n_splits, part_acc,
                        part_ml, p);
    };
    if (a.head_dim_v == 256)
      run(mla_merge_project_kernel<1, kProjectRowsPerWarp>);
    else if (a.head_dim_v == 512)
      run(mla_merge_project_kernel<2, kProjectRowsPerWarp>);
    else
      run(mla_merge_project_kernel<4, kProjectRowsPerWarp>);
  } else if (L.n_splits > 1) {
    const dim3 grid(static_cast<unsigned>((a.head_dim_v + kReduceThreads - 1) / kReduceThreads),
                    static_cast<unsigned>(a.hq), static_cast<unsigned>(n_tokens));
    launch_overlapped(mla_reduce_kernel, grid, dim3(kReduceThreads), 0, stream, a, L.n_splits,
                      part_acc, part_ml);
  }
}

}  // namespace pagellm::cuda
