// Matrix-vector products for decode: out[n, M] = x[n, K] . w[M, K]^T (+ bias) with n <= 8 and bf16
// weights. At these sizes the product is a stream over the weights, so the kernel is built to keep
// as many weight bytes in flight as the memory system needs: each warp owns kGemvRows output rows,
// each lane reads 16-byte pieces of them (a warp covers 512 contiguous bytes of a row per load) and
// issues kGemvUnroll such loads per row before using any; x (n rows, a few to a few hundred KB)
// is read through L1 and reused for every row of the warp. Accumulation is fp32, reduced across the
// warp at the end. Gemm (gemm.h) picks it over cuBLASLt per shape when it measures faster. A batch
// of independent products of one shape (per-head projections) runs as one launch, an entry per
// blockIdx.y. Launched overlapped with the kernel before it (device_utils.cuh), it requests the
// first trip of its weight rows while that kernel finishes: w must not be what that
// kernel writes, which weights never are (Backend::matmul's contract).
//
// Matrices with few rows (Llama's o_proj and down: 4096 rows, a warp for every two) leave the SMs
// half empty and each warp with a long serial stream. There the warps of a block split K: the
// k_split warps of a row group take interleaved 512-byte pieces of its rows, and the group's
// partial sums meet in shared memory in a fixed order (the result does not depend on timing).
#include <algorithm>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "core/tuning.h"

