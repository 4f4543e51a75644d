// The routed experts' products for steps past the grouped GEMVs' reach (moe.h, stages 2 and 3):
// one tensor-core GEMM launch for all experts, which reads each expert's slot range from the
// device-side offsets, so no count comes back to the host and the launch can be recorded.
//
//   c[s, j] = sum_k a[row(s), k] * b_e[j, k]   for every expert e and slot s in its range
//   (row(s) = a_rows[s] when given: the gate|up product gathers token rows of h on the fly)
//
// Work split: a block computes kBm slots x kBn output columns of one expert. The m-tiles of all
// experts are numbered in expert order (expert e owns ceil(count_e / kBm) of them); warp 0 finds
// the block's expert by a prefix sum over the counts, and blocks past the last tile return. The
// grid is sized for the worst case the host can know (every expert adding one partial tile), so
// it never depends on the routing. Blocks run in groups of kGroupM m-tiles swept across all
// column tiles, m fastest: the blocks resident at once share a few m-tiles of activations and a
// few column tiles of weights, which stay in L2 (m-tile-major order re-read every activation row
// once per column tile, column-major every expert's weights once per m-tile).
//
// Per block: K is walked kBk at a time through a kStages-deep cp.async pipeline (16-byte chunks,
// zero-filled past the expert's slots and past K); 8 warps as 2 x 4, each owns 64 x 32 of the
// tile as 4 x 4 bf16 mma.m16n8k16 with fp32 accumulators; operands come from XOR-swizzled shared
// memory by ldmatrix. Results are rounded to bf16 once and stored straight from the fragments.
//
// Launched overlapped with the kernel before (device_utils.cuh); it waits for it in pdl_wait()
// before touching memory (the offsets and the activations come from the kernels before).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/moe.h"

namespace pagellm::cuda {
namespace {

constexpr int kBm = 128;  // slots per block
constexpr int kBn = 128;  // output columns per block
constexpr int kBk = 64;   // K per pipeline stage (one 128-byte row of 8 chunks per operand row)
constexpr int kStages = 3;
constexpr int kGroupM = 8;  // m-tiles per raster group
constexpr int kThreads = 256;
constexpr int kWarpsN = 4;                            // warps side by side along N (2 along M)
constexpr int kWm = kBm / (kThreads / 32 / kWarpsN);  // 64 rows per warp
constexpr int kWn = kBn / kWarpsN;                    // 32 columns per warp
constexpr int kMi = kWm / 16, kNi = kWn / 8;          // mma tiles per warp: 4 x 4
constexpr int kChunks = kBk / 8;                      // 16-byte chunks per tile row
constexpr int kRowsPerPass = kThreads / kChunks;      // tile rows one pass of copies covers
constexpr int kLoadsA = kBm / kRowsPerPass, kLoadsB = kBn / kRowsPerPass;
constexpr int kStageElems = (kBm + kBn) * kBk;
constexpr int kSmemBytes = kStages * kStageElems * 2;  // 96 KiB: two blocks per SM

struct Tile {
  int expert, m0, m_end;  // expert -1: past the last tile
};

// Which expert's m-tile `t` is, with its slot range (warp 0: lanes take 32 experts at a time).
__device__ Tile find_tile(const int32_t* __restrict__ offsets, int n_experts, int t) {
  const int lane = threadIdx.x & 31;
  int before = 0;  // tiles of the experts already passed
  for (int e0 = 0; e0 < n_experts; e0 += 32) {
    const int e = e0 + lane;
    const int lo = e < n_experts ? offsets[e] : 0;
    const int hi = e < n_experts ? offsets[e + 1] : 0;
    const int tiles = (hi - lo + kBm - 1) / kBm;
    int incl = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int first = before + incl - tiles;
    const unsigned hit = __ballot_sync(0xffffffffu, tiles > 0 && t >= first && t < first + tiles);
    if (hit != 0) {
      const int src = __ffs(hit) - 1;
      const int m0 = __shfl_sync(0xffffffffu, lo + (t - first) * kBm, src);
      const int m_end = __shfl_sync(0xffffffffu, hi, src);
      return {e0 + src, m0, m_end};
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  return {-1, 0, 0};
}

__global__ void __launch_bounds__(kThreads, 2) moe_gemm_kernel(MoeGemmArgs g) {
  extern __shared__ __align__(128) unsigned char moe_gemm_smem[];
  __shared__ Tile tile_s;
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  bf16* smem = reinterpret_cast<bf16*>(moe_gemm_smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Block -> (m-tile, column tile): groups of kGroupM m-tiles, m fastest inside a group.
  const int n_tiles = static_cast<int>((g.n + kBn - 1) / kBn);
  const int group = static_cast<int>(blockIdx.x) / (kGroupM * n_tiles);
  const int in_group = static_cast<int>(blockIdx.x) % (kGroupM * n_tiles);
  const int m_tile = group * kGroupM + in_group % kGroupM;
  if (warp == 0) {
    const Tile t = find_tile(g.offsets, g.n_experts, m_tile);
    if (lane == 0) tile_s = t;
  }
  __syncthreads();
  const Tile t = tile_s;
  if (t.expert < 0) return;
  const int64_t n0 = static_cast<int64_t>(in_group / kGroupM) * kBn;

  // This thread copies chunk `c` of tile rows r0 + i * kRowsPerPass, of A and of B, every stage.
  const int c = tid % kChunks, r0 = tid / kChunks;
  const bf16* a = static_cast<const bf16*>(g.a);
  const bf16* b = static_cast<const bf16*>(g.b) + t.expert * g.b_expert_stride;
  int a_row[kLoadsA];  // the a row of each copied slot; -1 past the expert's slots
#pragma unroll
  for (int i = 0; i < kLoadsA; ++i) {
    const int s = t.m0 + r0 + i * kRowsPerPass;
    a_row[i] = s >= t.m_end ? -1 : g.a_rows != nullptr ? g.a_rows[s] : s;
  }
  // B row n0 + r0 at this thread's chunk; pass i adds i * kRowsPerPass rows.
  const bf16* b_src = b + (n0 + r0) * g.ldb + c * 8;
  const int k_tiles = static_cast<int>((g.k + kBk - 1) / kBk);
  auto load_stage = [&](int kt, int stage) {
    bf16* as = smem + stage * kStageElems;
    bf16* bs = as + kBm * kBk;
    const int64_t k0 = static_cast<int64_t>(kt) * kBk;
    const bool k_ok = k0 + c * 8 < g.k;  // K is a multiple of 8: a chunk is all in or all out
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const bool ok = a_row[i] >= 0 && k_ok;  // not read when !ok: any address serves
      cp_async_16(smem_u32(as + swz<kBk>(r0 + i * kRowsPerPass, c)),
                  ok ? a + a_row[i] * g.lda + c * 8 + k0 : a, ok);
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const bool ok = n0 + r0 + i * kRowsPerPass < g.n && k_ok;
      cp_async_16(smem_u32(bs + swz<kBk>(r0 + i * kRowsPerPass, c)),
                  ok ? b_src + i * kRowsPerPass * g.ldb + k0 : b, ok);
    }
  };

  float acc[kMi][kNi][4];
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni)
      acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;
  }

  // kStages - 1 stages in flight before the first product; one group committed per step, empty
  // ones included, so "all but the newest kStages - 2 groups" is always "stage kt has landed".
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is visible to all; stage kt - 1 is no longer read by anyone
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next, next % kStages);
    cp_async_commit();

