// Ragged prefill attention over the paged KV cache on tensor cores (FlashAttention-2 style).
//
// Work split: one thread block per (tile of kBm rows, KV head, sequence). A row is one (query
// token, query head) pair of a GQA group, packed token-major: row r of a sequence is token r / G,
// head kvh * G + r % G. So the G heads that read the same KV head share every K/V tile a block
// loads, and a short sequence (or a decode token in a mixed batch) fills its rows with heads
// instead of leaving 15 of 16 rows of an mma idle. Each of the kWarps warps owns 16 rows (the
// M of mma.m16n8k16).
//
// Per key tile (kBn keys), all in registers except the operands:
//   S = Q K^T     bf16 mma.sync m16n8k16, fp32 accumulate; Q and K from shared memory by
//                 ldmatrix (Q kept in registers for head dims up to 192)
//   softcap, scale, causal + sliding-window masks, online softmax in fp32 (running max and sum;
//                 the accumulators are rescaled when the max grows), exponentials in base 2
//   O += P V      P rounded to bf16 (the S accumulator fragments are exactly the A fragments of
//                 this product), V by ldmatrix.trans
// K/V tiles come from the cache through the block table with cp.async (16-byte chunks, two
// stages: the next tile loads while this one is multiplied); rows past the last visible key and
// head-dim padding are zero-filled, so every value in shared memory is finite. The cache offsets
// of a tile's key rows are worked out once per key (one thread each, the table entry read an
// iteration ahead) into a small shared table that the chunk copies read. block_size is a runtime
// value: a power of two uses shifts, any other size divides.
//
// Causal work grows with the query position, so tiles are unequal. For sequences of up to
// kMaxPairedTiles tiles a block runs tile n-1-x and then tile x of its sequence (equal work per
// block); longer ones get one tile per block, heaviest first.
//
// Shared memory rows are XOR-swizzled in 16-byte chunks (chunk c of row r sits at
// (c & ~7) | ((c ^ r) & 7)), so the eight rows an ldmatrix phase reads, and the chunks cp.async
// writes, fall in distinct banks.
//
// Head dims are compile-time: K in {64, 128, 192, 256}, V in {64, 128, 256}; smaller dims are
// zero-padded up to the next instantiation (80 runs as 128). The DeepSeek MLA expanded prefill
// (K 192, V 128) has its own instantiation.
#include "backend/cuda/attention_prefill.h"

#include <algorithm>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/mma.cuh"

namespace pagellm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBm = 16 * kWarps;  // packed (token, head) rows per block
constexpr int kBn = 64;           // keys per tile
constexpr int kStages = 2;        // K/V tiles in flight
constexpr int kMaxPairedTiles = 128;  // longest sequence (in kBm-row tiles) that pairs its tiles
constexpr float kLog2e = 1.4426950408889634f;

template <int D, int DV>
constexpr int smem_bytes() {
  return (kBm * D + kStages * kBn * (D + DV)) * 2;
}

// Shared memory of one block.
template <int D, int DV>
struct TileSmem {
  bf16* q;                  // [kBm][D], swizzled
  bf16* k;                  // [kStages][kBn][D], swizzled
  bf16* v;                  // [kStages][kBn][DV], swizzled
  longlong2 (*rows)[kBn];   // [kStages][kBn]: element offsets of each key row in K and V; -1 past hi
};