namespace pagellm::cuda {
namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvRows = 2;    // output rows per warp
constexpr int kGemvUnroll = 4;  // 16-byte loads per row a lane issues before the math

__device__ __forceinline__ float bias_at(const void* bias, DType t, int64_t m) {
  if (bias == nullptr) return 0.0f;
  switch (t) {
    case DType::kBF16: return to_float(static_cast<const bf16*>(bias)[m]);
    case DType::kF16: return to_float(static_cast<const __half*>(bias)[m]);
    default: return static_cast<const float*>(bias)[m];
  }
}

// Everything a GEMV launch reads, as one argument (the template parameters pick the fusions).
struct GemvParams {
  const bf16* x;
  int64_t ldx;
  const bf16* w;
  int64_t ldw;
  const void* bias;
  DType bias_dtype;
  void* out;
  int64_t ldo;
  int64_t m_dim;  // output columns (F for SwiGLU, whose w has 2F rows)
  int64_t k_dim;
  int64_t x_batch_stride, w_batch_stride, out_batch_stride;
  float eps;    // GemvNorm::kUnit
  int k_split;  // warps sharing each row group's K: 1, 2, 4 or 8
};

// How x is normalized on the way in. kUnit (the norm weight folded into w at load): each lane sums
// the squares of its x pieces in a pass before the weights stream (x is a few KB, read from L2
// into L1, where the stream's loop finds it again), so the streaming loop is the plain product's;
// the warp's lanes cover all of K, so after the warp reduction every warp has each row's full sum
// of squares and scales its dot products by the row's 1 / rms, the same scale in every warp, so
// the output does not depend on the launch. (A norm with its weight loaded in the loop streamed
// slower: docs/perf-history, seventh and fourteenth rounds.)
enum class GemvNorm { kNone, kUnit };

__host__ __device__ constexpr bool is_swiglu(GemvEpilogue e) {
  return e == GemvEpilogue::kSwiGlu;
}

// The weight row behind a warp's acc[r] when its first output is m0: rows m0, m0 + 1 (the tail
// re-reads the last row), or for SwiGLU the gate row and its up row.
template <GemvEpilogue kEpi>
__device__ __forceinline__ int64_t weight_row(int64_t m0, int r, int64_t m_dim) {
  if constexpr (kEpi == GemvEpilogue::kSwiGlu) return m0 + r * m_dim;
  return min(m0 + r, m_dim - 1);
}

// kEpi: kStore writes x.w (+ bias); kAdd adds it to out; kSwiGlu gives each warp the rows m and
// m + F ([gate; up]) and writes silu(gate) * up to column m.
template <int N, typename TOut, GemvNorm kNorm, GemvEpilogue kEpi, int kMinBlocks>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks) gemv_kernel(const GemvParams p) {
  constexpr int kOutPerWarp = is_swiglu(kEpi) ? 1 : kGemvRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = p.k_split;
  const int part = warp & (split - 1);                  // which of the group's interleaved K pieces
  const bf16* x = p.x + blockIdx.y * p.x_batch_stride;  // batch entry (0 for a single product)
  const bf16* w = p.w + blockIdx.y * p.w_batch_stride;
  TOut* out = static_cast<TOut*>(p.out) + blockIdx.y * p.out_batch_stride;
  const int64_t m0 =
      (static_cast<int64_t>(blockIdx.x) * (kGemvWarps / split) + warp / split) * kOutPerWarp;
  // A group past the last row has nothing to read; with a split its warps still meet the others
  // at the barrier below.
  const bool active = m0 < p.m_dim;
  if (!active && split == 1) return;
  const int64_t k_dim = p.k_dim;
  float acc[kGemvRows][N];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[r][j] = 0.0f;
  float ss[N];  // a norm's: this lane's part of each row's sum of squares
#pragma unroll
  for (int j = 0; j < N; ++j) ss[j] = 0.0f;
  const bf16* wr[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) wr[r] = w + weight_row<kEpi>(m0, r, p.m_dim) * p.ldw;
  constexpr int64_t kStep = 32 * 8;          // elements a warp covers per load
  const int64_t piece_step = kStep * split;  // from one of this warp's pieces to its next
  const int64_t k_first = part * kStep + lane * 8;
  uint4 wv[kGemvUnroll][kGemvRows];  // one trip of the stream (load_trip)
  // The weights do not depend on the kernel before this one (launch_overlapped), so their loads
  // go out before the wait: the first trip's loads themselves, into the registers the loop uses,
  // so the stream's first memory round trip overlaps that kernel's end instead of following it
  // (with these early loads off in every kernel, an L2 prefetch of each row's first 1 KB here,
  // decode was 2-6% slower: docs/perf-history, thirteenth round).
  if (active) load_trip(wv, wr, k_first, piece_step, k_dim);
  pdl_wait();
  // Once every block of this grid has started, the next kernel (often the next projection's GEMV,
  // now that the norms and SwiGLU run inside the GEMVs) may launch and fetch its first weights
  // while this grid's last blocks drain.
  pdl_allow_next();

  if constexpr (kNorm == GemvNorm::kUnit) {
    // The sums of squares over the pieces the loop below will read (so a split's parts add up
    // as the products' do), their loads issued kGemvUnroll at a time.
    for (int64_t k0 = k_first; active && k0 < k_dim; k0 += piece_step * kGemvUnroll) {
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int64_t k = k0 + u * piece_step;
        if (k >= k_dim) break;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float xf[8];
          unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(x + j * p.ldx + k)), xf);
#pragma unroll
          for (int e = 0; e < 8; ++e) ss[j] = fmaf(xf[e], xf[e], ss[j]);
        }
      }
    }
  }
  for (int64_t k0 = k_first; active && k0 < k_dim; k0 += piece_step * kGemvUnroll) {
    if (k0 != k_first) load_trip(wv, wr, k0, piece_step, k_dim);
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t k = k0 + u * piece_step;
      if (k >= k_dim) break;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + j * p.ldx + k));
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) acc[r][j] += dot8(wv[u][r], xv);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if constexpr (kNorm != GemvNorm::kNone) ss[j] = warp_sum(ss[j]);
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) acc[r][j] = warp_sum(acc[r][j]);
  }
  if (split > 1) {
    // The group's first warp adds the others' sums to its own, in part order.
    __shared__ float partial[kGemvWarps][kGemvRows + 1][N];  // [.][kGemvRows]: the squares
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) partial[warp][r][j] = acc[r][j];
        partial[warp][kGemvRows][j] = ss[j];
      }
    }
    __syncthreads();
    if (part != 0 || !active) return;
    for (int q = 1; q < split; ++q) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) acc[r][j] += partial[warp + q][r][j];
        ss[j] += partial[warp + q][kGemvRows][j];
      }
    }
  }
  if (lane != 0) return;
  float scale[N];  // 1 / rms of each x row (1 without the norm)
