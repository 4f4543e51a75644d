// Mixture-of-experts kernels: routing (one warp per token), the sort of (token, expert) pairs by
// expert, grouped GEMVs for the experts' gate|up (SiLU x up fused) and down products, and the
// weighted combine. See moe.h for how they fit together. Each is launched overlapped with the
// kernel before (device_utils.cuh) and waits for it in pdl_wait() before touching what it may
// write. The gate|up GEMV cannot request weights before that, as gemv.cu does, since its expert
// comes from the order the kernel before may still be making; the down GEMV and the combine,
// which come after it, read the order (and the down GEMV its first weights) before their wait.
#include <algorithm>
#include <climits>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/moe.h"

namespace pagellm::cuda {
namespace {

// --- routing ---

constexpr int kRouteWarps = 4;

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The (value, index) that sorts first by value descending, then index ascending, over the warp;
// every lane gets it. Lanes with nothing to offer pass (-inf, INT_MAX), which loses to any index.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
}

// The `count` best of the values lanes [0, n_valid) hold, as a bit mask of lanes (groups).
__device__ __forceinline__ uint32_t warp_top_lanes(float v, int n_valid, int count) {
  const int lane = threadIdx.x & 31;
  uint32_t keep = 0;
  for (int c = 0; c < count; ++c) {
    const bool offer = lane < n_valid && !((keep >> lane) & 1u);
    float bv = offer ? (isnan(v) ? -INFINITY : v) : -INFINITY;
    int bi = offer ? lane : INT_MAX;
    warp_argmax(bv, bi);
    keep |= 1u << bi;
  }
  return keep;
}

// Per token (one warp): scores in f32 (softmax with a double-precision sum, or sigmoid, computed
// in double as the CPU reference does, so both round the same values), the selection array for
// the method, top_k rounds of a warp argmax, then the weights by lane 0 in the reference's order.
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(MoeRouteArgs a) {
  extern __shared__ float route_smem[];
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= a.n_tokens) return;  // whole warps only; no block-wide barrier below
  const int E = a.n_experts, K = a.p.top_k;
  float* sc = route_smem + warp * 2 * E;  // [E] scores
  float* ch = sc + E;                     // [E] what the top-k ranks (group methods)
  const float* l = a.logits + t * a.ld;

  if (a.p.scoring == MoeScoreFunc::kSoftmax) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    double sum = 0.0;
    for (int e = lane; e < E; e += 32) sum += exp(static_cast<double>(l[e] - mx));
    sum = warp_sum_f64(sum);
    for (int e = lane; e < E; e += 32)
      sc[e] = static_cast<float>(exp(static_cast<double>(l[e] - mx)) / sum);
  } else {
    for (int e = lane; e < E; e += 32)
      sc[e] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(l[e]))));
  }
  __syncwarp();

  const float* sel = sc;
  if (a.p.select != MoeSelect::kGreedy) {
    const int G = a.p.n_group, per_group = E / G;
    const bool noaux = a.p.select == MoeSelect::kNoauxTc;
    if (noaux) {
      for (int e = lane; e < E; e += 32) ch[e] = sc[e] + a.bias[e];
      __syncwarp();
    }
    // Lane g scores group g: its max score (group-limited greedy) or the sum of its top two
    // biased scores (noaux_tc; a tie for the top counts twice, as the reference's top-2 does).
    float gs = -INFINITY;
    if (lane < G) {
      const float* g = (noaux ? ch : sc) + lane * per_group;
      if (noaux) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int i = 0; i < per_group; ++i) {
          const float v = g[i];
          if (v > b1) {
            b2 = b1;
            b1 = v;
          } else if (v > b2) {
            b2 = v;
          }
        }
        gs = b1 + b2;
      } else {
        gs = g[0];
        for (int i = 1; i < per_group; ++i) gs = fmaxf(gs, g[i]);
      }
    }
    const uint32_t keep = warp_top_lanes(gs, G, a.p.topk_group);
    __syncwarp();
    // Experts of dropped groups rank as 0 (group-limited greedy: transformers' masked_fill) or
    // -inf (noaux_tc).
    for (int e = lane; e < E; e += 32) {
      const bool kept = (keep >> (e / per_group)) & 1u;
      if (noaux) {
        if (!kept) ch[e] = -INFINITY;
      } else {
        ch[e] = kept ? sc[e] : 0.0f;
      }
    }
    __syncwarp();
    sel = ch;
  }

  // Top-k: each lane holds experts lane, lane + 32, ...; bit j of `taken` marks lane + 32 j.
  uint32_t taken = 0;
  int idx[kMoeMaxTopK];
