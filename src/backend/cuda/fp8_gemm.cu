// FP8 weights on the device (F8G128: e4m3 values with one f32 scale per 128 of a row, which
// holds every FP8 checkpoint scheme's scales: per tensor, per channel, 128 x 128 blocks): the
// layout they are repacked into at upload, the decode product that reads them once and decodes
// them in registers for tensor-core mma.sync, the quantization of activations for cuBLASLt's FP8
// GEMM (fp8_matmul.cpp) past the GEMV's rows, the dequantization of row slices where there are no
// FP8 tensor cores (sm_80), and random weights for `--load-format dummy`.
//
// The device layout (fp8_layout_fits in kernels.h says which shapes fit): a [N, K] weight is its
// values, row-major ([N][K] bytes), then its scales, [K / 128][N] f32 (x = d * e4m3(q)): what
// cuBLASLt's FP8 GEMM takes as its A operand with 128-value (VEC128_32F) scales, outer dimension
// first. A tensor keeps its size (dtype_bytes: 132 bytes a 128 values); stacked weights are
// stacked on the host before upload (WeightLoader), as the scales of the parts interleave.
//
// The GEMV cuts rows into stripes of 16, a warp (or k_split warps) a stripe. Lane t (r = t / 4,
// q = t % 4) loads 16 bytes of rows r and r + 8 at columns 16q .. 16q + 15 of each 64-column
// chunk: word j of a row holds columns 16q + 4j + {0..3}, k-tile j's A fragment for the lane (the
// mma's k slots 2q, 2q + 1, 2q + 8, 2q + 9 are those columns + 0, 1, 2, 3: a dot product may
// visit K in any order as long as the weights and x agree), and the lane's B fragments are the 32
// bytes of x at those 16 columns.
//
// Decoding: e4m3 has no bf16 conversion instruction, but its bits move into a bf16's: the sign
// to bit 15 and the 7 magnitude bits (4 exponent, 3 mantissa) to bits 10..4 give a bf16 of
// exactly 2^-120 times the value, subnormals included (e4m3's exponent bias is 7, bf16's 127), and
// one bf16x2 multiply by 2^120 makes it exact at full range, so the products are the weights'
// own, not ones pushed near fp32's underflow.
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/stripe_gemv.cuh"

namespace pagellm::cuda {
namespace {

using stripe_gemv::grid_for;
using stripe_gemv::kThreads;
using stripe_gemv::kWarps;
constexpr int kGroup = 128;  // values a scale covers
constexpr int kTrip = 2;     // groups a warp's loads run ahead (a trip in flight, one computed)

// Where a row's value or scale of a source row in a host block format starts.
template <DType kSrc>
__device__ __forceinline__ const uint8_t* source_values(const uint8_t* row, int64_t col) {
  constexpr int n = kSrc == DType::kF8B32 ? 32 : kGroup;
  return row + (col / n) * (4 + n) + 4 + col % n;
}
template <DType kSrc>
__device__ __forceinline__ float source_scale(const uint8_t* row, int64_t group) {
  // F8B32's first block of the group: the upload checked its four blocks share it.
  constexpr int blocks = kSrc == DType::kF8B32 ? kGroup / 32 : 1;
  constexpr int bytes = kSrc == DType::kF8B32 ? 36 : 4 + kGroup;
  return *reinterpret_cast<const float*>(row + group * blocks * bytes);
}

// n_rows host block rows -> rows [first_row, first_row + n_rows) of a device-layout weight of
// total_rows rows at w: one thread per 32-bit word of values or per scale.
template <DType kSrc>
__global__ void repack_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ w,
                              int64_t total_rows, int64_t first_row, int64_t n_rows,
                              int64_t k_dim) {
  const int64_t src_row = kSrc == DType::kF8B32 ? k_dim / 32 * 36 : k_dim / kGroup * (4 + kGroup);
  const int64_t words = n_rows * (k_dim / 4), groups = k_dim / kGroup;
  float* scales = reinterpret_cast<float*>(w + total_rows * k_dim);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < words + n_rows * groups; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < words) {
      const int64_t r = i / (k_dim / 4), c = 4 * (i % (k_dim / 4));
      reinterpret_cast<uint32_t*>(w + (first_row + r) * k_dim + c)[0] =
          *reinterpret_cast<const uint32_t*>(source_values<kSrc>(src + r * src_row, c));
    } else {
      const int64_t r = (i - words) / groups, g = (i - words) % groups;
      scales[g * total_rows + first_row + r] = source_scale<kSrc>(src + r * src_row, g);
    }
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Four e4m3 values (bytes 0..3 of w) -> two bf16 pairs, exact: lo holds bytes 0 and 1, hi 2 and 3
// (byte 0 / 2 in the low half). The header says how.
__device__ __forceinline__ void decode_e4m3x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t sign = w & 0x80808080u, mag = w & 0x7f7f7f7fu;
  // Signs to the top byte of each half, magnitudes to the bottom byte, then 4 bits up: the
  // magnitude (at most 0x7f) ends below bit 11 and meets no sign, so the add is an or.
  const uint32_t l = __byte_perm(mag, 0, 0x4140) * 16u + __byte_perm(sign, 0, 0x1404);
  const uint32_t h = __byte_perm(mag, 0, 0x4342) * 16u + __byte_perm(sign, 0, 0x3424);
  const uint32_t two_120 = 0x7b807b80u;  // bf16 2^120, twice
  const __nv_bfloat162 k = *reinterpret_cast<const __nv_bfloat162*>(&two_120);
  const __nv_bfloat162 a = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&l), k);
  const __nv_bfloat162 b = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&h), k);
  lo = *reinterpret_cast<const uint32_t*>(&a);
  hi = *reinterpret_cast<const uint32_t*>(&b);
}