#pragma unroll
  for (int j = 0; j < N; ++j) {
    scale[j] = 1.0f;
    if constexpr (kNorm != GemvNorm::kNone)
      scale[j] = rsqrtf(ss[j] / static_cast<float>(k_dim) + p.eps);
  }
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[r][j] *= scale[j];
  }
  if constexpr (is_swiglu(kEpi)) {
    const float bg = bias_at(p.bias, p.bias_dtype, weight_row<kEpi>(m0, 0, p.m_dim));
    const float bu = bias_at(p.bias, p.bias_dtype, weight_row<kEpi>(m0, 1, p.m_dim));
#pragma unroll
    for (int j = 0; j < N; ++j) {
      // silu(g) = g / (1 + e^-g), as activation.cu computes it.
      const float g = acc[0][j] + bg, u = acc[1][j] + bu;
      out[j * p.ldo + m0] = from_float<TOut>(g / (1.0f + expf(-g)) * u);
    }
  } else {
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      const int64_t m = m0 + r;
      if (m >= p.m_dim) break;
      const float b = bias_at(p.bias, p.bias_dtype, m);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        TOut* o = out + j * p.ldo + m;
        float v = acc[r][j] + b;
        if constexpr (kEpi == GemvEpilogue::kAdd) v += to_float(*o);
        *o = from_float<TOut>(v);
      }
    }
  }
}

// Short rows (K a multiple of 64, at most 512: DeepSeek's per-head absorbed query, K = 192). The
// kernel above covers 256 elements of one row per warp load, so such rows leave lanes idle and
// give each warp a single trip for two rows: many small warps, more than a wave of them. Here 8
// lanes share a row (C = K / 64 16-byte pieces each, a row's 8 lanes reading 128 contiguous bytes
// per piece), a warp takes 4 rows at a time and kShortQuads such quads, every weight load issued
// before any sum (before the wait), and the row's 8 partial sums meet by shuffles.
constexpr int kShortLanes = 8;  // lanes per row
constexpr int kShortQuads = 2;  // 4-row groups per warp
constexpr int kShortRowsPerWarp = 4 * kShortQuads;
constexpr int kShortMaxK = 512;

template <int N, int C, typename TOut>
__global__ void __launch_bounds__(kGemvThreads) gemv_short_kernel(const GemvParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / kShortLanes, piece = lane % kShortLanes;
  const bf16* x = p.x + blockIdx.y * p.x_batch_stride;
  const bf16* w = p.w + blockIdx.y * p.w_batch_stride;
  TOut* out = static_cast<TOut*>(p.out) + blockIdx.y * p.out_batch_stride;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp) * kShortRowsPerWarp;
  const bf16* wr[kShortQuads];
#pragma unroll
  for (int i = 0; i < kShortQuads; ++i)  // rows past the last re-read it and are not stored
    wr[i] = w + min(m0 + 4 * i + sub, p.m_dim - 1) * p.ldw + piece * 8;
  uint4 wv[kShortQuads][C];
  const auto load = [&] {
#pragma unroll
    for (int i = 0; i < kShortQuads; ++i)
#pragma unroll
      for (int c = 0; c < C; ++c) wv[i][c] = load_stream(wr[i] + c * kShortLanes * 8);
  };
  const bool active = m0 < p.m_dim;
  if (active) load();
  pdl_wait();
  pdl_allow_next();
  if (!active) return;
  float acc[kShortQuads][N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    uint4 xv[C];
#pragma unroll
    for (int c = 0; c < C; ++c)
      xv[c] =
          __ldg(reinterpret_cast<const uint4*>(x + j * p.ldx + piece * 8 + c * kShortLanes * 8));
#pragma unroll
    for (int i = 0; i < kShortQuads; ++i) {
      float d = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) d += dot8(wv[i][c], xv[c]);
#pragma unroll
      for (int o = kShortLanes / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      acc[i][j] = d;
    }
  }
  if (piece != 0) return;
#pragma unroll
  for (int i = 0; i < kShortQuads; ++i) {
    const int64_t m = m0 + 4 * i + sub;
    if (m >= p.m_dim) break;
#pragma unroll
    for (int j = 0; j < N; ++j) out[j * p.ldo + m] = from_float<TOut>(acc[i][j]);
  }
}

template <int N, typename TOut>
void launch_short(const GemvParams& p, int64_t batch, cudaStream_t stream) {
  const dim3 grid(ceil_div(p.m_dim, kGemvWarps * kShortRowsPerWarp), static_cast<unsigned>(batch));
  const auto run = [&](auto kernel) {
    launch_overlapped(kernel, grid, dim3(kGemvThreads), 0, stream, p);
  };
  switch (p.k_dim / 64) {
    case 1:
      run(gemv_short_kernel<N, 1, TOut>);
      return;
    case 2:
      run(gemv_short_kernel<N, 2, TOut>);
      return;
    case 3:
      run(gemv_short_kernel<N, 3, TOut>);
      return;
    case 4:
      run(gemv_short_kernel<N, 4, TOut>);
      return;
    case 5:
      run(gemv_short_kernel<N, 5, TOut>);
      return;
    case 6:
      run(gemv_short_kernel<N, 6, TOut>);
      return;
    case 7:
      run(gemv_short_kernel<N, 7, TOut>);
      return;
    default:
      run(gemv_short_kernel<N, 8, TOut>);
      return;
  }
}

