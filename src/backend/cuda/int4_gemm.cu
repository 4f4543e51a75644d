// 4-bit weights on the device (the I4G types of AWQ / GPTQ / compressed-tensors checkpoints, and
// GGUF's Q4_0, which is I4G with group 32 and zero point 8): the layout they are repacked into at
// upload, the decode product that reads them once and dequantizes in registers for tensor-core
// mma.sync, the dequantization of row slices for larger batches (cuBLASLt multiplies those), and
// random weights for `--load-format dummy`.
//
// The device layout (int4_layout in kernels.h has the sizes). Rows are cut into stripes of 16;
// a stripe is its packed values, then its group headers:
//   values:  K / 64 chunks of 512 bytes. Lane t of a warp loads the 16 bytes at t * 16 of a chunk:
//            four 32-bit words, one per m16n8k16 k-tile, each already in the order of the mma's A
//            fragment for rows r = t / 4 and r + 8, so that a few bit operations turn a word into
//            the fragment's four bf16 pairs (decode_word).
//   headers: [K / G][16] 32-bit words {f16 scale d, u8 zero z, u8 0}: x = d * (q - z).
// A stripe holds as many bytes as the same rows in the host block format, so a tensor keeps its
// size (dtype_bytes) and stripes concatenate: weights stacked by rows (fused QKV, gate|up) are
// their parts' bytes back to back.
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
#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;  // 16-byte chunk loads a lane keeps in flight (the ring's slots)

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
// into the mantissa of bf16 128 (0x4300) gives 128 + q, and subtracting 128 + z leaves q - z.
// zr is row r's zero pair, zr8 row r + 8's.
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t zr, uint32_t zr8,
                                            uint32_t (&a)[4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t v = ((w >> (4 * s)) & 0x000F000Fu) | 0x43004300u;
    a[s] = bf16x2_sub(v, (s & 1) ? zr8 : zr);
  }
}

__device__ __forceinline__ uint4 load_stream_u4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

struct Int4GemvParams {
  const bf16* x;
  int64_t ldx;
  int n;  // rows of x
  const uint8_t* w;
  int64_t n_stripes, k_dim;
  const void* bias;
  DType bias_dtype;
  void* out;
  int64_t ldo;
  int k_split;  // warps sharing a stripe's chunks: 1, 2, 4 or 8
};

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

// out[n, m] (+)= x[n, :] . w[m, :] + bias[m] for n < p.n <= 8 NT. Warp `part` of a stripe's
// k_split warps takes the chunks part, part + k_split, ...; each chunk's four k-tiles go through
// one mma per 8 rows of x (NT), into partial sums that the chunk's group scales (two groups per
// chunk at G = 32) add to the warp's accumulators. The stripe's warps then meet in shared memory
// and its first warp adds their sums in a fixed order (no dependence on timing) and stores.
template <int G, int NT, typename TOut, bool kAdd>
__global__ void __launch_bounds__(kThreads, 2) int4_gemv_kernel(const Int4GemvParams p) {
  constexpr int kGroupsPerChunk = G < 64 ? 2 : 1;
  // G = 32's two headers a chunk take the registers of two ring slots (128 a thread at most).
  constexpr int kRing = G < 64 ? kUnroll - 2 : kUnroll;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = p.k_split, part = warp & (split - 1);
  const int64_t stripe = static_cast<int64_t>(blockIdx.x) * (kWarps / split) + warp / split;
  const bool active = stripe < p.n_stripes;
  const int64_t k_dim = p.k_dim, n_chunks = k_dim / 64;
  const int64_t stripe_bytes = 8 * k_dim + 64 * (k_dim / G);
  const uint8_t* base = p.w + (active ? stripe : 0) * stripe_bytes;
  const uint4* values = reinterpret_cast<const uint4*>(base) + lane;  // chunk c at [32 c]
  const uint32_t* headers = reinterpret_cast<const uint32_t*>(base + 8 * k_dim);
  const int r = lane >> 2, q = lane & 3;

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;

  // A ring of kRing chunk loads (with their headers, rows r and r + 8 of each group) per lane:
  // a slot is refilled with its next chunk as soon as its data is taken, so kRing loads stay in
  // flight through the whole stream without a second set of registers.
  uint4 wv[kRing];
  uint32_t hv[kRing][kGroupsPerChunk][2];
  auto load_slot = [&](int u, int64_t c) {
    const bool ok = active && c < n_chunks;
    wv[u] = ok ? load_stream_u4(values + 32 * c) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int h = 0; h < kGroupsPerChunk; ++h) {
      const int64_t g = (c * 64 + 32 * h) / G;
      hv[u][h][0] = ok ? __ldg(headers + g * 16 + r) : 0u;
      hv[u][h][1] = ok ? __ldg(headers + g * 16 + r + 8) : 0u;
    }
  };
  // The weights are no kernel's output: the ring's first loads go out before the wait.