#pragma unroll
  for (int k = 0; k < kMoeMaxTopK; ++k) {
    if (k >= K) break;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = 0, e = lane; e < E; ++j, e += 32) {
      if ((taken >> j) & 1u) continue;
      float v = sel[e];
      if (isnan(v)) v = -INFINITY;
      if (v > bv || (v == bv && e < bi)) bv = v, bi = e;
    }
    warp_argmax(bv, bi);
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    idx[k] = bi;
  }
  if (lane == 0) {
    float w[kMoeMaxTopK];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kMoeMaxTopK; ++k) {
      if (k >= K) break;
      w[k] = sc[idx[k]];
      sum = __fadd_rn(sum, w[k]);
    }
    // DeepSeek-V3 guards the division with 1e-20 (the reference's order of operations).
    const float denom = a.p.select == MoeSelect::kNoauxTc ? __fadd_rn(sum, 1e-20f) : sum;
#pragma unroll
    for (int k = 0; k < kMoeMaxTopK; ++k) {
      if (k >= K) break;
      float v = w[k];
      if (a.p.norm_topk_prob) v = __fdiv_rn(v, denom);
      if (a.p.routed_scaling_factor != 1.0f) v = __fmul_rn(v, a.p.routed_scaling_factor);
      a.ids[t * K + k] = idx[k];
      a.weights[t * K + k] = v;
    }
  }
}

// --- sort by expert ---

// One block. Counts per expert (shared-memory atomics), an exclusive scan that yields both the
// offsets and the positions of the active experts (two 32-bit sums packed in one 64-bit value:
// count << 32 | has-tokens), then each pair takes the next slot of its expert.
__global__ void moe_sort_kernel(const int32_t* __restrict__ ids, int32_t n_pairs, int32_t top_k,
                                int32_t n_experts, MoeWorkspace ws) {
  extern __shared__ int32_t cnt[];  // [E]: counts, then each expert's next free slot
  __shared__ long long warp_total[32];
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
  const int E = n_experts;
  for (int e = tid; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int p = tid; p < n_pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  // Thread tid owns experts [e0, e1).
  const int per = (E + blockDim.x - 1) / blockDim.x;
  const int e0 = min(tid * per, E), e1 = min(e0 + per, E);
  long long local = 0;
  for (int e = e0; e < e1; ++e)
    local += (static_cast<long long>(cnt[e]) << 32) | (cnt[e] > 0 ? 1 : 0);
  long long incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const long long v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    long long v = lane < n_warps ? warp_total[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const long long u = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += u;
    }
    if (lane < n_warps) warp_total[lane] = v;  // inclusive over warps
  }
  __syncthreads();
  long long run = incl - local + (warp > 0 ? warp_total[warp - 1] : 0);
  for (int e = e0; e < e1; ++e) {
    const int c = cnt[e];
    const int off = static_cast<int>(run >> 32);
    ws.offsets[e] = off;
    if (c > 0) {
      const int j = static_cast<int>(run & 0xffffffffll);
      ws.active[j] = e;
      ws.active_begin[j] = off;
    }
    run += (static_cast<long long>(c) << 32) | (c > 0 ? 1 : 0);
    cnt[e] = off;
  }
  const long long total = warp_total[n_warps - 1];
  const int n_active = static_cast<int>(total & 0xffffffffll);
  const int n_slots = static_cast<int>(total >> 32);
  // Past the active experts: -1 (no expert), and every begin at the end of the slots, so that
  // active j's slots are [active_begin[j], active_begin[j + 1]) for every j < E.
  for (int j = n_active + tid; j < E; j += blockDim.x) {
    ws.active[j] = -1;
    ws.active_begin[j + 1] = n_slots;
  }
  if (tid == 0) {
    ws.offsets[E] = n_slots;
    ws.active[E] = n_active;
    ws.active_begin[n_active] = n_slots;
  }
  __syncthreads();
  for (int p = tid; p < n_pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < E) {
      const int s = atomicAdd(&cnt[e], 1);
      ws.slot_token[s] = p / top_k;
      ws.pair_slot[p] = s;
    } else {
      ws.pair_slot[p] = -1;
    }
  }
}

// --- grouped GEMV ---