// How a GEMV launch divides its work: the warps sharing each row group's K, and how full the
// grid's last wave is (1: every slot of it busy).
struct GemvPlan {
  int k_split = 1;
  double fill = 0.0;
};

// The plan for `groups` row groups (over all batch entries) of k_dim and `rows` rows of x, when a
// wave of the kernel is `wave` blocks; `forced` (non-zero) fixes the split. Otherwise the split
// (1, 2 or 4) whose grid fills its last wave best, the smaller on a tie, but for grids of four
// waves or more, where the last wave's idle SMs are a small part of the time (below); for one row
// of x never so fine that a warp's part of a row is less than one trip of loads (a warp with less
// waits as long for less: DeepSeek-V2-Lite's 2048-wide o_proj and shared gate|up at a split of 4
// measured 20% slower than at 1 or 2). A rule of the shape, not a timing, so that every process
// rounds the same way.
GemvPlan plan_for(int64_t groups, int64_t k_dim, int rows, int64_t wave, int forced) {
  const auto blocks = [&](int split) { return (groups * split + kGemvWarps - 1) / kGemvWarps; };
  const auto fill = [&](int split) {
    const int64_t b = blocks(split);
    return static_cast<double>(b) / static_cast<double>((b + wave - 1) / wave * wave);
  };
  if (forced != 0) return {forced, fill(forced)};
  constexpr int64_t kTrip = 32 * 8 * kGemvUnroll;  // elements of one trip of a warp's loads
  // Grids of many waves: the finest split that leaves each warp a trip at least. A warp of one
  // trip issues all its loads at once and its block ends a round trip later, so the SMs' slots
  // turn over fast: Llama-3-8B's LM head streams in 228 us at a split of 4 against 237-242 at
  // 1, gate|up with SwiGLU in 53.8 us against 57.0-58.3. With several rows of x a warp of one
  // trip is slower (q|k|v at 2, 3, 6, 7 and 8 rows: 9-15%), and one of several trips faster
  // (down at 4 and 5 rows: 41.8 and 42.1 us against 49.3 and 65.6) (H200, docs/perf-history,
  // fifteenth round).
  const int finest = finest_whole_trip_split(k_dim, kTrip);
  if (blocks(finest) >= 4 * wave && (rows == 1 || k_dim > kTrip * finest))
    return {finest, fill(finest)};
  if (blocks(1) >= 4 * wave) return {1, fill(1)};
  const int64_t least = rows == 1 ? kTrip : 32 * 8;  // a warp's least part of a row
  GemvPlan best{1, fill(1)};
  for (int split = 2; split <= 4 && k_dim >= least * split; split *= 2)
    if (fill(split) > best.fill + 0.01) best = {split, fill(split)};
  return best;
}

// One wave of `kernel`: the blocks every SM holds at once (from its registers) times the SMs.
template <typename Kernel>
int64_t wave_of(Kernel kernel) {
  int device = 0, n_sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvThreads, 0));
  return static_cast<int64_t>(std::max(per_sm, 1)) * n_sms;
}

template <int N, typename TOut, GemvNorm kNorm, GemvEpilogue kEpi, int kMinBlocks>
void launch_variant(GemvParams p, int k_split, int64_t batch, cudaStream_t stream) {
  constexpr int kOutPerWarp = is_swiglu(kEpi) ? 1 : kGemvRows;
  p.k_split = k_split;
  const int64_t rows_per_block = kGemvWarps / k_split * kOutPerWarp;
  const dim3 grid(ceil_div(p.m_dim, rows_per_block), static_cast<unsigned>(batch));
  launch_overlapped(gemv_kernel<N, TOut, kNorm, kEpi, kMinBlocks>, grid, dim3(kGemvThreads), 0,
                    stream, p);
}

// PAGELLM_GEMV_MIN_BLOCKS=1 or 4 forces one of the two one-row kernels (to measure them apart);
// 0, the default: launch_n picks.
int gemv_min_blocks_forced() {
  static const int v = static_cast<int>(tuning::integer("PAGELLM_GEMV_MIN_BLOCKS"));
  return v;
}