#pragma unroll
  for (int u = 0; u < kRing; ++u) load_slot(u, part + static_cast<int64_t>(u) * split);
  pdl_wait();
  pdl_allow_next();

  const int64_t trip = static_cast<int64_t>(kRing) * split;
  for (int64_t c0 = part; active && c0 < n_chunks; c0 += trip) {
#pragma unroll
    for (int u = 0; u < kRing; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * split;
      if (c >= n_chunks) break;
      const uint4 w = wv[u];
      uint32_t hd[kGroupsPerChunk][2];
#pragma unroll
      for (int h = 0; h < kGroupsPerChunk; ++h) hd[h][0] = hv[u][h][0], hd[h][1] = hv[u][h][1];
      load_slot(u, c + trip);
      // x: lane (r, q) reads row t * 8 + r, columns c * 64 + 8q .. +8 and c * 64 + 32 + 8q .. +8.
      uint4 xv[NT][2];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int xr = t * 8 + r;
        const bf16* xrow = p.x + static_cast<int64_t>(xr) * p.ldx + c * 64 + 8 * q;
        xv[t][0] = xr < p.n ? __ldg(reinterpret_cast<const uint4*>(xrow)) : make_uint4(0, 0, 0, 0);
        xv[t][1] =
            xr < p.n ? __ldg(reinterpret_cast<const uint4*>(xrow + 32)) : make_uint4(0, 0, 0, 0);
      }
      // One group per chunk (G >= 64): its four k-tiles sum unscaled, then the scale applies once;
      // at G = 32 each 32-column half is a group of its own.
#pragma unroll
      for (int hg = 0; hg < kGroupsPerChunk; ++hg) {
        const uint32_t zr = header_zero(hd[hg][0]), zr8 = header_zero(hd[hg][1]);
        float part_sum[NT][4];
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) part_sum[t][i] = 0.0f;
#pragma unroll
        for (int j = 4 / kGroupsPerChunk * hg; j < 4 / kGroupsPerChunk * (hg + 1); ++j) {
          uint32_t a[4];
          decode_word(word_of(w, j), zr, zr8, a);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const uint4& xh = xv[t][j >> 1];
            const uint32_t b0 = (j & 1) == 0 ? xh.x : xh.z, b1 = (j & 1) == 0 ? xh.y : xh.w;
            mma_bf16(part_sum[t], a, b0, b1);
          }
        }
        // The group's scales: rows r (sums 0, 1) and r + 8 (sums 2, 3).
        const float dr = header_scale(hd[hg][0]), dr8 = header_scale(hd[hg][1]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          acc[t][0] = fmaf(dr, part_sum[t][0], acc[t][0]);
          acc[t][1] = fmaf(dr, part_sum[t][1], acc[t][1]);
          acc[t][2] = fmaf(dr8, part_sum[t][2], acc[t][2]);
          acc[t][3] = fmaf(dr8, part_sum[t][3], acc[t][3]);
        }
      }
    }
  }

  // The stripe's warps meet: each writes its sums, the first adds them in part order.
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
        float s = red[warp][t * 4 + i][lane];
        for (int o = 1; o < split; ++o) s += red[warp + o][t * 4 + i][lane];
        acc[t][i] = s;
      }
  }
  if (!active) return;
  TOut* out = static_cast<TOut*>(p.out);
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Accumulator i: row r (+ 8 for i >= 2) of the stripe, column 2q + (i & 1) of x's rows.
      const int xr = t * 8 + 2 * q + (i & 1);
      if (xr >= p.n) continue;
      const int64_t m = stripe * 16 + r + (i >> 1) * 8;
      float v = acc[t][i] + bias_value(p.bias, p.bias_dtype, m);
      TOut* o = out + static_cast<int64_t>(xr) * p.ldo + m;
      if constexpr (kAdd) v += to_float(*o);
      *o = from_float<TOut>(v);
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

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
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

int sm_count() {
  static std::atomic<int> cache[kMaxCachedDevices];
  return cached_per_device(cache, [](int dev) {
    int n = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  });
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
  p.n = static_cast<int>(x.n_rows);
  p.w = static_cast<const uint8_t*>(w.data);
  p.n_stripes = w.n_rows / 16;
  p.k_dim = w.cols;
  p.bias = bias;
  p.bias_dtype = bias_dtype;
  p.out = out.data;
  p.ldo = out.ld;
  // Split each stripe's chunks between warps until the grid has about 16 warps an SM (two blocks,
  // what the registers allow: 16 x 32 lanes x kUnroll 16-byte loads keep 64 KB in flight), keeping
  // a whole ring of chunks a warp.
  const int64_t n_chunks = w.cols / 64, target = int64_t{16} * sm_count();
  int split = 1;
  while (split < kWarps && p.n_stripes * split < target && n_chunks >= kUnroll * split * 2)
    split *= 2;
  p.k_split = split;
  const dim3 grid(ceil_div(p.n_stripes, kWarps / split));
  auto launch = [&](auto g, auto nt, auto out_type, auto add) {
    launch_overlapped(int4_gemv_kernel<decltype(g)::value, decltype(nt)::value, decltype(out_type),
                                       decltype(add)::value>,
                      grid, dim3(kThreads), 0, stream, p);
  };
  dispatch_group(w.dtype, [&](auto g) {
    auto with_nt = [&](auto nt) {
      auto with_out = [&](auto o) {
        if (accumulate) {
          launch(g, nt, o, std::true_type{});
        } else {
          launch(g, nt, o, std::false_type{});
        }
      };
      if (out.dtype == DType::kF32) {
        with_out(float{});
      } else {
        with_out(bf16{});
      }
    };
    if (x.n_rows <= 8) {
      with_nt(std::integral_constant<int, 1>{});
    } else {
      with_nt(std::integral_constant<int, 2>{});
    }
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