struct Fp8GemvParams {
  const bf16* x;
  int64_t ldx;
  const uint8_t* w;
  int64_t n_stripes, k_dim;  // the weight's rows are 16 n_stripes (grouped: an expert's)
  int k_split;               // warps sharing a stripe's groups: 1, 2, 4 or 8
  stripe_gemv::Output o;
  // Grouped (kGrouped: stripe_gemv.cuh's grid over experts and passes): the experts are one
  // stacked weight of total_rows rows (its scales interleave), expert e its rows from
  // e * 16 n_stripes on.
  stripe_gemv::Grouped g;
  int64_t total_rows;
};

// out[n, m] (+)= x[n, :] . w[m, :] + bias[m] for n < o.n <= 8 NT (grouped: n the slots
// first_slot + n, x's rows x_rows of them, w's rows from first_row on, o the pass's output rows).
// Warp `part` of a stripe's k_split warps takes the 128-column groups part, part + k_split, ...,
// streaming them a trip of kTrip groups ahead (the next trip's loads go out before this one's
// math); a group's two chunks go through four mma per chunk and 8 rows of x (NT) into partial
// sums that the group's scales add to the warp's accumulators. The stripe's warps then meet
// (finish_stripe).
template <int NT, typename TOut, bool kAdd, bool kGrouped>
__device__ __forceinline__ void fp8_gemv_rows(const Fp8GemvParams& p, int64_t first_row,
                                              const stripe_gemv::Output& o, int first_slot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = p.k_split, part = warp & (split - 1);
  const int64_t stripe = static_cast<int64_t>(blockIdx.x) * (kWarps / split) + warp / split;
  const bool active = stripe < p.n_stripes;
  const int64_t k_dim = p.k_dim, n_rows = kGrouped ? p.total_rows : 16 * p.n_stripes;
  const int n_groups = static_cast<int>(k_dim / kGroup);
  const int r = lane >> 2, q = lane & 3;
  const int64_t row = first_row + (active ? stripe : 0) * 16 + r;
  // This warp's groups: part + i * split for i < mine.
  const int mine = active && part < n_groups ? (n_groups - part + split - 1) / split : 0;
  // Rows r and r + 8, columns 16q.. of the first chunk of this warp's first group.
  const uint8_t* vp = p.w + row * k_dim + part * kGroup + 16 * q;
  const int64_t v8 = 8 * k_dim;  // from row r to row r + 8
  const int vstep = kGroup * split;
  const float* sp = reinterpret_cast<const float*>(p.w + n_rows * k_dim) + part * n_rows + row;
  const int64_t sstep = split * n_rows;
  const bf16* xp = p.x + static_cast<int64_t>(r) * p.ldx + part * kGroup + 16 * q;
  const int xstep = kGroup * split;
  const int64_t xtile = 8 * p.ldx;  // from one tile of 8 rows of x to the next
  bool xrow[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xrow[t] = t * 8 + r < o.n;
  // Grouped: lane row r of tile t is slot first_slot + 8 t + r, at x's row x_rows of it.
  const bf16* xgr[kGrouped ? NT : 1];
  if constexpr (kGrouped) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
      xgr[t] = p.x + stripe_gemv::grouped_x_row(p.g, first_slot, o.n, t, r) * p.ldx +
               part * kGroup + 16 * q;
  }

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;

  // A trip: kTrip groups (i0 .. of this warp's): rows r and r + 8 of both 64-column chunks, and
  // the two rows' scales; past `mine` they are zeros, never read.
  uint4 wv[kTrip][2][2];  // [group][chunk][row r, r + 8]
  float sv[kTrip][2];
  auto load_trip = [&](int i0) {
#pragma unroll
    for (int g = 0; g < kTrip; ++g) {
      const bool ok = i0 + g < mine;
      const uint8_t* v = vp + static_cast<int64_t>(i0 + g) * vstep;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        wv[g][c][0] = ok ? load_stream(v + 64 * c) : make_uint4(0, 0, 0, 0);
        wv[g][c][1] = ok ? load_stream(v + 64 * c + v8) : make_uint4(0, 0, 0, 0);
      }
      sv[g][0] = ok ? __ldg(sp + (i0 + g) * sstep) : 0.0f;
      sv[g][1] = ok ? __ldg(sp + (i0 + g) * sstep + 8) : 0.0f;
    }
  };
  // The weights are no kernel's output: the first trip's loads go out before the wait (grouped
  // blocks have waited already).
  load_trip(0);
  if constexpr (!kGrouped) pdl_wait();
  pdl_allow_next();

  for (int i0 = 0; i0 < mine; i0 += kTrip) {
    uint4 cur[kTrip][2][2];
    float scur[kTrip][2];
#pragma unroll
    for (int g = 0; g < kTrip; ++g) {
#pragma unroll
      for (int c = 0; c < 2; ++c) cur[g][c][0] = wv[g][c][0], cur[g][c][1] = wv[g][c][1];
      scur[g][0] = sv[g][0], scur[g][1] = sv[g][1];
    }
    if (i0 + kTrip < mine) load_trip(i0 + kTrip);  // streams while this trip computes
#pragma unroll
    for (int g = 0; g < kTrip; ++g) {
      if (i0 + g >= mine) break;
      const int64_t xoff = (i0 + g) * xstep;
      float ps[NT][4];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint4 xv[NT][2];  // columns 16q .. + 7 and 16q + 8 .. + 15 of the chunk
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const bf16* xc = kGrouped ? xgr[kGrouped ? t : 0] + xoff : xp + xoff + t * xtile;
#pragma unroll
          for (int h = 0; h < 2; ++h)
            xv[t][h] = xrow[t] ? __ldg(reinterpret_cast<const uint4*>(xc + 64 * c + 8 * h))
                               : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // k-tile j: word j of rows r and r + 8
          uint32_t a[4];
          decode_e4m3x4(word_of(cur[g][c][0], j), a[0], a[2]);
          decode_e4m3x4(word_of(cur[g][c][1], j), a[1], a[3]);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const uint4& xh = xv[t][j >> 1];
            const uint32_t b0 = (j & 1) ? xh.z : xh.x, b1 = (j & 1) ? xh.w : xh.y;
            if (c == 0 && j == 0) {
              mma_bf16_first(ps[t], a, b0, b1);
            } else {
              mma_bf16(ps[t], a, b0, b1);
            }
          }
        }
      }
      // The group's scales: rows r (sums 0, 1) and r + 8 (sums 2, 3).
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        acc[t][0] = fmaf(scur[g][0], ps[t][0], acc[t][0]);
        acc[t][1] = fmaf(scur[g][0], ps[t][1], acc[t][1]);
        acc[t][2] = fmaf(scur[g][1], ps[t][2], acc[t][2]);
        acc[t][3] = fmaf(scur[g][1], ps[t][3], acc[t][3]);
      }
    }
  }

  stripe_gemv::finish_stripe<NT, TOut, kAdd>(acc, split, part, active, stripe, o);
}