// One row of x has two kernels: the compiler's choice of registers (70-80, so 3 blocks an SM) and
// one capped at 64 (4 blocks an SM; a spill of 4-16 bytes). Their waves
// differ, so the same shape fills them differently; each launch takes the kernel whose plan fills
// its last wave better (the uncapped one on a tie). On the H200 the capped one with its split runs
// Llama-3-8B's down in 32.1 us against 34.5, gate|up (at the many-waves split) in 53.7 against
// 57.4 and V2-Lite's q|kv_a in 4.9 against 6.7, and the rule keeps the uncapped one for V2-Lite's
// o_proj and shared experts, where the capped one is slower (docs/perf-history, fifteenth round).
// The waves are asked of the runtime once per kernel (a process's GPUs are taken to be of one
// kind).
template <int N, typename TOut, GemvNorm kNorm, GemvEpilogue kEpi>
void launch_n(const GemvParams& p, int64_t batch, cudaStream_t stream) {
  constexpr int kOutPerWarp = is_swiglu(kEpi) ? 1 : kGemvRows;
  const int64_t groups = ceil_div(p.m_dim, kOutPerWarp) * batch;
  static const int64_t wave = wave_of(gemv_kernel<N, TOut, kNorm, kEpi, 1>);
  const GemvPlan plan = plan_for(groups, p.k_dim, N, wave, p.k_split);
  if constexpr (N == 1) {
    static const int64_t wave_capped = wave_of(gemv_kernel<N, TOut, kNorm, kEpi, 4>);
    const GemvPlan capped = plan_for(groups, p.k_dim, N, wave_capped, p.k_split);
    const int forced = gemv_min_blocks_forced();
    if (forced == 4 || (forced == 0 && capped.fill > plan.fill + 0.01))
      return launch_variant<N, TOut, kNorm, kEpi, 4>(p, capped.k_split, batch, stream);
  }
  launch_variant<N, TOut, kNorm, kEpi, 1>(p, plan.k_split, batch, stream);
}

// The bf16 kernel for a norm's epilogue, among the combinations gemv_fusion_supported allows.
template <int N, GemvNorm kNorm>
void launch_epilogue(const GemvParams& p, GemvEpilogue epi, int64_t batch, cudaStream_t stream) {
  switch (epi) {
    case GemvEpilogue::kSwiGlu:
      launch_n<N, bf16, kNorm, GemvEpilogue::kSwiGlu>(p, batch, stream);
      return;
    case GemvEpilogue::kAdd:
      if constexpr (kNorm == GemvNorm::kNone)
        launch_n<N, bf16, kNorm, GemvEpilogue::kAdd>(p, batch, stream);
      return;
    case GemvEpilogue::kStore:
      launch_n<N, bf16, kNorm, GemvEpilogue::kStore>(p, batch, stream);
      return;
  }
}

// The kernel for the fusion: plain products write f32 or bf16; the fused forms (the transformer
// block's projections) write bf16 activations. Only the combinations the backend uses exist.
template <int N>
void launch_fused(const GemvParams& p, DType out_dtype, GemvNorm norm, GemvEpilogue epi,
                  int64_t batch, cudaStream_t stream) {
  if (out_dtype == DType::kF32) {
    launch_n<N, float, GemvNorm::kNone, GemvEpilogue::kStore>(p, batch, stream);
  } else if (norm == GemvNorm::kUnit) {
    launch_epilogue<N, GemvNorm::kUnit>(p, epi, batch, stream);
  } else {
    launch_epilogue<N, GemvNorm::kNone>(p, epi, batch, stream);
  }
}

// The kernel for x's row count (1..8).
void launch_rows(int64_t n_rows, const GemvParams& p, DType out_dtype, GemvNorm norm,
                 GemvEpilogue epi, int64_t batch, cudaStream_t stream) {
  switch (n_rows) {
    case 1:
      launch_fused<1>(p, out_dtype, norm, epi, batch, stream);
      break;
    case 2:
      launch_fused<2>(p, out_dtype, norm, epi, batch, stream);
      break;
    case 3:
      launch_fused<3>(p, out_dtype, norm, epi, batch, stream);
      break;
    case 4:
      launch_fused<4>(p, out_dtype, norm, epi, batch, stream);
      break;
    case 5:
      launch_fused<5>(p, out_dtype, norm, epi, batch, stream);
      break;
    case 6:
      launch_fused<6>(p, out_dtype, norm, epi, batch, stream);
      break;
    case 7:
      launch_fused<7>(p, out_dtype, norm, epi, batch, stream);
      break;
    default:
      launch_fused<8>(p, out_dtype, norm, epi, batch, stream);
      break;
  }
}