// One tile of kBm rows: Q . K^T over its keys, online softmax, P . V, and the output rows.
template <int D, int DV>
__device__ __forceinline__ void prefill_tile(const AttentionArgs& a, const TileSmem<D, DV>& sm,
                                             int tile, int kvh, int s, int G, int q_begin, int n_q) {
  constexpr bool kQInRegs = D + DV <= 320;  // (256, 256) would need 64 more registers per thread
  constexpr int kDm = D > DV ? D : DV;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_rows = n_q * G;
  const int row0 = tile * kBm;
  const int32_t start = a.seq_lens_kv[s] - n_q;  // position of the sequence's first query
  const int t_first = row0 / G;
  const int t_last = (min(row0 + kBm, n_rows) - 1) / G;
  const int32_t hi = start + t_last;  // last key any row of this tile sees
  const int32_t lo = a.window > 0 ? max(0, start + t_first - a.window + 1) : 0;
  const int n_kt = (hi - lo) / kBn + 1;
  const int32_t* table = a.block_tables + s * a.block_table_ld;
  const int bs = a.block_size;
  const bool bs_pow2 = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;
  const bf16* kc = static_cast<const bf16*>(a.k_cache.data);
  const bf16* vc = static_cast<const bf16*>(a.v_cache.data);
  const bf16* kc_head = kc + kvh * a.k_cache.stride_head;
  const bf16* vc_head = vc + kvh * a.v_cache.stride_head;

  // Cache offsets of key tile kt's rows, one row per thread of the first kBn: the block-table
  // lookup is done once per key, not once per 16-byte chunk. fetch() reads the table entry (-1
  // past hi) an iteration before store() needs it, so its latency hides behind a tile of math.
  const auto fetch = [&](int kt) -> int32_t {
    const int32_t p = lo + kt * kBn + tid;
    if (tid >= kBn || kt >= n_kt || p > hi) return -1;
    return table[bs_pow2 ? p >> bs_shift : p / bs];
  };
  const auto store = [&](int kt, int stage, int32_t blk) {
    if (tid < kBn) {
      const int32_t p = lo + kt * kBn + tid;
      longlong2 off = make_longlong2(-1, -1);
      if (blk >= 0) {
        const int64_t slot = bs_pow2 ? p & (bs - 1) : p % bs;
        off.x = blk * a.k_cache.stride_block + slot * a.k_cache.stride_tok;
        off.y = blk * a.v_cache.stride_block + slot * a.v_cache.stride_tok;
      }
      sm.rows[stage][tid] = off;
    }
  };
  // Key tile -> stage, rows past hi and dims past the head dims zero-filled.
  const auto load_kv = [&](int stage) {
    bf16* kd = sm.k + stage * kBn * D;
    bf16* vd = sm.v + stage * kBn * DV;
    constexpr int kChunks = kDm / 8;
    static_assert(kBn * kChunks % kThreads == 0, "whole K/V chunks per thread");
#pragma unroll 4
    for (int it = 0; it < kBn * kChunks / kThreads; ++it) {
      const int i = tid + it * kThreads;
      const int r = i / kChunks, c = i % kChunks;
      const longlong2 off = sm.rows[stage][r];
      if (c < D / 8) {
        const bool ok = off.x >= 0 && c * 8 < a.head_dim;
        cp_async_16(smem_u32(kd + swz<D>(r, c)), ok ? kc_head + off.x + c * 8 : kc, ok);
      }
      if (c < DV / 8) {
        const bool ok = off.y >= 0 && c * 8 < a.head_dim_v;
        cp_async_16(smem_u32(vd + swz<DV>(r, c)), ok ? vc_head + off.y + c * 8 : vc, ok);
      }
    }
  };

  store(0, 0, fetch(0));
  store(1, 1, fetch(1));
  int32_t next_blk = fetch(2);
  __syncthreads();  // row offsets visible; the previous tile of this block is done with smem

  // Q tile: rows past the sequence's queries and dims past head_dim are zeros.
  {
    const bf16* q = static_cast<const bf16*>(a.q);
    constexpr int kChunks = D / 8;
    static_assert(kBm * kChunks % kThreads == 0, "whole Q chunks per thread");
#pragma unroll 1
    for (int it = 0; it < kBm * kChunks / kThreads; ++it) {
      const int i = tid + it * kThreads;
      const int r = i / kChunks, c = i % kChunks;
      const int R = row0 + r;
      const int t = R / G, g = R - t * G;
      const bool ok = R < n_rows && c * 8 < a.head_dim;
      const bf16* src = ok ? q + static_cast<int64_t>(q_begin + t) * a.q_stride_tok +
                                 static_cast<int64_t>(kvh * G + g) * a.q_stride_head + c * 8
                           : q;
      cp_async_16(smem_u32(sm.q + swz<D>(r, c)), src, ok);
    }
  }
  load_kv(0);
  cp_async_commit();  // group: Q and the first K/V tile

  // This thread's two rows of the warp's 16: lane / 4 and lane / 4 + 8, and their query positions
  // (rows past the sequence's queries get positions past hi: they compute, but are not stored).
  const int wrow = warp * 16 + (lane >> 2);
  int32_t qpos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) qpos[h] = start + (row0 + wrow + 8 * h) / G;
  const int key_lane = 2 * (lane & 3);  // this thread's first key column in an 8-key n-tile

  // Without softcap, scores stay raw dot products and the scale (in log2 units) is applied in the
  // exponent: exp2(s * mul - m * mul), one FFMA per score. With softcap they become
  // softcap * tanh(s * scale / softcap) in log2 units and mul is 1. Both are increasing in s
  // (scale > 0), so the running max is the same.
  const bool capped = a.softcap > 0.0f;
  const float cap_in = a.scale / a.softcap;
  const float cap_out = a.softcap * kLog2e;
  const float mul = capped ? 1.0f : a.scale * kLog2e;

  float o[DV / 8][4];