// As gemv.cu: every lane keeps 8 16-byte weight loads in flight before the math (the gate|up
// kernel streams one gate and one up row per warp, 4 pieces each; the down kernel four rows, 2
// pieces each: its rows, the expert width, are short). TOK, the tokens multiplied per pass over
// the weights, is the launch's bound on an expert's tokens (1 at batch 1, up to kMoeGemvTokens):
// at decode sizes fewer partial sums per lane mean fewer registers, so more warps stream at once.
constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGateUpRows = 1;  // output rows per warp (each reads a gate row and an up row)
constexpr int kGateUpUnroll = 4;
constexpr int kDownRows = 4;
constexpr int kDownUnroll = 2;
constexpr int64_t kGemvStep = 32 * 8;  // elements a warp covers per load

// The active expert of this block (blockIdx.y) and its slots [begin, end): one round of
// independent loads (the sort kernel pads the active list with -1), so the weight stream starts
// one memory latency after launch.
struct BlockExpert {
  int e, begin, end;
};
__device__ __forceinline__ BlockExpert block_expert(const MoeWorkspace& ws) {
  const int j = blockIdx.y;
  return {ws.active[j], ws.active_begin[j], ws.active_begin[j + 1]};
}

// act[s, f] = silu(gate_e[f] . h[token(s)]) * (up_e[f] . h[token(s)]) for the slots s of expert e,
// f in this warp group's rows. The weight rows are streamed once per TOK slots. Its expert comes
// from the order, which the kernel before may still be making (the sort, or, when the order was
// made in a side branch, the branch's last kernel: a captured join is a programmatic edge too), so
// nothing is read before the wait. With SPLIT > 1 (one slot a pass only) the SPLIT warps of a group
// share its rows: part q reads the trips q, q + SPLIT, ... of K, and the group's first warp adds
// the others' sums in part order (through shared memory) before it stores. Fewer trips a warp and
// more blocks turn the SMs' slots over sooner (as in gemv.cu's one-row kernel).
template <int TOK, int SPLIT>
__global__ void __launch_bounds__(kGemvThreads)
    moe_gate_up_kernel(MoeExpertsArgs w, const bf16* __restrict__ h, int64_t ldh, MoeWorkspace ws) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const BlockExpert be = block_expert(ws);
  if (be.e < 0) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t F = w.inter, D = w.hidden;
  const int64_t f0 =
      (static_cast<int64_t>(blockIdx.x) * (kGemvWarps / SPLIT) + warp / SPLIT) * kGateUpRows;
  // A group past the last row still meets the others at the split's barriers.
  if (SPLIT == 1 && f0 >= F) return;
  const bf16* base = static_cast<const bf16*>(w.gate_up) + static_cast<int64_t>(be.e) * 2 * F * D;
  const bf16* wg[kGateUpRows];
  const bf16* wu[kGateUpRows];
