// The attention phase of the streamed chain (StreamAttention, kernels.h; gemv_stream.cu runs it
// between the q|k|v product and o_proj's). One token of one sequence: block b of the chain takes
// KV head b / splits and its piece b % splits of the sequence; blocks past hkv * splits have no
// part in it.
//
// Why inside the chain: as its own kernels (RoPE and the KV store, then split attention and its
// merge), a Llama layer's attention costs ~8.7 us at batch 1 of which its K and V bytes are well
// under 1 us (docs/PERF.md, fourteenth round): each kernel's ramp, drain and hand-over. Inside the
// chain the producer keeps streaming o_proj's weights meanwhile, and the only hand-overs are the
// chain's grid-wide counts.
//
// Layout of the work: each half-warp takes every 16th position of the piece, its 16 lanes 8 dims
// each of the 128 (one 16-byte load per lane a row), and keeps an online softmax for each of the
// group's query heads; then the two halves of a warp, then the 8 warps (through shared memory),
// then the pieces (the last block of a KV head to finish reads every piece's sums back) merge
// theirs. The token's own K and V come from the q|k|v output, rotated here and stored to the
// cache by the block whose piece ends the sequence, which also attends to them from registers.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace stream_attention {

constexpr int kDim = 128;
constexpr int kLanes = kDim / 8;  // lanes of a half-warp, 8 dims each
constexpr int kUnroll = 4;        // positions a half-warp loads before it uses any

// Where a phase's shared scratch is: acc [warps][group][kDim] and ml [warps][group][2] floats,
// and room for `table_slots` block-table entries.
struct Scratch {
  float* acc;
  float* ml;
  int32_t* table;
  int table_slots;
  unsigned* last;  // one word: this block merges its KV head's pieces
};

// The RoPE of an 8-dim slice of a head: dims 8 li .. 8 li + 7 of this lane; pairs (j, j + 64)
// meet across lanes li and li + 8 of the half-warp (a shuffle), interleaved pairs within a lane.
// Rounded to bf16 as the RoPE kernel's output is.
__device__ __forceinline__ void rope8(float (&v)[8], const float* cos_sin, bool interleaved,
                                      int li) {
  constexpr int kHalf = kDim / 2;
  if (interleaved) {
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const int j = (8 * li + e) / 2;
      const float c = __ldg(cos_sin + j), s = __ldg(cos_sin + kHalf + j);
      const float x0 = v[e], x1 = v[e + 1];
      v[e] = __bfloat162float(__float2bfloat16_rn(x0 * c - x1 * s));
      v[e + 1] = __bfloat162float(__float2bfloat16_rn(x1 * c + x0 * s));
    }
    return;
  }
  const bool low = li < kLanes / 2;  // dims below 64: the first of each pair
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float other = __shfl_xor_sync(0xffffffffu, v[e], kLanes / 2);
    const int j = (8 * li + e) % kHalf;
    const float c = __ldg(cos_sin + j), s = __ldg(cos_sin + kHalf + j);
    const float r = low ? v[e] * c - other * s : v[e] * c + other * s;
    v[e] = __bfloat162float(__float2bfloat16_rn(r));
  }
}

// One position into a head's online softmax: score s (already scaled), value row vv.
__device__ __forceinline__ void softmax_step(float s, const uint4& vv, float& m, float& l,
                                             float (&acc)[8]) {
  const float m_new = fmaxf(m, s);
  const float corr = __expf(m - m_new);  // 0 while m is -inf
  const float p = __expf(s - m_new);
  l = l * corr + p;
  float f[8];
  unpack_bf16x8(vv, f);
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = acc[e] * corr + p * f[e];
  m = m_new;
}

// The sum over a half-warp's 16 lanes.
__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float merge_weight(float m, float m_all) {
  return m == -INFINITY ? 0.0f : __expf(m - m_all);
}

// The block's part of the phase: KV head g, and the piece's positions [p0, p1) of the sequence's
// len, of which [p0, c1) are cached (all but the token's own, the last); `table` holds their
// block-table entries. active == false: the block has no part.
struct Part {
  bool active;
  int g, piece, len, p0, p1, c1;
  const int32_t* table;  // indexed by a position's block number
};

// The block's part, its block-table entries staged in shared memory (a piece too long for the
// room reads them where they are). All of it comes from the step's upload (no kernel of the step
// writes the length or the table, as attention.cu's decode kernel relies on too), so the chain
// stages it before it waits for the phase's inputs: the length's and the entries' round trips
// overlap that wait instead of preceding the K/V loads. The caller's barrier before `run` makes
// the entries visible.
template <int kWarps>
__device__ Part stage(const StreamAttention& a, const Scratch& sc) {
  Part pt{};
  const int b = blockIdx.x;
  pt.active = b < a.hkv * a.splits;
  if (!pt.active) return pt;
  pt.g = b / a.splits;
  pt.piece = b % a.splits;
  pt.len = __ldg(a.seq_len);
  const int per_piece = (pt.len + a.splits - 1) / a.splits;
  pt.p0 = pt.piece * per_piece;
  pt.p1 = min(pt.len, pt.p0 + per_piece);
  pt.c1 = min(pt.p1, pt.len - 1);
  const int bs = a.k_cache.block_size;
  const int e0 = pt.p0 / bs, entries = pt.c1 > pt.p0 ? (pt.c1 - 1) / bs - e0 + 1 : 0;
  if (entries > sc.table_slots) {
    pt.table = a.block_table;
    return pt;
  }
  for (int i = threadIdx.x; i < entries; i += 32 * kWarps)
    sc.table[i] = __ldg(a.block_table + e0 + i);
  pt.table = sc.table - e0;
  return pt;
}