template <int NT, typename TOut, bool kAdd, bool kGrouped>
__global__ void __launch_bounds__(kThreads, 2) fp8_gemv_kernel(const Fp8GemvParams p) {
  if constexpr (!kGrouped) {
    fp8_gemv_rows<NT, TOut, kAdd, false>(p, 0, p.o, 0);
  } else {
    stripe_gemv::for_each_pass<NT, TOut>(
        p.g, p.o, [&](int e, int s0, const stripe_gemv::Output& o) {
          fp8_gemv_rows<NT, TOut, kAdd, true>(p, e * 16 * p.n_stripes, o, s0);
        });
  }
}

__device__ __forceinline__ float e4m3_value(uint8_t q) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
}

// Rows [first_row, first_row + n_rows) of a device-layout weight of total_rows rows -> bf16
// row-major [n_rows, K] (row stride K), x = d * e4m3(q) in f32 (as the CPU's to_f32) rounded to
// bf16 once. One thread per 8 values.
__global__ void dequantize_layout_kernel(const uint8_t* __restrict__ w, bf16* __restrict__ out,
                                         int64_t total_rows, int64_t first_row, int64_t n_rows,
                                         int64_t k_dim) {
  const float* scales = reinterpret_cast<const float*>(w + total_rows * k_dim);
  const int64_t pieces = k_dim / 8;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_rows * pieces;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / pieces, c = 8 * (i % pieces);
    const uint2 v = *reinterpret_cast<const uint2*>(w + (first_row + r) * k_dim + c);
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v);
    const float d = scales[(c / kGroup) * total_rows + first_row + r];
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = __fmul_rn(d, e4m3_value(bytes[j]));
    *reinterpret_cast<uint4*>(out + r * k_dim + c) = pack_bf16x8(f);
  }
}