#pragma unroll
  for (int r = 0; r < kGateUpRows; ++r) {
    const int64_t f = min(f0 + r, F - 1);  // tail: re-read the last row, never stored
    wg[r] = base + f * D;
    wu[r] = base + (F + f) * D;
  }
  constexpr int64_t kTrip = kGemvStep * kGateUpUnroll;
  const int64_t k_first = lane * 8 + (warp % SPLIT) * kTrip;
  bf16* act = static_cast<bf16*>(ws.act);
  for (int s0 = be.begin; s0 < be.end; s0 += TOK) {
    const int cnt = min(TOK, be.end - s0);
    int32_t tok[TOK];
#pragma unroll
    for (int j = 0; j < TOK; ++j) tok[j] = ws.slot_token[s0 + min(j, cnt - 1)];
    // [r]: gate row r, [kGateUpRows + r]: up row r (one array, so the split adds them as one).
    float acc[2 * kGateUpRows][TOK];
#pragma unroll
    for (int r = 0; r < 2 * kGateUpRows; ++r)
#pragma unroll
      for (int j = 0; j < TOK; ++j) acc[r][j] = 0.0f;
    for (int64_t k0 = k_first; k0 < D; k0 += kTrip * SPLIT) {
      uint4 vg[kGateUpUnroll][kGateUpRows], vu[kGateUpUnroll][kGateUpRows];
      load_trip(vg, wg, k0, kGemvStep, D);
      load_trip(vu, wu, k0, kGemvStep, D);
#pragma unroll
      for (int u = 0; u < kGateUpUnroll; ++u) {
        const int64_t k = k0 + u * kGemvStep;
        if (k >= D) break;
#pragma unroll
        for (int j = 0; j < TOK; ++j) {
          if (j >= cnt) break;
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(h + tok[j] * ldh + k));
#pragma unroll
          for (int r = 0; r < kGateUpRows; ++r) {
            acc[r][j] += dot8(vg[u][r], xv);
            acc[kGateUpRows + r][j] += dot8(vu[u][r], xv);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2 * kGateUpRows; ++r)
#pragma unroll
      for (int j = 0; j < TOK; ++j) acc[r][j] = warp_sum(acc[r][j]);
    if constexpr (SPLIT > 1) {
      static_assert(TOK == 1, "the split adds one slot's sums");
      __shared__ float partial[kGemvWarps][2 * kGateUpRows];
      if (warp % SPLIT != 0 && lane == 0) {
#pragma unroll
        for (int r = 0; r < 2 * kGateUpRows; ++r) partial[warp][r] = acc[r][0];
      }
      __syncthreads();
      if (warp % SPLIT == 0) {
        for (int q = 1; q < SPLIT; ++q) {
#pragma unroll
          for (int r = 0; r < 2 * kGateUpRows; ++r) acc[r][0] += partial[warp + q][r];
        }
      }
      __syncthreads();  // the next pass writes partial again
    }
    if (warp % SPLIT != 0 || lane != 0) continue;
#pragma unroll
    for (int j = 0; j < TOK; ++j) {
      if (j >= cnt) break;  // cnt is the same for the whole block
#pragma unroll
      for (int r = 0; r < kGateUpRows; ++r) {
        const float g = acc[r][j], u = acc[kGateUpRows + r][j];
        const int64_t f = f0 + r;
        // silu(g) = g / (1 + e^-g), as the activation kernel computes it.
        if (f < F)
          act[static_cast<int64_t>(s0 + j) * 2 * F + f] =
              from_float<bf16>(g / (1.0f + expf(-g)) * u);
      }
    }
  }
}

// One pass of the down product over cnt <= TOK consecutive slots whose activations start at
// act (rows 2F apart, the gate half): acc[r][j] = down row r . act row j, summed over the warp
// (every lane gets it). The lane's pieces are added in ascending k, then across the warp, so a
// row's result does not depend on the kernel that runs the pass. wv holds the first trip when
// first_trip_loaded (requested before the wait).
template <int TOK>
__device__ __forceinline__ void down_rows_pass(const bf16* const (&wr)[kDownRows],
                                               uint4 (&wv)[kDownUnroll][kDownRows],
                                               bool first_trip_loaded, const bf16* act, int cnt,
                                               int64_t F, float (&acc)[kDownRows][TOK]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kDownRows; ++r)
#pragma unroll
    for (int j = 0; j < TOK; ++j) acc[r][j] = 0.0f;
  for (int64_t k0 = lane * 8; k0 < F; k0 += kGemvStep * kDownUnroll) {
    if (!(first_trip_loaded && k0 == lane * 8)) load_trip(wv, wr, k0, kGemvStep, F);
#pragma unroll
    for (int u = 0; u < kDownUnroll; ++u) {
      const int64_t k = k0 + u * kGemvStep;
      if (k >= F) break;
#pragma unroll
      for (int j = 0; j < TOK; ++j) {
        if (j >= cnt) break;
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(act + j * 2 * F + k));
#pragma unroll
        for (int r = 0; r < kDownRows; ++r) acc[r][j] += dot8(wv[u][r], xv);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kDownRows; ++r)
#pragma unroll
    for (int j = 0; j < TOK; ++j)
      if (j < cnt) acc[r][j] = warp_sum(acc[r][j]);
}

// y[s, d] = down_e[d] . act[s] for the slots s of expert e, d in this warp's rows. Launched right
// after moe_gate_up_kernel, which waited for the order before letting this kernel start
// (device_utils.cuh): the order is complete, so the block's expert and the first trip of its
// weight rows are requested before the wait, beside the gate|up kernel's end; only act comes
// from that kernel.
template <int TOK>
__global__ void __launch_bounds__(kGemvThreads) moe_down_kernel(MoeExpertsArgs w, MoeWorkspace ws) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t F = w.inter, D = w.hidden;
  const int64_t d0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp) * kDownRows;
  const BlockExpert be = block_expert(ws);
  const bf16* wr[kDownRows];
  uint4 wv[kDownUnroll][kDownRows];  // one trip of the stream (load_trip)
  const auto set_rows = [&] {
    const bf16* base = static_cast<const bf16*>(w.down) + static_cast<int64_t>(be.e) * D * F;
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) wr[r] = base + min(d0 + r, D - 1) * F;
  };
  const bool preloaded = be.e >= 0 && d0 < D && be.begin < be.end;
  if (preloaded) {
    set_rows();
    load_trip(wv, wr, lane * 8, kGemvStep, F);
  }
  pdl_wait();  // the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  if (be.e < 0 || d0 >= D) return;
  const bf16* act = static_cast<const bf16*>(ws.act);
  bf16* y = static_cast<bf16*>(ws.xy);
  for (int s0 = be.begin; s0 < be.end; s0 += TOK) {
    const int cnt = min(TOK, be.end - s0);
    float acc[kDownRows][TOK];
    // The first trip of the first pass may have gone out before the wait.
    down_rows_pass<TOK>(wr, wv, preloaded && s0 == be.begin, act + static_cast<int64_t>(s0) * 2 * F,
                        cnt, F, acc);
#pragma unroll
    for (int j = 0; j < TOK; ++j) {
      if (j >= cnt) break;
#pragma unroll
      for (int r = 0; r < kDownRows; ++r) {
        const int64_t d = d0 + r;
        if (lane == 0 && d < D)
          y[static_cast<int64_t>(s0 + j) * D + d] = from_float<bf16>(acc[r][j]);
      }
    }
  }
}