// The phase for the block's part (from `stage`, with a barrier of `sync` since): kWarps warps
// take part, and `sync` is their barrier. counters[g] counts KV head g's pieces done (0 before
// and after). mark(i) ends step i of StreamChainTimes::attention_step (a timed build's stamps;
// nothing in others).
template <int kWarps, typename Sync, typename Mark>
__device__ void run(const StreamAttention& a, const Scratch& sc, const Part& pt, unsigned* counters,
                    Sync sync, Mark mark) {
  if (!pt.active) return;
  const int g = pt.g, piece = pt.piece, len = pt.len, p0 = pt.p0, p1 = pt.p1, c1 = pt.c1;
  const int group = a.hq / a.hkv;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, half = lane >> 4, li = lane & 15;
  const bf16* qkv = static_cast<const bf16*>(a.qkv);
  const CacheView& kc = a.k_cache;
  const CacheView& vc = a.v_cache;
  const int32_t* table = pt.table;
  const int bs = kc.block_size;

  // The group's query heads, rotated: 8 dims of each a lane.
  float q[kStreamMaxGroup][8];
#pragma unroll
  for (int hh = 0; hh < kStreamMaxGroup; ++hh) {
    if (hh < group) {
      unpack_bf16x8(__ldcg(reinterpret_cast<const uint4*>(qkv + (g * group + hh) * kDim) + li),
                    q[hh]);
      rope8(q[hh], a.cos_sin, a.interleaved, li);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[hh][e] *= a.scale;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[hh][e] = 0.0f;
    }
  }
  mark(0);
  float m[kStreamMaxGroup], l[kStreamMaxGroup], acc[kStreamMaxGroup][8];
#pragma unroll
  for (int hh = 0; hh < kStreamMaxGroup; ++hh) {
    m[hh] = -INFINITY;
    l[hh] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[hh][e] = 0.0f;
  }

  // The cached positions: half-warp h (of 2 * kWarps) takes p0 + h, p0 + h + 2 * kWarps, ...;
  // the loop runs warp by warp (its sums shuffle across both halves), each lane's position
  // tested where it is used.
  const int stride = 2 * kWarps;
  for (int base = p0 + 2 * warp; base < c1; base += stride * kUnroll) {
    uint4 kv[kUnroll], vv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int pos = base + half + u * stride;
      if (pos < c1) {
        const int64_t blk = table[pos / bs];
        const int64_t off = pos % bs;
        const bf16* kr = static_cast<const bf16*>(kc.data) + blk * kc.stride_block +
                         off * kc.stride_tok + g * kc.stride_head;
        const bf16* vr = static_cast<const bf16*>(vc.data) + blk * vc.stride_block +
                         off * vc.stride_tok + g * vc.stride_head;
        kv[u] = __ldcg(reinterpret_cast<const uint4*>(kr) + li);
        vv[u] = __ldcg(reinterpret_cast<const uint4*>(vr) + li);
      } else {
        kv[u] = vv[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float f[8];
      unpack_bf16x8(kv[u], f);
      float s[kStreamMaxGroup];
#pragma unroll
      for (int hh = 0; hh < kStreamMaxGroup; ++hh) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(q[hh][e], f[e], d);
        s[hh] = half_warp_sum(d);
      }
      if (base + half + u * stride < c1) {
#pragma unroll
        for (int hh = 0; hh < kStreamMaxGroup; ++hh)
          if (hh < group) softmax_step(s[hh], vv[u], m[hh], l[hh], acc[hh]);
      }
    }
  }

  mark(1);

  // The token itself, by the first half-warp of the block whose piece ends the sequence: its k
  // rotated, k and v stored to the cache, then attended to from registers.
  if (p1 == len && p0 < len && warp == 0) {
    const int kh = a.hq + g, vh = a.hq + a.hkv + g;
    float kf[8];
    unpack_bf16x8(__ldcg(reinterpret_cast<const uint4*>(qkv + kh * kDim) + li), kf);
    rope8(kf, a.cos_sin, a.interleaved, li);
    const uint4 kr = pack_bf16x8(kf);
    const uint4 vr = __ldcg(reinterpret_cast<const uint4*>(qkv + vh * kDim) + li);
    if (half == 0) {
      const int32_t slot = __ldg(a.slot);
      if (slot >= 0 && slot < kc.n_blocks * kc.block_size) {
        const int64_t blk = slot / kc.block_size, off = slot % kc.block_size;
        reinterpret_cast<uint4*>(static_cast<bf16*>(kc.data) + blk * kc.stride_block +
                                 off * kc.stride_tok + g * kc.stride_head)[li] = kr;
        reinterpret_cast<uint4*>(static_cast<bf16*>(vc.data) + blk * vc.stride_block +
                                 off * vc.stride_tok + g * vc.stride_head)[li] = vr;
      }
    }
#pragma unroll
    for (int hh = 0; hh < kStreamMaxGroup; ++hh) {
      float d = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) d = fmaf(q[hh][e], kf[e], d);
      const float s = half_warp_sum(d);
      if (half == 0 && hh < group) softmax_step(s, vr, m[hh], l[hh], acc[hh]);
    }
  }

  // The warp's two halves, then the warps through shared memory.