// Random F8G128 blocks in the host block format, exactly as the CPU backend's fill_random makes
// them (cpu_backend.cpp, fill_random_blocks): values uniform in [lo, hi) by index, quantized as
// from_f32 does (the block's largest magnitude to 448, round to nearest even), or with
// fixed_scale (> 0) for every block. A warp a block.
__global__ void random_blocks_kernel(uint8_t* __restrict__ out, int64_t n_blocks,
                                     int64_t first_block, uint64_t seed, float lo, float hi,
                                     float fixed_scale) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; b < n_blocks;
       b += warps) {
    float v[4], amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t at = static_cast<uint64_t>((first_block + b) * kGroup + lane + 32 * j);
      v[j] = random_uniform_at(seed, at, lo, hi);
      amax = fmaxf(amax, fabsf(v[j]));
    }
    amax = warp_max(amax);
    const float d = fixed_scale > 0.0f ? fixed_scale : __fdiv_rn(amax, 448.0f);
    uint8_t* blk = out + b * (4 + kGroup);
    if (lane == 0) *reinterpret_cast<float*>(blk) = d;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      blk[4 + lane + 32 * j] = d > 0.0f ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(
                                              __fdiv_rn(v[j], d), __NV_SATFINITE, __NV_E4M3))
                                        : 0;
  }
}

// x bf16 [n, K] -> values e4m3 [n, K] and scales [K / 128][n] f32: each row's 128-column groups
// with their largest magnitude mapped to 448, rounded to nearest even (from_f32's F8G128). A warp
// a group, four values a lane.
__global__ void quantize_rows_kernel(const bf16* __restrict__ x, int64_t ldx, int64_t n,
                                     int64_t k_dim, uint8_t* __restrict__ values,
                                     float* __restrict__ scales) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = k_dim / kGroup;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       i < n * groups; i += warps) {
    const int64_t row = i / groups, g = i % groups, c = g * kGroup + 4 * lane;
    const uint2 raw = *reinterpret_cast<const uint2*>(x + row * ldx + c);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    const float amax =
        warp_max(fmaxf(fmaxf(fabsf(lo.x), fabsf(lo.y)), fmaxf(fabsf(hi.x), fabsf(hi.y))));
    const float d = __fdiv_rn(amax, 448.0f);
    uint32_t q = 0;
    if (d > 0.0f) {
      const float v[4] = {lo.x, lo.y, hi.x, hi.y};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        q |= static_cast<uint32_t>(
                 __nv_cvt_float_to_fp8(__fdiv_rn(v[j], d), __NV_SATFINITE, __NV_E4M3))
             << (8 * j);
    }
    *reinterpret_cast<uint32_t*>(values + row * k_dim + c) = q;
    if (lane == 0) scales[g * n + row] = d;
  }
}