// The pass width for a step whose experts hold at most max_tokens slots each: the smallest of 1,
// 2, 4, kMoeGemvTokens that covers them (more slots take several passes).
int gemv_pass_tokens(int64_t max_tokens) {
  return max_tokens <= 1 ? 1 : max_tokens <= 2 ? 2 : max_tokens <= 4 ? 4 : kMoeGemvTokens;
}

// --- combine ---

constexpr int kCombineThreads = 256;
constexpr int kCombineRows = 8;  // expert rows loaded at once per thread (vector path)

// A token's (token, expert) pairs in the order the combine adds them: ascending expert, pairs of
// one expert (repeated ids) in their routing order, pairs without a slot (an id out of range)
// left out. In shared memory, made by one block (order_token_pairs).
struct TokenPairs {
  int e[kMoeMaxTopK], s[kMoeMaxTopK];  // as routed: expert and slot
  float w[kMoeMaxTopK];
  int slot[kMoeMaxTopK], expert[kMoeMaxTopK];  // ordered, n_valid of them
  float weight[kMoeMaxTopK];
  int n_valid;
};

// Token t's pairs into tp: fetched by one thread each, ordered by one (insertion sort of at most
// kMoeMaxTopK, stable). Every thread of the block calls it (two block barriers).
__device__ void order_token_pairs(TokenPairs& tp, const int32_t* __restrict__ ids,
                                  const float* __restrict__ weights, const MoeWorkspace& ws,
                                  int64_t t, int32_t top_k, int32_t n_experts) {
  if (threadIdx.x < top_k) {
    const int64_t p = t * top_k + threadIdx.x;
    tp.e[threadIdx.x] = ids[p];
    tp.s[threadIdx.x] = ws.pair_slot[p];
    tp.w[threadIdx.x] = weights[p];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int m = 0;
    for (int k = 0; k < top_k; ++k) {
      const int e = tp.e[k], s = tp.s[k];
      if (e < 0 || e >= n_experts || s < 0) continue;
      int i = m++;
      for (; i > 0 && tp.expert[i - 1] > e; --i) {
        tp.expert[i] = tp.expert[i - 1];
        tp.slot[i] = tp.slot[i - 1];
        tp.weight[i] = tp.weight[i - 1];
      }
      tp.expert[i] = e;
      tp.slot[i] = s;
      tp.weight[i] = tp.w[k];
    }
    tp.n_valid = m;
  }
  __syncthreads();
}

