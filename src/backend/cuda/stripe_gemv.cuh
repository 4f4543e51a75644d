// What the decode GEMVs of weights kept quantized on the device (int4_gemm.cu, fp8_gemm.cu) share:
// both cut the weight into stripes of 16 rows, give each stripe to k_split warps of a block (each
// a share of the stripe's K), multiply with tensor-core m16n8k16 mma into fp32 sums laid out as
// the mma's accumulators, and finish alike: the stripe's warps add their sums in shared memory in
// a fixed order and the first stores rows r and r + 8 of the stripe for each row of x.
#pragma once

#include <atomic>
#include <cmath>

#include "backend/backend.h"
#include "backend/cuda/device_utils.cuh"

namespace pagellm::cuda::stripe_gemv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float bias_value(const void* bias, DType t, int64_t m) {
  if (bias == nullptr) return 0.0f;
  switch (t) {
    case DType::kBF16:
      return to_float(static_cast<const bf16*>(bias)[m]);
    case DType::kF16:
      return to_float(static_cast<const __half*>(bias)[m]);
    default:
      return static_cast<const float*>(bias)[m];
  }
}

// Where a stripe's sums go: out[xr, m] (+)= sum + bias[m] for the x rows below n.
struct Output {
  const void* bias;
  DType bias_dtype;
  void* out;
  int64_t ldo;
  int n;  // rows of x
};

// The stripe's k_split warps meet: each writes its sums (acc[t][i]: NT tiles of 8 x rows, the
// mma accumulator layout), the first adds them in part order (no dependence on timing) and
// stores. Every thread of the block must call it (it synchronizes when split > 1).
template <int NT, typename TOut, bool kAdd>
__device__ __forceinline__ void finish_stripe(float (&acc)[NT][4], int split, int part, bool active,
                                              int64_t stripe, const Output& o) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, q = lane & 3;
  __shared__ float red[kWarps][NT * 4][32];
  if (split > 1) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][t * 4 + i][lane] = acc[t][i];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sum = red[warp][t * 4 + i][lane];
        for (int s = 1; s < split; ++s) sum += red[warp + s][t * 4 + i][lane];
        acc[t][i] = sum;
      }
  }
  if (!active) return;
  TOut* out = static_cast<TOut*>(o.out);
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Accumulator i: row r (+ 8 for i >= 2) of the stripe, column 2q + (i & 1) of x's rows.
      const int xr = t * 8 + 2 * q + (i & 1);
      if (xr >= o.n) continue;
      const int64_t m = stripe * 16 + r + (i >> 1) * 8;
      float v = acc[t][i] + bias_value(o.bias, o.bias_dtype, m);
      TOut* dst = out + static_cast<int64_t>(xr) * o.ldo + m;
      if constexpr (kAdd) v += to_float(*dst);
      *dst = from_float<TOut>(v);
    }
}

inline int sm_count() {
  static std::atomic<int> cache[kMaxCachedDevices];
  return cached_per_device(cache, [](int dev) {
    int n = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  });
}

// A grid-stride grid of kThreads-thread blocks for n items.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

// How many warps share each stripe's K (1, 2, 4 or 8, each left at least min_units of the
// stripe's n_units): the split whose grid best fills whole waves of the blocks the SMs hold
// (blocks_per_sm each). A last wave that is mostly empty costs as much as a full one, and a grid
// short of one wave leaves loads that could be in flight unissued: Llama-3-8B's 4-bit gate|up at
// 3 blocks an SM took 68 us as 448 blocks (1.13 waves) against 31 us for down's 256 (Nsight
// Compute, H100).
inline int choose_k_split(int64_t n_stripes, int64_t n_units, int64_t min_units,
                          int blocks_per_sm) {
  const int64_t capacity = int64_t{blocks_per_sm} * sm_count();
  int split = 1;
  double best = 1e30;
  for (int s = 1; s <= kWarps && n_units >= min_units * s; s *= 2) {
    const double waves = static_cast<double>((n_stripes + kWarps / s - 1) / (kWarps / s)) /
                         static_cast<double>(capacity);
    const double cost = waves < 1.0 ? 1.0 / waves : std::ceil(waves) / waves;
    if (cost < best - 1e-9) best = cost, split = s;
  }
  return split;
}