GemvParams params_of(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                     const RowView& out, int64_t m_dim) {
  GemvParams p{};
  p.x = static_cast<const bf16*>(x.data);
  p.ldx = x.ld;
  p.w = static_cast<const bf16*>(w.data);
  p.ldw = w.ld;
  p.bias = bias;
  p.bias_dtype = bias_dtype;
  p.out = out.data;
  p.ldo = out.ld;
  p.m_dim = m_dim;
  p.k_dim = x.cols;
  return p;
}

}  // namespace

bool gemv_supported(const RowView& x, const RowView& w, const RowView& out) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return x.n_rows >= 1 && x.n_rows <= kGemvMaxRows && w.dtype == DType::kBF16 &&
         x.dtype == DType::kBF16 && (out.dtype == DType::kBF16 || out.dtype == DType::kF32) &&
         x.cols % 8 == 0 && x.ld % 8 == 0 && w.ld % 8 == 0 && aligned16(x.data) &&
         aligned16(w.data) && w.n_rows > 0;
}

bool gemv_fusion_supported(const RowView& x, const RowView& w, const RowView& out,
                           const GemvFusion& f) {
  if (!gemv_supported(x, w, out)) return false;
  const bool swiglu = is_swiglu(f.epilogue);
  if (out.n_rows != x.n_rows || out.cols != (swiglu ? w.n_rows / 2 : w.n_rows)) return false;
  if (swiglu && w.n_rows % 2 != 0) return false;
  if (f.k_split != 0 && f.k_split != 1 && f.k_split != 2 && f.k_split != 4 && f.k_split != 8)
    return false;
  if (!f.unit_norm && f.epilogue == GemvEpilogue::kStore) return true;
  // The fused forms: bf16 out; the norm with a store or SwiGLU epilogue; the add without one.
  return out.dtype == DType::kBF16 && !(f.unit_norm && f.epilogue == GemvEpilogue::kAdd);
}

void launch_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                 const RowView& out, cudaStream_t stream, const GemvFusion& fusion) {
  PAGELLM_CHECK_MSG(gemv_fusion_supported(x, w, out, fusion),
                    "gemv: unsupported shape, type, alignment or fusion");
  GemvParams p = params_of(x, w, bias, bias_dtype, out, out.cols);
  p.eps = fusion.eps;
  p.k_split = fusion.k_split;  // 0: launch_n's rule
  const GemvNorm norm = fusion.unit_norm ? GemvNorm::kUnit : GemvNorm::kNone;
  launch_rows(x.n_rows, p, out.dtype, norm, fusion.epilogue, 1, stream);
}

bool gemv_batched_supported(const RowView& x, int64_t x_batch_stride, const RowView& w,
                            int64_t w_batch_stride, const RowView& out, int64_t batch) {
  return gemv_supported(x, w, out) && batch >= 1 && batch <= 65535 && x_batch_stride >= 0 &&
         w_batch_stride >= 0 && x_batch_stride % 8 == 0 && w_batch_stride % 8 == 0;
}

void launch_gemv_batched(const RowView& x, int64_t x_batch_stride, const RowView& w,
                         int64_t w_batch_stride, const RowView& out, int64_t out_batch_stride,
                         int64_t batch, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(gemv_batched_supported(x, x_batch_stride, w, w_batch_stride, out, batch),
                    "gemv: unsupported batched shape, type or alignment");
  GemvParams p = params_of(x, w, nullptr, DType::kF32, out, w.n_rows);
  p.x_batch_stride = x_batch_stride;
  p.w_batch_stride = w_batch_stride;
  p.out_batch_stride = out_batch_stride;
  if (x.n_rows <= 2 && x.cols % 64 == 0 && x.cols <= kShortMaxK) {
    const bool f32 = out.dtype == DType::kF32;
    if (x.n_rows == 1)
      f32 ? launch_short<1, float>(p, batch, stream) : launch_short<1, bf16>(p, batch, stream);
    else
      f32 ? launch_short<2, float>(p, batch, stream) : launch_short<2, bf16>(p, batch, stream);
    return;
  }
  launch_rows(x.n_rows, p, out.dtype, GemvNorm::kNone, GemvEpilogue::kStore, batch, stream);
}

}  // namespace pagellm::cuda