#pragma unroll
  for (int j = 0; j < DV / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of the (raw or capped) scores
  float l[2] = {0.0f, 0.0f};            // this thread's part of the running sum
  uint32_t qf[kQInRegs ? D / 16 : 1][4];

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt % kStages;
    if (kt + 1 < n_kt) load_kv((kt + 1) % kStages);
    cp_async_commit();
    cp_async_wait<1>();  // everything but the group just committed has landed
    __syncthreads();
    // Every thread has issued tile kt's loads (and kt + 1's), which read this slot: it takes tile
    // kt + 2's offsets, seen by their loads after this iteration's closing barrier.
    store(kt + 2, stage, next_blk);
    next_blk = fetch(kt + 3);

    const bf16* kt_s = sm.k + stage * kBn * D;
    const bf16* vt_s = sm.v + stage * kBn * DV;

    if (kQInRegs && kt == 0) {
#pragma unroll
      for (int kk = 0; kk < (kQInRegs ? D / 16 : 1); ++kk)
        ldmatrix_x4(qf[kk], smem_u32(sm.q + swz<D>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4))));
    }

    // S = Q K^T: 16 rows x kBn keys per warp.
    float sc[kBn / 8][4];
#pragma unroll
    for (int j = 0; j < kBn / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qa[e] = qf[kQInRegs ? kk : 0][e];
      } else {
        ldmatrix_x4(qa, smem_u32(sm.q + swz<D>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4))));
      }