// Calls launch(nt, out_type, add) with std::integral_constant<int, NT> for the x rows (NT tiles
// of 8: 1, 2 or 4), a value of the output's C++ type and std::bool_constant for accumulate.
template <typename F>
void dispatch_tiles(int64_t n_rows, DType out_dtype, bool accumulate, F&& launch) {
  auto with_nt = [&](auto nt) {
    auto with_out = [&](auto o) {
      if (accumulate) {
        launch(nt, o, std::true_type{});
      } else {
        launch(nt, o, std::false_type{});
      }
    };
    if (out_dtype == DType::kF32) {
      with_out(float{});
    } else {
      with_out(bf16{});
    }
  };
  if (n_rows <= 8) {
    with_nt(std::integral_constant<int, 1>{});
  } else if (n_rows <= 16) {
    with_nt(std::integral_constant<int, 2>{});
  } else {
    with_nt(std::integral_constant<int, 4>{});
  }
}

// --- grouped GEMVs: a mixture-of-experts layer's stacked experts (moe.h, stages 2 and 3) ---
//
// Grid: x over the stripes of one expert's weight, y over the active-expert slots of the MoE
// sort (active[y] the expert, -1 past the step's), z over passes of 8 NT slots of that expert's
// [offsets[e], offsets[e + 1]); a block takes passes z, z + gridDim.z, ... however many there
// are. Slot s multiplies x's row x_rows[s] (s when null) and writes the output's row s.
struct Grouped {
  const int32_t* offsets = nullptr;
  const int32_t* active = nullptr;
  const int32_t* x_rows = nullptr;
};

// Calls pass(e, first_slot, o) for each of this block's passes, o the pass's output rows (`base`
// moved to row first_slot, n its slot count). Waits for the kernel before first (the sort's
// outputs decide where the weights are, so nothing loads early); blocks without work return.
template <int NT, typename TOut, typename Pass>
__device__ __forceinline__ void for_each_pass(const Grouped& g, const Output& base, Pass pass) {
  pdl_wait();
  const int e = g.active[blockIdx.y];
  if (e < 0) return;
  const int first = g.offsets[e] + static_cast<int>(blockIdx.z) * 8 * NT, end = g.offsets[e + 1];
  for (int s0 = first; s0 < end; s0 += static_cast<int>(gridDim.z) * 8 * NT) {
    if (s0 != first) __syncthreads();  // the pass before has read its sums out of shared memory
    Output o = base;
    o.n = min(8 * NT, end - s0);
    o.out = static_cast<TOut*>(o.out) + static_cast<int64_t>(s0) * o.ldo;
    pass(e, s0, o);
  }
}

// Lane row r of tile t of a pass from first_slot: x's row of that slot (0 past the pass's n).
__device__ __forceinline__ int64_t grouped_x_row(const Grouped& g, int first_slot, int n, int t,
                                                 int r) {
  const int i = t * 8 + r, s = first_slot + i;
  return i >= n ? 0 : g.x_rows != nullptr ? g.x_rows[s] : s;
}

// The grid of a grouped launch and the k-split its waves suggest: an expert's n_stripes,
// max_active active experts at most, passes of `pass` slots over at most max_tokens an expert.
inline dim3 grouped_grid(int64_t n_stripes, int64_t max_active, int64_t max_tokens, int64_t pass,
                         int k_split) {
  PAGELLM_CHECK_MSG(max_active < 65536 && (max_tokens + pass - 1) / pass < 65536,
                    "grouped gemv: too many experts or tokens for the grid");
  return dim3(static_cast<unsigned>((n_stripes + kWarps / k_split - 1) / (kWarps / k_split)),
              static_cast<unsigned>(max_active),
              static_cast<unsigned>((max_tokens + pass - 1) / pass));
}

}  // namespace pagellm::cuda::stripe_gemv