#pragma unroll
  for (int hh = 0; hh < kStreamMaxGroup; ++hh) {
    if (hh >= group) continue;
    const float mo = __shfl_xor_sync(0xffffffffu, m[hh], kLanes);
    const float lo = __shfl_xor_sync(0xffffffffu, l[hh], kLanes);
    const float mm = fmaxf(m[hh], mo);
    const float w0 = merge_weight(m[hh], mm), w1 = merge_weight(mo, mm);
    l[hh] = l[hh] * w0 + lo * w1;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float ao = __shfl_xor_sync(0xffffffffu, acc[hh][e], kLanes);
      acc[hh][e] = acc[hh][e] * w0 + ao * w1;
    }
    m[hh] = mm;
    if (half == 0) {
#pragma unroll
      for (int e = 0; e < 8; ++e) sc.acc[(warp * group + hh) * kDim + 8 * li + e] = acc[hh][e];
      if (li == 0) {
        sc.ml[(warp * group + hh) * 2] = m[hh];
        sc.ml[(warp * group + hh) * 2 + 1] = l[hh];
      }
    }
  }
  sync();
  mark(2);
  // Thread i takes (head hh, dim d) pairs i, i + 32 * kWarps, ...
  const int stride_hd = 32 * kWarps;
  const int pairs = group * kDim;
  const int hd = a.head_dim + 2;
  for (int i = t; i < pairs; i += stride_hd) {
    const int hh = i / kDim, d = i % kDim;
    float mm = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, sc.ml[(w * group + hh) * 2]);
    float ls = 0.0f, as = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float wt = merge_weight(sc.ml[(w * group + hh) * 2], mm);
      ls += sc.ml[(w * group + hh) * 2 + 1] * wt;
      as += sc.acc[(w * group + hh) * kDim + d] * wt;
    }
    const int h = g * group + hh;
    if (a.splits == 1) {
      static_cast<bf16*>(a.out)[h * kDim + d] = __float2bfloat16_rn(ls > 0.0f ? as / ls : 0.0f);
    } else {
      float* part = a.partials + (static_cast<int64_t>(h) * a.splits + piece) * hd;
      part[d] = as;
      if (d == 0) {
        part[kDim] = mm;
        part[kDim + 1] = ls;
      }
    }
  }
  if (a.splits == 1) {
    mark(3);
    return;
  }

  // The last piece of the KV head to finish merges them all.
  sync();
  if (t == 0) {
    __threadfence();
    const unsigned before = atomicAdd(counters + g, 1u);
    const bool last = before == static_cast<unsigned>(a.splits) - 1;
    if (last) {
      atomicExch(counters + g, 0u);  // every piece has counted: the next attention phase's
      __threadfence();               // count starts from 0
    }
    *sc.last = last ? 1u : 0u;
  }
  sync();
  mark(3);
  if (*sc.last == 0u) return;
  for (int i = t; i < pairs; i += stride_hd) {
    const int hh = i / kDim, d = i % kDim, h = g * group + hh;
    const float* part = a.partials + static_cast<int64_t>(h) * a.splits * hd;
    // Every piece's max, sum of p and value in one round trip: loaded piece by piece, as a loop
    // over a run-time count is, they were one L2 trip each (~16 us a layer at 16 pieces).
    float pm[kStreamMaxSplits], pl[kStreamMaxSplits], pa[kStreamMaxSplits];
#pragma unroll
    for (int s = 0; s < kStreamMaxSplits; ++s) {
      const bool in = s < a.splits;
      pm[s] = in ? __ldcg(part + s * hd + kDim) : -INFINITY;
      pl[s] = in ? __ldcg(part + s * hd + kDim + 1) : 0.0f;
      pa[s] = in ? __ldcg(part + s * hd + d) : 0.0f;
    }
    float mm = -INFINITY;
#pragma unroll
    for (int s = 0; s < kStreamMaxSplits; ++s) mm = fmaxf(mm, pm[s]);
    float ls = 0.0f, as = 0.0f;
#pragma unroll
    for (int s = 0; s < kStreamMaxSplits; ++s) {
      const float wt = merge_weight(pm[s], mm);  // 0 past the pieces
      ls += pl[s] * wt;
      as += pa[s] * wt;
    }
    static_cast<bf16*>(a.out)[h * kDim + d] = __float2bfloat16_rn(ls > 0.0f ? as / ls : 0.0f);
  }
  mark(4);
}

}  // namespace stream_attention
}  // namespace pagellm::cuda