#pragma unroll
      for (int nn = 0; nn < kBn / 16; ++nn) {
        uint32_t kb4[4];
        ldmatrix_x4(kb4, smem_u32(kt_s + swz<D>(nn * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                 2 * kk + ((lane >> 3) & 1))));
        mma_bf16(sc[2 * nn], qa, kb4[0], kb4[1]);
        mma_bf16(sc[2 * nn + 1], qa, kb4[2], kb4[3]);
      }
    }

    // Softcap, then masks where this tile crosses the diagonal or the window's lower edge.
    const int32_t kb = lo + kt * kBn;
    if (capped) {
#pragma unroll
      for (int j = 0; j < kBn / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[j][e] = cap_out * tanhf(sc[j][e] * cap_in);
    }
    const bool need_mask = kb + kBn - 1 > start + t_first ||
                           (a.window > 0 && kb <= start + t_last - a.window);
    if (need_mask) {
#pragma unroll
      for (int j = 0; j < kBn / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int32_t p = kb + j * 8 + key_lane + (e & 1);
          const int32_t qp = qpos[e >> 1];
          if (p > qp || (a.window > 0 && p <= qp - a.window)) sc[j][e] = -INFINITY;
        }
    }

    // Online softmax; a quad (4 lanes) holds one row's kBn scores.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBn / 8; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * h], sc[j][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      // Nothing visible to this row yet: subtract 0 so masked scores give exp2(-inf) = 0, not NaN.
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = exp2f((m[h] - m_use) * mul);  // 0 before the first visible key
      m[h] = m_new;
      const float base = m_use * mul;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBn / 8; ++j) {
        sc[j][2 * h] = exp2f(fmaf(sc[j][2 * h], mul, -base));
        sc[j][2 * h + 1] = exp2f(fmaf(sc[j][2 * h + 1], mul, -base));
        sum += sc[j][2 * h] + sc[j][2 * h + 1];
      }
      l[h] = l[h] * corr + sum;
#pragma unroll
      for (int j = 0; j < DV / 8; ++j) {
        o[j][2 * h] *= corr;
        o[j][2 * h + 1] *= corr;
      }
    }

    // O += P V: the S fragments of n-tiles 2kk and 2kk+1 are the A fragment of k-step kk.
#pragma unroll
    for (int kk = 0; kk < kBn / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]),
                              pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int nn = 0; nn < DV / 16; ++nn) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, smem_u32(vt_s + swz<DV>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                       2 * nn + (lane >> 4))));
        mma_bf16(o[2 * nn], pa, vb[0], vb[1]);
        mma_bf16(o[2 * nn + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // this stage is refilled by the load issued in the next iteration
  }

  // out = O / l. l >= 1 for every stored row: a query always sees its own key, and the row's
  // maximum contributes exp2(0).
  bf16* out = static_cast<bf16*>(a.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lsum = l[h];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    const int R = row0 + wrow + 8 * h;
    if (R >= n_rows) continue;
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    const int t = R / G, g = R - t * G;
    bf16* orow = out + static_cast<int64_t>(q_begin + t) * a.o_stride_tok +
                 static_cast<int64_t>(kvh * G + g) * a.o_stride_head;
#pragma unroll
    for (int j = 0; j < DV / 8; ++j) {
      const int col = j * 8 + key_lane;
      if (col < a.head_dim_v)
        *reinterpret_cast<__nv_bfloat162*>(orow + col) =
            __floats2bfloat162_rn(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    }
  }
}

// Grid: (tile slots, KV heads, sequences). Unpaired, slot x is tile gridDim.x - 1 - x, so the
// heaviest tiles (latest queries: the most keys) start first. Paired, slot x runs tile
// n_tiles - 1 - x and then tile x of its sequence: every block gets about the same number of
// key tiles, which balances a grid that fits the GPU in one wave (short prompts).
template <int D, int DV>
__global__ void __launch_bounds__(kThreads) prefill_mma_kernel(AttentionArgs a, bool paired) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ longlong2 rows[kStages][kBn];
  TileSmem<D, DV> sm;
  sm.q = reinterpret_cast<bf16*>(smem_raw);
  sm.k = sm.q + kBm * D;
  sm.v = sm.k + kStages * kBn * D;
  sm.rows = rows;

  const int x = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
  const int G = a.hq / a.hkv;
  const int q_begin = a.cu_seqlens_q[s];
  const int n_q = a.cu_seqlens_q[s + 1] - q_begin;
  const int n_tiles = (n_q * G + kBm - 1) / kBm;
  const int first = paired ? n_tiles - 1 - x : static_cast<int>(gridDim.x) - 1 - x;
  int n_pass;
  if (paired) n_pass = first > x ? 2 : first == x ? 1 : 0;
  else n_pass = first < n_tiles ? 1 : 0;
  for (int pass = 0; pass < n_pass; ++pass)
    prefill_tile<D, DV>(a, sm, pass == 0 ? first : x, kvh, s, G, q_begin, n_q);
#else
  __trap();  // the backend is built for sm_80 and newer; mma.sync bf16 needs sm_80
#endif
}