// One block per token (grid-strided): its pairs ordered (order_token_pairs), then per column the
// weighted sum in that order in fp32, plus shared. At decode sizes the kernel is a chain of memory
// latencies, so the pairs are read in parallel and, when rows allow it (vec: 8-element multiples,
// 16-byte aligned), each thread takes 8 columns with one 16-byte load per expert row, all issued
// before the sums.
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights,
                       int64_t n_tokens, int32_t top_k, int32_t n_experts, MoeWorkspace ws,
                       int64_t hidden, const bf16* __restrict__ shared, int64_t ld_shared,
                       bf16* __restrict__ out, int64_t ld_out, bool vec, bool release) {
  __shared__ TokenPairs tp;
  // The pairs come from the routing and the order, which the expert products (at least two
  // kernels, each waiting before it lets the next start) waited for: they are complete once this
  // kernel runs at all (device_utils.cuh), so the block's first token's are ordered before the
  // wait; only the expert rows come from the kernel before.
  order_token_pairs(tp, ids, weights, ws, blockIdx.x, top_k, n_experts);
  // The kernel before may still be running (launch_overlapped). With `release` (early_release())
  // the kernel after (the next layer's norm, which reads nothing before its wait) may launch at
  // once: behind this one-block kernel its launch had little to hide behind.
  pdl_wait_and_release(release);
  const bf16* y = static_cast<const bf16*>(ws.xy);
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    if (t != blockIdx.x) order_token_pairs(tp, ids, weights, ws, t, top_k, n_experts);
    const int m = tp.n_valid;
    if (vec) {
      for (int64_t d = threadIdx.x * 8; d < hidden; d += blockDim.x * 8) {
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int i0 = 0; i0 < m; i0 += kCombineRows) {  // one pass at top_k <= 8
          uint4 rows[kCombineRows];
#pragma unroll
          for (int i = 0; i < kCombineRows; ++i)
            if (i0 + i < m)
              rows[i] = *reinterpret_cast<const uint4*>(
                  y + static_cast<int64_t>(tp.slot[i0 + i]) * hidden + d);
#pragma unroll
          for (int i = 0; i < kCombineRows; ++i) {
            if (i0 + i >= m) break;
            const float w = tp.weight[i0 + i];
            float v[8];
            unpack_bf16x8(rows[i], v);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] = fmaf(w, v[j], acc[j]);
          }
        }
        if (shared != nullptr) {
          float v[8];
          unpack_bf16x8(*reinterpret_cast<const uint4*>(shared + t * ld_shared + d), v);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[j] += v[j];
        }
        *reinterpret_cast<uint4*>(out + t * ld_out + d) = pack_bf16x8(acc);
      }
    } else {
      for (int64_t d = threadIdx.x; d < hidden; d += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < m; ++i)
          acc = fmaf(tp.weight[i], to_float(y[static_cast<int64_t>(tp.slot[i]) * hidden + d]), acc);
        if (shared != nullptr) acc += to_float(shared[t * ld_shared + d]);
        out[t * ld_out + d] = from_float<bf16>(acc);
      }
    }
    __syncthreads();  // the next token's pairs and order overwrite the shared arrays
  }
}

// --- down and combine in one kernel (a step of one token) ---

// out[d] = sum over the token's pairs i (in the combine's order) of w_i * y_i[d], plus shared[d],
// with y_i = down_{e_i}[d] . act[slot_i] rounded to bf16: moe_down_kernel<1> and
// moe_combine_kernel's arithmetic, in the same order, so the output is theirs bit for bit, with
// one kernel fewer on the step's chain. Each block takes kDownRows output rows and has one warp
// per pair (blockDim = 32 top_k); each warp streams its expert's kDownRows rows as the down kernel
// does, and the block's first threads add the warps' results. As in moe_down_kernel, the pairs
// and the order are complete once this kernel runs at all, so the pairs are ordered and each
// warp's first trip of weights requested before the wait; act and shared come after it.
__global__ void __launch_bounds__(32 * kMoeFusedCombineMaxTopK)
    moe_down_combine_kernel(MoeExpertsArgs w, const int32_t* __restrict__ ids,
                            const float* __restrict__ weights, int32_t top_k, MoeWorkspace ws,
                            const bf16* __restrict__ shared, bf16* __restrict__ out) {
  __shared__ TokenPairs tp;
  __shared__ float y[kMoeFusedCombineMaxTopK][kDownRows];
  const int lane = threadIdx.x & 31, i = threadIdx.x >> 5;
  const int64_t F = w.inter, D = w.hidden;
  const int64_t d0 = static_cast<int64_t>(blockIdx.x) * kDownRows;
  const bf16* wr[kDownRows];
  uint4 wv[kDownUnroll][kDownRows];
  bool mine = false;  // this warp has a pair
  const auto set_rows = [&] {
    mine = i < tp.n_valid;
    const int e = mine ? tp.expert[i] : 0;
    const bf16* base = static_cast<const bf16*>(w.down) + static_cast<int64_t>(e) * D * F;
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) wr[r] = base + min(d0 + r, D - 1) * F;
  };
  order_token_pairs(tp, ids, weights, ws, 0, top_k, w.n_experts);
  set_rows();
  if (mine) load_trip(wv, wr, lane * 8, kGemvStep, F);
  pdl_wait();  // the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  if (mine) {
    float acc[kDownRows][1];
    down_rows_pass<1>(wr, wv, true,
                      static_cast<const bf16*>(ws.act) + static_cast<int64_t>(tp.slot[i]) * 2 * F,
                      1, F, acc);
    // The down kernel's bf16 y, as the combine reads it back (lane r stores row r).
