// 4-bit weights on the device (the I4G types of AWQ / GPTQ / compressed-tensors checkpoints, and
// GGUF's Q4_0, which is I4G with group 32 and zero point 8): the layout they are repacked into at
// upload, the decode product that reads them once and dequantizes in registers for tensor-core
// mma.sync, the dequantization of row slices for larger batches (cuBLASLt multiplies those), and
// random weights for `--load-format dummy`.
//
// The device layout (int4_layout_fits in kernels.h says which shapes fit). Rows are cut into
// stripes of 16; a stripe is its packed values, then its group headers:
//   values:  K / 64 chunks of 512 bytes. Lane t of a warp loads the 16 bytes at t * 16 of a chunk:
//            four 32-bit words, one per m16n8k16 k-tile, each already in the order of the mma's A
//            fragment for rows r = t / 4 and r + 8, so that a few bit operations turn a word into
//            the fragment's four bf16 pairs (decode_word).
//   headers: [K / G][16] 32-bit words {f16 scale d, u8 zero z, u8 0}: x = d * (q - z).
// A stripe holds as many bytes as the same rows in the host block format, so a tensor keeps its
// size (dtype_bytes). Weights stacked by rows (fused QKV, gate|up) are stacked on the host before
// upload (WeightLoader), as FP8's layout needs too.
//
// Which columns a lane's word holds: a dot product may visit K in any order as long as the
// weights and x agree, so the k-tiles of a chunk are not 16 consecutive columns. Lane t, q = t % 4,
// k-tile j covers the columns c = 32 (j / 2) + 8 q + 4 (j % 2) + {0, 1, 2, 3}: each lane reads x as
// two 16-byte pieces per chunk (columns 8q.. and 32 + 8q..), and the two k-tiles of a 32-column
// half lie in one group even at G = 32, so a group's scale multiplies whole mma results.
// In the mma's terms (A row-major 16x16, B column-major 16x8), lane t's A slots (row, k) are
// (r, 2q), (r, 2q+1) | (r+8, 2q), (r+8, 2q+1) | (r, 2q+8), (r, 2q+9) | (r+8, 2q+8), (r+8, 2q+9),
// its B slots (k, n) (2q, r), (2q+1, r) | (2q+8, r), (2q+9, r); slots 2q, 2q+1, 2q+8, 2q+9 are the
// columns c + 0, 1, 2, 3. A word's nibble i (bits 4i..4i+3) is
//   i:      0      1       2       3       4       5       6       7
//   value:  (r,c)  (r+8,c) (r,c+2) (r+8,c+2) (r,c+1) (r+8,c+1) (r,c+3) (r+8,c+3)
// so that (word >> 4s) & 0x000F000F holds A register s's pair in its two halves.
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
constexpr int kUnroll = 4;  // 16-byte chunk loads of a lane a trip (a trip in flight, one computed)

// Row offset (0 or 8) and column offset (0..3) within a lane's k-tile of nibble i of its word.
__host__ __device__ constexpr int nibble_row(int i) {
  return (i & 1) * 8;
}
__host__ __device__ constexpr int nibble_col(int i) {
  return ((i >> 1) & 1) * 2 + (i >> 2);
}

// The first column of lane q's k-tile j within its chunk.
__device__ __forceinline__ int tile_col(int q, int j) {
  return 32 * (j >> 1) + 8 * q + 4 * (j & 1);
}

// The 4-bit value at (row, k) of a source row in a host block format.
template <DType kSrc, int G>
__device__ __forceinline__ int source_nibble(const uint8_t* row, int64_t k) {
  if constexpr (kSrc == DType::kQ4_0) {  // 18-byte blocks of 32: f16 d, then Q4_0's nibbles
    const uint8_t* b = row + (k / 32) * 18 + 2;
    const int j = static_cast<int>(k % 32);
    return j < 16 ? (b[j] & 15) : (b[j - 16] >> 4);
  } else {  // I4G: f16 d, u8 z, pad, then 32-value chunks laid out as Q4_0's
    const uint8_t* b = row + (k / G) * (4 + G / 2) + 4;
    const int j = static_cast<int>(k % G);
    const uint8_t byte = b[16 * (j / 32) + (j & 15)];
    return (j & 31) < 16 ? (byte & 15) : (byte >> 4);
  }
}