template <int D, int DV>
void run(const AttentionArgs& a, cudaStream_t stream) {
  constexpr int kSmem = smem_bytes<D, DV>();
  // Opting in above 48 KiB of dynamic shared memory is a per-function attribute: set it once.
  static const bool opted_in = [] {
    CUDA_CHECK(cudaFuncSetAttribute(prefill_mma_kernel<D, DV>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)opted_in;
  const int64_t group = a.hq / a.hkv;
  const int64_t tiles = ceil_div(static_cast<int64_t>(a.max_seqlen_q) * group, kBm);
  // Pairing evens out the causal triangle when the unpaired grid is a few waves of very unequal
  // blocks; a long sequence's many tiles balance on their own in heaviest-first order, and then
  // pairing only adds a wave-quantization tail. Measured on the H200 (32q/8kv x 128, 64-row tiles):
  // paired is 27% faster at 1 x 1024 tokens (64 tiles), 12% at 1 x 2048 (128), 14% at 4 x 512,
  // 2% at 8 x 1024, equal at 1 x 512, and 3% slower at 1 x 4096 (256 tiles) and 1 x 16384.
  const bool paired = tiles <= kMaxPairedTiles;
  const dim3 grid(paired ? ceil_div(tiles, 2) : tiles, a.hkv, a.n_seqs);
  prefill_mma_kernel<D, DV><<<grid, kThreads, kSmem, stream>>>(a, paired);
  CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool prefill_mma_supported(const AttentionArgs& a) {
  const auto mult8 = [](int64_t v) { return v % 8 == 0; };
  const auto cache_ok = [&](const CacheView& c) {
    return aligned16(c.data) && mult8(c.stride_block) && mult8(c.stride_tok) && mult8(c.stride_head);
  };
  return a.scale > 0.0f && a.hkv > 0 && a.hq % a.hkv == 0 && a.head_dim > 0 && a.head_dim_v > 0 &&
         a.head_dim <= 256 && a.head_dim_v <= 256 && mult8(a.head_dim) && mult8(a.head_dim_v) &&
         aligned16(a.q) && mult8(a.q_stride_tok) && mult8(a.q_stride_head) &&
         cache_ok(a.k_cache) && cache_ok(a.v_cache) &&
         reinterpret_cast<uintptr_t>(a.out) % 4 == 0 && a.o_stride_tok % 2 == 0 &&
         a.o_stride_head % 2 == 0 && a.block_size >= 1 && a.hkv <= 65535 && a.n_seqs <= 65535 &&
         static_cast<int64_t>(a.max_seqlen_q) * (a.hq / a.hkv) <= (int64_t{1} << 30);
}

void launch_prefill_mma(const AttentionArgs& a, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(prefill_mma_supported(a), "attention: prefill shape not covered by the mma kernel");
  if (a.n_seqs == 0 || a.max_seqlen_q == 0) return;
  // Compiled head dims: K 64/128/192/256 with V 64/128/256. (K <= 192, V <= 128) runs as (192,
  // 128), the MLA shape; any other pair runs as the square instantiation of its larger dim.
  const auto round = [](int d) { return d <= 64 ? 64 : d <= 128 ? 128 : d <= 192 ? 192 : 256; };
  const int dk = round(a.head_dim), dv = round(a.head_dim_v);
  if (dk == 192 && dv <= 128) return run<192, 128>(a, stream);
  const int dm = std::max(dk, dv);
  if (dm == 64) run<64, 64>(a, stream);
  else if (dm == 128) run<128, 128>(a, stream);
  else run<256, 256>(a, stream);
}

}  // namespace pagellm::cuda