#pragma unroll
    for (int r = 0; r < kDownRows; ++r)
      if (lane == r) y[i][r] = to_float(from_float<bf16>(acc[r][0]));
  }
  __syncthreads();
  if (threadIdx.x < kDownRows && d0 + threadIdx.x < D) {
    const int64_t d = d0 + threadIdx.x;
    float acc = 0.0f;
    for (int j = 0; j < tp.n_valid; ++j) acc = fmaf(tp.weight[j], y[j][threadIdx.x], acc);
    if (shared != nullptr) acc += to_float(shared[d]);
    out[d] = from_float<bf16>(acc);
  }
}

int64_t align256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

void launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return;
  const unsigned grid = ceil_div(a.n_tokens, kRouteWarps);
  const size_t smem = static_cast<size_t>(kRouteWarps) * 2 * a.n_experts * sizeof(float);
  launch_overlapped(moe_route_kernel, dim3(grid), dim3(kRouteWarps * 32), smem, stream, a);
  CUDA_CHECK_LAUNCH();
}

int64_t moe_order_layout_bytes(int64_t n_pairs, int64_t n_experts) {
  return 3 * align256((n_experts + 1) * 4) + 2 * align256(n_pairs * 4);
}

void moe_place_order(MoeWorkspace& ws, void* base, int64_t n_pairs, int64_t n_experts) {
  char* p = static_cast<char*>(base);
  auto take = [&](int64_t bytes) {
    auto* q = reinterpret_cast<int32_t*>(p);
    p += align256(bytes);
    return q;
  };
  ws.offsets = take((n_experts + 1) * 4);
  ws.active = take((n_experts + 1) * 4);
  ws.active_begin = take((n_experts + 1) * 4);
  ws.slot_token = take(n_pairs * 4);
  ws.pair_slot = take(n_pairs * 4);
}

int64_t moe_workspace_bytes(int64_t n_pairs, int64_t n_experts, int64_t hidden, int64_t inter) {
  return moe_order_layout_bytes(n_pairs, n_experts) + align256(n_pairs * 2 * inter * 2) +
         align256(n_pairs * hidden * 2);
}

MoeWorkspace moe_workspace_at(void* base, int64_t n_pairs, int64_t n_experts, int64_t hidden,
                              int64_t inter) {
  MoeWorkspace ws;
  moe_place_order(ws, base, n_pairs, n_experts);
  char* rest = static_cast<char*>(base) + moe_order_layout_bytes(n_pairs, n_experts);
  ws.act = rest;
  ws.xy = rest + align256(n_pairs * 2 * inter * 2);
  return ws;
}

void launch_moe_sort(const int32_t* ids, int64_t n_pairs, int32_t top_k, int32_t n_experts,
                     const MoeWorkspace& ws, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(n_pairs < INT32_MAX, "moe: too many (token, expert) pairs for one step");
  // A decode step has a handful of pairs: a small block finishes its barriers sooner.
  const int threads = n_pairs > 2048 ? 1024 : 256;
  const size_t smem = static_cast<size_t>(n_experts) * sizeof(int32_t);
  launch_overlapped(moe_sort_kernel, dim3(1), dim3(threads), smem, stream, ids,
                    static_cast<int32_t>(n_pairs), top_k, n_experts, ws);
  CUDA_CHECK_LAUNCH();
}

namespace {

// The gate|up kernel's K split at one slot a pass: the finest (1, 2, 4) that leaves every warp a
// whole trip of its rows (V2-Lite's 2048: 2; Mixtral's 4096: 4). Measured on the H200 at batch 1
// (cuda_moe_bench, docs/perf-history, sixteenth round): V2-Lite's routed experts 35.3 -> 33.2 us a
// layer, Mixtral's 176 -> 170; the down kernel (~3 trips a warp at V2-Lite's 1408) and wider passes
// lost with a split, so they have none. PAGELLM_MOE_GEMV_SPLIT=1|2|4 forces it (A/B runs, tests).
int gate_up_split(int64_t hidden) {
  static const int forced = static_cast<int>(tuning::integer("PAGELLM_MOE_GEMV_SPLIT"));
  return forced != 0 ? forced : finest_whole_trip_split(hidden, kGemvStep * kGateUpUnroll);
}

}  // namespace