// Host block rows -> device layout: one thread per 32-bit word of values or per header.
template <DType kSrc, int G>
__global__ void repack_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                              int64_t n_stripes, int64_t k_dim) {
  const int64_t src_row = kSrc == DType::kQ4_0 ? k_dim / 32 * 18 : k_dim / G * (4 + G / 2);
  const int64_t words = 2 * k_dim;           // value words of a stripe: 16 K / 2 / 4 bytes
  const int64_t headers = 16 * (k_dim / G);  // header words of a stripe
  const int64_t per_stripe = words + headers;
  const int64_t stripe_bytes = 4 * per_stripe;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n_stripes * per_stripe; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i / per_stripe, w = i % per_stripe;
    uint32_t out = 0;
    if (w < words) {
      const int64_t chunk = w / 128;
      const int lane = static_cast<int>(w % 128) / 4, j = static_cast<int>(w % 4);
      const int r = lane / 4, q = lane % 4;
      const int64_t c = chunk * 64 + tile_col(q, j);
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const uint8_t* row = src + (s * 16 + r + nibble_row(n)) * src_row;
        out |= static_cast<uint32_t>(source_nibble<kSrc, G>(row, c + nibble_col(n))) << (4 * n);
      }
    } else {
      const int64_t g = (w - words) / 16;
      const int r = static_cast<int>((w - words) % 16);
      const uint8_t* row = src + (s * 16 + r) * src_row;
      if constexpr (kSrc == DType::kQ4_0) {
        const uint8_t* b = row + g * 18;
        out = b[0] | (b[1] << 8) | (8u << 16);
      } else {
        const uint8_t* b = row + g * (4 + G / 2);
        out = b[0] | (b[1] << 8) | (static_cast<uint32_t>(b[2]) << 16);
      }
    }
    reinterpret_cast<uint32_t*>(dst + s * stripe_bytes)[w] = out;
  }
}

// A header's zero point as a bf16 pair {128 + z, 128 + z} (z < 128) and its scale.
__device__ __forceinline__ uint32_t header_zero(uint32_t h) {
  return (0x4300u | ((h >> 16) & 0x7fu)) * 0x00010001u;
}
__device__ __forceinline__ float header_scale(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu)));
}

__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {
  const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&d);
}