    const bf16* as = smem + (kt % kStages) * kStageElems;
    const bf16* bs = as + kBm * kBk;
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      uint32_t af[kMi][4];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi)
        ldmatrix_x4(af[mi], smem_u32(as + swz<kBk>(wm * kWm + mi * 16 + (lane & 15),
                                                   2 * kk + (lane >> 4))));
#pragma unroll
      for (int nj = 0; nj < kNi / 2; ++nj) {
        uint32_t bf[4];  // two n8 tiles: (bf[0], bf[1]) and (bf[2], bf[3])
        ldmatrix_x4(bf, smem_u32(bs + swz<kBk>(wn * kWn + nj * 16 + (lane & 7) + ((lane >> 4) << 3),
                                               2 * kk + ((lane >> 3) & 1))));
#pragma unroll
        for (int mi = 0; mi < kMi; ++mi) {
          mma_bf16(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
          mma_bf16(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be pending; none may outlive the block

  // Fragment layout of m16n8: values 0, 1 at row lane / 4, columns 2 (lane % 4) + {0, 1}; values
  // 2, 3 eight rows below.
  bf16* cout = static_cast<bf16*>(g.c);
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int s = t.m0 + wm * kWm + mi * 16 + (lane >> 2) + half * 8;
      if (s >= t.m_end) continue;
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
        const int64_t col = n0 + wn * kWn + ni * 8 + 2 * (lane & 3);
        if (col < g.n)
          *reinterpret_cast<uint32_t*>(cout + s * g.ldc + col) =
              pack_bf16(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
      }
    }
}

}  // namespace

bool moe_gemm_supported(const MoeGemmArgs& g) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return g.n > 0 && g.k > 0 && g.k % 8 == 0 && g.n % 8 == 0 && g.lda % 8 == 0 && g.ldb % 8 == 0 &&
         g.ldc % 8 == 0 && g.b_expert_stride % 8 == 0 && aligned(g.a) && aligned(g.b) &&
         aligned(g.c);
}

void launch_moe_gemm(const MoeGemmArgs& g, int64_t max_slots, cudaStream_t stream) {
  if (max_slots <= 0) return;
  PAGELLM_CHECK_MSG(moe_gemm_supported(g), "moe gemm: unsupported sizes, strides or alignment");
  CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes));
  // Every expert with slots adds at most one partial tile to the full ones; whole raster groups.
  const int64_t m_tiles = (max_slots + kBm - 1) / kBm + std::min<int64_t>(g.n_experts, max_slots);
  const int64_t blocks = (m_tiles + kGroupM - 1) / kGroupM * kGroupM * ((g.n + kBn - 1) / kBn);
  PAGELLM_CHECK_MSG(blocks < INT32_MAX, "moe gemm: too many slots");
  launch_overlapped(moe_gemm_kernel, static_cast<unsigned>(blocks), dim3(kThreads), kSmemBytes,
                    stream, g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