// x bf16 [n, K] -> values e4m3 [n, K] and scales [n] f32: each whole row with its largest
// magnitude mapped to 448 (per-token scales, for F8Row weights). A warp a row: its largest
// magnitude first, then the values, eight a lane at a time.
__global__ void quantize_whole_rows_kernel(const bf16* __restrict__ x, int64_t ldx, int64_t n,
                                           int64_t k_dim, uint8_t* __restrict__ values,
                                           float* __restrict__ scales) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < n;
       row += warps) {
    const bf16* xr = x + row * ldx;
    float amax = 0.0f;
    for (int64_t c = 8 * lane; c < k_dim; c += 256) {
      float f[8];
      unpack_bf16x8(*reinterpret_cast<const uint4*>(xr + c), f);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
    }
    amax = warp_max(amax);
    const float d = __fdiv_rn(amax, 448.0f);
    for (int64_t c = 8 * lane; c < k_dim; c += 256) {
      float f[8];
      unpack_bf16x8(*reinterpret_cast<const uint4*>(xr + c), f);
      uint32_t q[2] = {0, 0};
      if (d > 0.0f) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          q[j / 4] |= static_cast<uint32_t>(
                          __nv_cvt_float_to_fp8(__fdiv_rn(f[j], d), __NV_SATFINITE, __NV_E4M3))
                      << (8 * (j % 4));
      }
      *reinterpret_cast<uint2*>(values + row * k_dim + c) = make_uint2(q[0], q[1]);
    }
    if (lane == 0) scales[row] = d;
  }
}

}  // namespace

void launch_fp8_repack(const void* src, DType src_dtype, void* w, int64_t total_rows,
                       int64_t first_row, int64_t n_rows, int64_t cols, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(fp8_layout_fits(total_rows, cols) && first_row + n_rows <= total_rows,
                    "fp8 repack: shape does not fit");
  const int64_t items = n_rows * (cols / 4 + cols / kGroup);
  if (items == 0) return;
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(w);
  if (src_dtype == DType::kF8B32) {
    repack_kernel<DType::kF8B32>
        <<<grid_for(items), kThreads, 0, stream>>>(s, d, total_rows, first_row, n_rows, cols);
  } else {
    PAGELLM_CHECK(src_dtype == DType::kF8G128);
    repack_kernel<DType::kF8G128>
        <<<grid_for(items), kThreads, 0, stream>>>(s, d, total_rows, first_row, n_rows, cols);
  }
  CUDA_CHECK_LAUNCH();
}

void launch_fp8_dequantize(const void* w, int64_t total_rows, int64_t first_row, int64_t n_rows,
                           int64_t cols, void* out, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(fp8_layout_fits(total_rows, cols) && first_row + n_rows <= total_rows,
                    "fp8 dequantize: rows out of range");
  if (n_rows == 0) return;
  dequantize_layout_kernel<<<grid_for(n_rows * cols / 8), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(w), static_cast<bf16*>(out), total_rows, first_row, n_rows, cols);
  CUDA_CHECK_LAUNCH();
}

void launch_fp8_random(void* w, DType dtype, int64_t total_rows, int64_t first_row, int64_t n_rows,
                       int64_t cols, void* staging, uint64_t seed, float lo, float hi,
                       cudaStream_t stream) {
  const int64_t n_blocks = n_rows * cols / kGroup;
  if (n_blocks == 0) return;
  const float fixed =
      dtype == DType::kF8Row ? std::max(std::fabs(lo), std::fabs(hi)) / 448.0f : 0.0f;
  random_blocks_kernel<<<grid_for(n_blocks * 32), kThreads, 0, stream>>>(
      static_cast<uint8_t*>(staging), n_blocks, first_row * cols / kGroup, seed, lo, hi, fixed);
  CUDA_CHECK_LAUNCH();
  launch_fp8_repack(staging, DType::kF8G128, w, total_rows, first_row, n_rows, cols, stream);
}