// A word of 8 nibbles -> the mma's A fragment of (q - z) as exact bf16 integers: or-ing a nibble
// into the mantissa of bf16 128 (0x4300) gives 128 + q, two values per bit operation, and
// subtracting 128 + z leaves q - z. zr is row r's zero pair, zr8 row r + 8's.
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t zr, uint32_t zr8,
                                            uint32_t (&a)[4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t v = ((w >> (4 * s)) & 0x000F000Fu) | 0x43004300u;
    a[s] = bf16x2_sub(v, (s & 1) ? zr8 : zr);
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

struct Int4GemvParams {
  const bf16* x;
  int64_t ldx;
  const uint8_t* w;
  int64_t n_stripes, k_dim;
  int k_split;  // warps sharing a stripe's chunks: 1, 2, 4 or 8
  stripe_gemv::Output o;
  // Grouped (kGrouped: stripe_gemv.cuh's grid over experts and passes): expert e's weight starts
  // e * expert_bytes into w.
  stripe_gemv::Grouped g;
  int64_t expert_bytes;
};

// Blocks of the GEMV an SM holds: three where the registers allow it (one tile of x rows, one
// header a chunk: 80 registers a thread with 8 bytes spilled), else two.
__host__ __device__ constexpr int int4_gemv_blocks(int g, int nt) { return nt == 1 && g >= 64 ? 3 : 2; }

// out[n, m] (+)= x[n, :] . w[m, :] + bias[m] for n < o.n <= 8 NT (grouped: n the slots
// first_slot + n, x's rows x_rows of them, w the expert's weight, o the pass's output rows).
// Warp `part` of a stripe's k_split warps takes the chunks part, part + k_split, ..., streaming
// them a trip of kUnroll chunks ahead (the next trip's loads go out before this one's math); each
// chunk's k-tiles go through one mma per 8 rows of x (NT) into partial sums that the group's scale
// adds to the warp's accumulators. The stripe's warps then meet in shared memory and its first
// warp adds their sums in a fixed order (finish_stripe) and stores. The loop walks pointers (a
// chunk is a fixed step in the weights, headers and x), which keeps the instructions a chunk few:
// the kernel issues ~50% of the cycles at full speed (Nsight Compute), so every one counts.
template <int G, int NT, typename TOut, bool kAdd, bool kGrouped>
__device__ __forceinline__ void int4_gemv_rows(const Int4GemvParams& p, const uint8_t* w,
                                               const stripe_gemv::Output& o, int first_slot) {
  constexpr int kGroupsPerChunk = G < 64 ? 2 : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = p.k_split, part = warp & (split - 1);
  const int64_t stripe = static_cast<int64_t>(blockIdx.x) * (kWarps / split) + warp / split;
  const bool active = stripe < p.n_stripes;
  const int k_dim = static_cast<int>(p.k_dim), n_chunks = k_dim / 64;
  const int64_t stripe_bytes = 8 * static_cast<int64_t>(k_dim) + 64 * (k_dim / G);
  const int r = lane >> 2, q = lane & 3;
  const uint8_t* base = w + (active ? stripe : 0) * stripe_bytes;
  // This warp's chunks: part + i * split for i < mine.
  const int mine = active && part < n_chunks ? (n_chunks - part + split - 1) / split : 0;
  const uint4* vp = reinterpret_cast<const uint4*>(base) + lane + 32 * part;
  const int vstep = 32 * split;  // uint4 from one of this warp's chunks to its next
  // Header word of row r of the group of column c: hp + (c / G) * 16.
  const uint32_t* hp = reinterpret_cast<const uint32_t*>(base + 8 * static_cast<int64_t>(k_dim)) + r;
  const bf16* xp = p.x + static_cast<int64_t>(r) * p.ldx + part * 64 + 8 * q;
  const int xstep = 64 * split;
  const int64_t xtile = 8 * p.ldx;  // from one tile of 8 rows of x to the next
  bool xrow[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xrow[t] = t * 8 + r < o.n;
  // Grouped: lane row r of tile t is slot first_slot + 8 t + r, at x's row x_rows of it.
  const bf16* xg[kGrouped ? NT : 1];
  if constexpr (kGrouped) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
      xg[t] =
          p.x + stripe_gemv::grouped_x_row(p.g, first_slot, o.n, t, r) * p.ldx + part * 64 + 8 * q;
  }

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;

  // A trip: kUnroll chunks (i0 .. i0 + kUnroll - 1 of this warp's) with their headers (rows r and
  // r + 8 of each group); past `mine` they are zeros, never read.
  uint4 wv[kUnroll];
  uint32_t hv[kUnroll][kGroupsPerChunk][2];
  auto load_trip = [&](int i0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool ok = i0 + u < mine;
      wv[u] = ok ? load_stream(vp + (i0 + u) * vstep) : make_uint4(0, 0, 0, 0);
      const uint32_t* h = hp + (part + (i0 + u) * split) * 64 / G * 16;
#pragma unroll
      for (int g = 0; g < kGroupsPerChunk; ++g) {
        hv[u][g][0] = ok ? __ldg(h + 16 * g) : 0u;
        hv[u][g][1] = ok ? __ldg(h + 16 * g + 8) : 0u;
      }
    }
  };
  // The weights are no kernel's output: the first trip's loads go out before the wait (grouped
  // blocks have waited already).
  load_trip(0);
  if constexpr (!kGrouped) pdl_wait();
  pdl_allow_next();

  for (int i0 = 0; i0 < mine; i0 += kUnroll) {
    uint4 cur[kUnroll];
    uint32_t hcur[kUnroll][kGroupsPerChunk][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      cur[u] = wv[u];
#pragma unroll
      for (int g = 0; g < kGroupsPerChunk; ++g) hcur[u][g][0] = hv[u][g][0], hcur[u][g][1] = hv[u][g][1];
    }
    if (i0 + kUnroll < mine) load_trip(i0 + kUnroll);  // streams while this trip computes
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i0 + u >= mine) break;
      const int64_t xoff = (i0 + u) * xstep;
      // x: lane (r, q) reads row t * 8 + r, columns 8q .. + 8 of each 32-column half of the
      // chunk, the B fragments of the half's two k-tiles (k-tile j: words 2 (j % 2), + 1).
      uint4 xv[NT][2];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const bf16* xc = kGrouped ? xg[kGrouped ? t : 0] + xoff : xp + xoff + t * xtile;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          xv[t][h] =
              xrow[t] ? __ldg(reinterpret_cast<const uint4*>(xc + 32 * h)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // the chunk's two 32-column halves: independent sums
        const int g = kGroupsPerChunk == 2 ? h : 0;
        const uint32_t zr = header_zero(hcur[u][g][0]), zr8 = header_zero(hcur[u][g][1]);
        uint32_t a0[4], a1[4];
        decode_word(word_of(cur[u], 2 * h), zr, zr8, a0);
        decode_word(word_of(cur[u], 2 * h + 1), zr, zr8, a1);
        float ps[NT][4];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          mma_bf16_first(ps[t], a0, xv[t][h].x, xv[t][h].y);
          mma_bf16(ps[t], a1, xv[t][h].z, xv[t][h].w);
        }
        // The group's scales: rows r (sums 0, 1) and r + 8 (sums 2, 3).
        const float dr = header_scale(hcur[u][g][0]), dr8 = header_scale(hcur[u][g][1]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          acc[t][0] = fmaf(dr, ps[t][0], acc[t][0]);
          acc[t][1] = fmaf(dr, ps[t][1], acc[t][1]);
          acc[t][2] = fmaf(dr8, ps[t][2], acc[t][2]);
          acc[t][3] = fmaf(dr8, ps[t][3], acc[t][3]);
        }
      }
    }
  }

  stripe_gemv::finish_stripe<NT, TOut, kAdd>(acc, split, part, active, stripe, o);
}