void launch_moe_gate_up_gemv(const MoeExpertsArgs& w, const void* h, int64_t ldh,
                             const MoeWorkspace& ws, int64_t max_active, int64_t max_tokens,
                             cudaStream_t stream) {
  if (max_active == 0) return;
  PAGELLM_CHECK(max_active <= 65535);
  const int pass = gemv_pass_tokens(max_tokens);
  const int split = pass == 1 ? gate_up_split(w.hidden) : 1;
  const dim3 grid(ceil_div(w.inter, kGemvWarps / split * kGateUpRows),
                  static_cast<unsigned>(max_active));
  const auto* x = static_cast<const bf16*>(h);
  const auto go = [&](auto kernel) {
    launch_overlapped(kernel, grid, dim3(kGemvThreads), 0, stream, w, x, ldh, ws);
  };
  switch (pass * 10 + split) {  // (pass width, split) as two digits
    case 11:
      go(moe_gate_up_kernel<1, 1>);
      break;
    case 12:
      go(moe_gate_up_kernel<1, 2>);
      break;
    case 14:
      go(moe_gate_up_kernel<1, 4>);
      break;
    case 21:
      go(moe_gate_up_kernel<2, 1>);
      break;
    case 41:
      go(moe_gate_up_kernel<4, 1>);
      break;
    default:
      go(moe_gate_up_kernel<kMoeGemvTokens, 1>);
  }
  CUDA_CHECK_LAUNCH();
}

void launch_moe_down_gemv(const MoeExpertsArgs& w, const MoeWorkspace& ws, int64_t max_active,
                          int64_t max_tokens, cudaStream_t stream) {
  if (max_active == 0) return;
  PAGELLM_CHECK(max_active <= 65535);
  const dim3 grid(ceil_div(w.hidden, kGemvWarps * kDownRows), static_cast<unsigned>(max_active));
  switch (gemv_pass_tokens(max_tokens)) {
    case 1:
      launch_overlapped(moe_down_kernel<1>, grid, dim3(kGemvThreads), 0, stream, w, ws);
      break;
    case 2:
      launch_overlapped(moe_down_kernel<2>, grid, dim3(kGemvThreads), 0, stream, w, ws);
      break;
    case 4:
      launch_overlapped(moe_down_kernel<4>, grid, dim3(kGemvThreads), 0, stream, w, ws);
      break;
    default:
      launch_overlapped(moe_down_kernel<kMoeGemvTokens>, grid, dim3(kGemvThreads), 0, stream, w,
                        ws);
  }
  CUDA_CHECK_LAUNCH();
}

void launch_moe_down_combine_gemv(const MoeExpertsArgs& w, const int32_t* ids, const float* weights,
                                  int32_t top_k, const MoeWorkspace& ws, const RowView& shared,
                                  const RowView& out, cudaStream_t stream) {
  PAGELLM_CHECK(top_k >= 1 && top_k <= kMoeFusedCombineMaxTopK);
  PAGELLM_CHECK(out.dtype == DType::kBF16 &&
                (shared.data == nullptr || shared.dtype == DType::kBF16));
  const dim3 grid(ceil_div(w.hidden, kDownRows));
  launch_overlapped(moe_down_combine_kernel, grid, dim3(32 * top_k), 0, stream, w, ids, weights,
                    top_k, ws, static_cast<const bf16*>(shared.data), static_cast<bf16*>(out.data));
  CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(const int32_t* ids, const float* weights, int64_t n_tokens, int32_t top_k,
                        int32_t n_experts, const MoeWorkspace& ws, int64_t hidden,
                        const RowView& shared, const RowView& out, cudaStream_t stream) {
  if (n_tokens == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(n_tokens, 65535));
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = hidden % 8 == 0 && aligned16(ws.xy) && aligned16(out.data) && out.ld % 8 == 0 &&
                   (shared.data == nullptr || (aligned16(shared.data) && shared.ld % 8 == 0));
  launch_overlapped(moe_combine_kernel, dim3(grid), dim3(kCombineThreads), 0, stream, ids, weights,
                    n_tokens, top_k, n_experts, ws, hidden, static_cast<const bf16*>(shared.data),
                    shared.ld, static_cast<bf16*>(out.data), out.ld, vec, early_release());
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