void launch_fp8_quantize_rows(const RowView& x, bool per_row, uint8_t* values, float* scales,
                              cudaStream_t stream) {
  PAGELLM_CHECK_MSG(x.dtype == DType::kBF16 && x.cols % kGroup == 0 && x.ld % 8 == 0,
                    "fp8 quantize: x must be bf16 with whole 128-column groups");
  if (x.n_rows == 0) return;
  if (per_row) {
    quantize_whole_rows_kernel<<<grid_for(x.n_rows * 32), kThreads, 0, stream>>>(
        static_cast<const bf16*>(x.data), x.ld, x.n_rows, x.cols, values, scales);
  } else {
    const int64_t items = x.n_rows * (x.cols / kGroup);
    quantize_rows_kernel<<<grid_for(items * 32), kThreads, 0, stream>>>(
        static_cast<const bf16*>(x.data), x.ld, x.n_rows, x.cols, values, scales);
  }
  CUDA_CHECK_LAUNCH();
}

bool fp8_gemv_supported(const RowView& x, const RowView& w, const RowView& out) {
  return x.dtype == DType::kBF16 && x.n_rows >= 1 && x.n_rows <= kFp8GemvMaxRows &&
         rows_aligned16(x) && is_kept_fp8(w.dtype) && fp8_layout_fits(w.n_rows, w.cols) &&
         x.cols == w.cols && (out.dtype == DType::kBF16 || out.dtype == DType::kF32) &&
         out.n_rows == x.n_rows && out.cols == w.n_rows;
}

void launch_fp8_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                     const RowView& out, bool accumulate, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(fp8_gemv_supported(x, w, out), "fp8 gemv: unsupported operands");
  Fp8GemvParams p{};
  p.x = static_cast<const bf16*>(x.data);
  p.ldx = x.ld;
  p.w = static_cast<const uint8_t*>(w.data);
  p.n_stripes = w.n_rows / 16;
  p.k_dim = w.cols;
  p.o = {bias, bias_dtype, out.data, out.ld, static_cast<int>(x.n_rows)};
  p.k_split = stripe_gemv::choose_k_split(p.n_stripes, w.cols / kGroup, kTrip, 2);
  const dim3 grid(ceil_div(p.n_stripes, kWarps / p.k_split));
  stripe_gemv::dispatch_tiles(x.n_rows, out.dtype, accumulate, [&](auto nt, auto o, auto add) {
    launch_overlapped(
        fp8_gemv_kernel<decltype(nt)::value, decltype(o), decltype(add)::value, false>, grid,
        dim3(kThreads), 0, stream, p);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_moe_fp8_gemv(const MoeKeptGemv& g, const MoeWorkspace& ws, int64_t max_active,
                         int64_t max_tokens, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(is_kept_fp8(g.dtype) && fp8_layout_fits(g.n_experts * g.rows, g.cols) &&
                        g.rows % 16 == 0 && g.ldx % 8 == 0 &&
                        reinterpret_cast<uintptr_t>(g.x) % 16 == 0,
                    "moe fp8 gemv: experts not in the FP8 layout, or x's rows not 16-byte aligned");
  if (max_active <= 0 || max_tokens <= 0) return;
  Fp8GemvParams p{};
  p.x = static_cast<const bf16*>(g.x);
  p.ldx = g.ldx;
  p.w = static_cast<const uint8_t*>(g.w);
  p.n_stripes = g.rows / 16;
  p.k_dim = g.cols;
  p.o = {nullptr, DType::kF32, g.out, g.ldo, 0};  // o.n: each pass's own slot count
  p.g = {ws.offsets, ws.active, g.x_rows};
  p.total_rows = g.n_experts * g.rows;
  const int64_t pass = std::min<int64_t>(max_tokens, kFp8GemvMaxRows);
  p.k_split = stripe_gemv::choose_k_split(p.n_stripes * max_active, g.cols / kGroup, kTrip, 2);
  const dim3 grid = stripe_gemv::grouped_grid(p.n_stripes, max_active, max_tokens, pass, p.k_split);
  stripe_gemv::dispatch_tiles(pass, DType::kBF16, false, [&](auto nt, auto o, auto add) {
    launch_overlapped(fp8_gemv_kernel<decltype(nt)::value, decltype(o), decltype(add)::value, true>,
                      grid, dim3(kThreads), 0, stream, p);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