template <int G, int NT, typename TOut, bool kAdd, bool kGrouped>
__global__ void __launch_bounds__(kThreads, int4_gemv_blocks(G, NT))
    int4_gemv_kernel(const Int4GemvParams p) {
  if constexpr (!kGrouped) {
    int4_gemv_rows<G, NT, TOut, kAdd, false>(p, p.w, p.o, 0);
  } else {
    stripe_gemv::for_each_pass<NT, TOut>(
        p.g, p.o, [&](int e, int s0, const stripe_gemv::Output& o) {
          int4_gemv_rows<G, NT, TOut, kAdd, true>(p, p.w + e * p.expert_bytes, o, s0);
        });
  }
}

// Rows [0, n_stripes * 16) of a device-layout weight -> bf16 row-major [rows, K] (row stride K),
// x = d * (q - z) rounded to bf16 once. One thread per lane piece (16 bytes: 32 values of rows r
// and r + 8), so a warp stores 64 contiguous bytes of each of 16 rows per chunk half.
template <int G>
__global__ void dequantize_layout_kernel(const uint8_t* __restrict__ w, bf16* __restrict__ out,
                                         int64_t n_stripes, int64_t k_dim) {
  const int64_t stripe_bytes = 8 * k_dim + 64 * (k_dim / G);
  const int64_t pieces = k_dim / 2;  // 32 lanes x K / 64 chunks
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n_stripes * pieces; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i / pieces, pi = i % pieces, chunk = pi / 32;
    const int lane = static_cast<int>(pi % 32), r = lane / 4, q = lane % 4;
    const uint8_t* base = w + s * stripe_bytes;
    const uint4 v = reinterpret_cast<const uint4*>(base)[pi];
    const uint32_t* headers = reinterpret_cast<const uint32_t*>(base + 8 * k_dim);
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // k-tiles 2 half, 2 half + 1: 8 columns
      const int64_t c = chunk * 64 + 32 * half + 8 * q;
      const int64_t g = c / G;
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {  // rows r and r + 8
        const uint32_t h = headers[g * 16 + r + 8 * rr];
        const float d = header_scale(h);
        const int z = static_cast<int>((h >> 16) & 0xff);
        float f[8];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const uint32_t word = word_of(v, 2 * half + jj);
#pragma unroll
          for (int n = 0; n < 8; ++n)
            if (nibble_row(n) == 8 * rr)
              f[4 * jj + nibble_col(n)] =
                  __fmul_rn(d, static_cast<float>(static_cast<int>((word >> (4 * n)) & 15) - z));
        }
        *reinterpret_cast<uint4*>(out + (s * 16 + r + 8 * rr) * k_dim + c) = pack_bf16x8(f);
      }
    }
  }
}

// Random I4G blocks in the host block format, exactly as the CPU backend's fill_random makes them
// (cpu_backend.cpp, fill_random_blocks): every byte random, then each group's header set so that
// 0..15 maps onto [lo, hi].
template <int G>
__global__ void random_blocks_kernel(uint8_t* __restrict__ out, int64_t n_blocks,
                                     int64_t first_block, uint64_t seed, float lo, float hi) {
  constexpr int kBytes = 4 + G / 2;
  const float step = (hi - lo) / 15.0f;
  const int z = min(15, max(0, static_cast<int>(roundf(-lo / step))));  // lround's rounding
  const unsigned short d = __half_as_ushort(__float2half_rn(step));
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n_blocks * kBytes; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % kBytes);
    const uint64_t at = static_cast<uint64_t>(first_block * kBytes + i);
    uint8_t v = static_cast<uint8_t>(random_uniform_at(seed, at, 0.0f, 256.0f));
    if (j == 0) v = static_cast<uint8_t>(d & 0xff);
    if (j == 1) v = static_cast<uint8_t>(d >> 8);
    if (j == 2) v = static_cast<uint8_t>(z);
    if (j == 3) v = 0;
    out[i] = v;
  }
}

// Calls f with std::integral_constant<int, G> for an I4G type's group size.
template <typename F>
void dispatch_group(DType t, F&& f) {
  switch (t) {
    case DType::kI4G32:
      f(std::integral_constant<int, 32>{});
      return;
    case DType::kI4G64:
      f(std::integral_constant<int, 64>{});
      return;
    case DType::kI4G128:
      f(std::integral_constant<int, 128>{});
      return;
    default:
      PAGELLM_CHECK_MSG(false, "int4: not a device 4-bit type");
  }
}

}  // namespace

void launch_int4_repack(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                        int64_t n_rows, int64_t cols, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(int4_layout_fits(dst_dtype, n_rows, cols), "int4 repack: shape does not fit");
  const int64_t n_stripes = n_rows / 16;
  const int64_t words = n_stripes * (2 * cols + 16 * (cols / int4_group(dst_dtype)));
  if (words == 0) return;
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (src_dtype == DType::kQ4_0) {
    PAGELLM_CHECK(dst_dtype == DType::kI4G32);
    repack_kernel<DType::kQ4_0, 32>
        <<<grid_for(words), kThreads, 0, stream>>>(s, d, n_stripes, cols);
  } else {
    PAGELLM_CHECK(src_dtype == dst_dtype);
    dispatch_group(src_dtype, [&](auto g) {
      repack_kernel<DType::kI4G128, decltype(g)::value>
          <<<grid_for(words), kThreads, 0, stream>>>(s, d, n_stripes, cols);
    });
  }
  CUDA_CHECK_LAUNCH();
}

void launch_int4_dequantize(const void* w, DType dtype, int64_t first_row, int64_t n_rows,
                            int64_t cols, void* out, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(first_row % 16 == 0 && n_rows % 16 == 0 && cols % 64 == 0,
                    "int4 dequantize: rows must be whole stripes");
  const int64_t n_stripes = n_rows / 16;
  if (n_stripes == 0) return;
  const auto* base = static_cast<const uint8_t*>(w) + dtype_bytes(dtype, first_row * cols);
  dispatch_group(dtype, [&](auto g) {
    dequantize_layout_kernel<decltype(g)::value>
        <<<grid_for(n_stripes * 2 * cols), kThreads, 0, stream>>>(base, static_cast<bf16*>(out),
                                                                  n_stripes, cols);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_int4_random(void* data, DType dtype, int64_t n_rows, int64_t cols, int64_t first_block,
                        void* staging, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  const int64_t n_blocks = n_rows * cols / int4_group(dtype);
  if (n_blocks == 0) return;
  dispatch_group(dtype, [&](auto g) {
    constexpr int G = decltype(g)::value;
    random_blocks_kernel<G><<<grid_for(n_blocks * (4 + G / 2)), kThreads, 0, stream>>>(
        static_cast<uint8_t*>(staging), n_blocks, first_block, seed, lo, hi);
  });
  CUDA_CHECK_LAUNCH();
  launch_int4_repack(staging, dtype, data, dtype, n_rows, cols, stream);
}

bool int4_gemv_supported(const RowView& x, const RowView& w, const RowView& out) {
  return x.dtype == DType::kBF16 && x.n_rows >= 1 && x.n_rows <= kInt4GemvMaxRows &&
         rows_aligned16(x) && int4_layout_fits(w.dtype, w.n_rows, w.cols) && x.cols == w.cols &&
         (out.dtype == DType::kBF16 || out.dtype == DType::kF32) && out.n_rows == x.n_rows &&
         out.cols == w.n_rows;
}

void launch_int4_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                      const RowView& out, bool accumulate, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(int4_gemv_supported(x, w, out), "int4 gemv: unsupported operands");
  Int4GemvParams p{};
  p.x = static_cast<const bf16*>(x.data);
  p.ldx = x.ld;
  p.w = static_cast<const uint8_t*>(w.data);
  p.n_stripes = w.n_rows / 16;
  p.k_dim = w.cols;
  p.o = {bias, bias_dtype, out.data, out.ld, static_cast<int>(x.n_rows)};
  // At least a trip of chunks a warp.
  const int blocks = int4_gemv_blocks(static_cast<int>(int4_group(w.dtype)), x.n_rows <= 8 ? 1 : 2);
  p.k_split = stripe_gemv::choose_k_split(p.n_stripes, w.cols / 64, kUnroll, blocks);
  const dim3 grid(ceil_div(p.n_stripes, kWarps / p.k_split));
  dispatch_group(w.dtype, [&](auto g) {
    stripe_gemv::dispatch_tiles(x.n_rows, out.dtype, accumulate, [&](auto nt, auto o, auto add) {
      launch_overlapped(int4_gemv_kernel<decltype(g)::value, decltype(nt)::value, decltype(o),
                                         decltype(add)::value, false>,
                        grid, dim3(kThreads), 0, stream, p);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void launch_moe_int4_gemv(const MoeKeptGemv& g, const MoeWorkspace& ws, int64_t max_active,
                          int64_t max_tokens, cudaStream_t stream) {
  PAGELLM_CHECK_MSG(int4_layout_fits(g.dtype, g.rows, g.cols) && g.ldx % 8 == 0 &&
                        reinterpret_cast<uintptr_t>(g.x) % 16 == 0,
                    "moe int4 gemv: experts not in the 4-bit layout, or x's rows not 16-byte "
                    "aligned");
  if (max_active <= 0 || max_tokens <= 0) return;
  Int4GemvParams p{};
  p.x = static_cast<const bf16*>(g.x);
  p.ldx = g.ldx;
  p.w = static_cast<const uint8_t*>(g.w);
  p.n_stripes = g.rows / 16;
  p.k_dim = g.cols;
  p.o = {nullptr, DType::kF32, g.out, g.ldo, 0};  // o.n: each block's own slot count
  p.g = {ws.offsets, ws.active, g.x_rows};
  p.expert_bytes = dtype_bytes(g.dtype, g.rows * g.cols);
  // An expert's slots in passes of up to kInt4GemvMaxRows; the tile count of the largest pass.
  const int64_t pass = std::min<int64_t>(max_tokens, kInt4GemvMaxRows);
  const int blocks = int4_gemv_blocks(static_cast<int>(int4_group(g.dtype)), pass <= 8 ? 1 : 2);
  // The waves as if every slot's expert had its own stripes (the active experts' count is the
  // device's to know; max_active bounds it).
  p.k_split = stripe_gemv::choose_k_split(p.n_stripes * max_active, g.cols / 64, kUnroll, blocks);
  const dim3 grid = stripe_gemv::grouped_grid(p.n_stripes, max_active, max_tokens, pass, p.k_split);
  dispatch_group(g.dtype, [&](auto gs) {
    stripe_gemv::dispatch_tiles(pass, DType::kBF16, false, [&](auto nt, auto o, auto add) {
      launch_overlapped(int4_gemv_kernel<decltype(gs)::value, decltype(nt)::value, decltype(o),
                                         decltype(add)::value, true>,
                        grid, dim3(kThreads), 0, stream, p);
    });
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
