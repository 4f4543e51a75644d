// Weight conversion on upload: plain float types into each other, and block formats (GGUF's
// Q8_0, Q4_0, Q4_1; the I4G types of AWQ / GPTQ checkpoints) dequantized to a float type. Values
// match core/dtype.cpp's to_f32 exactly (same operations, no FMA contraction) before the final
// rounding to the destination type.
#include <type_traits>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 256;

template <typename TIn, typename TOut>
__global__ void convert_kernel(const TIn* __restrict__ src, TOut* __restrict__ dst, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_float<TOut>(to_float(src[i]));
}

__device__ __forceinline__ float load_f16(const uint8_t* p) {
  const unsigned short bits = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}

// One thread per output value; `n` values in total (a whole number of blocks of kElems values in
// kBytes bytes: block_elems / block_bytes of kFormat, passed in from the host side).
template <DType kFormat, int kElems, int kBytes, typename TOut>
__global__ void dequantize_kernel(const uint8_t* __restrict__ src, TOut* __restrict__ dst,
                                  int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t* b = src + (i / kElems) * kBytes;
    const int j = static_cast<int>(i % kElems);
    const float d = load_f16(b);
    float v;
    if constexpr (kFormat == DType::kQ8_0) {  // d * q
      v = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(b[2 + j])));
    } else if constexpr (kFormat == DType::kQ4_0) {  // d * (q - 8), low nibbles first
      const uint8_t byte = b[2 + (j & 15)];
      const int q = j < 16 ? (byte & 0xf) : (byte >> 4);
      v = __fmul_rn(d, static_cast<float>(q - 8));
    } else if constexpr (kFormat == DType::kQ4_1) {  // d * q + m
      const float m = load_f16(b + 2);
      const uint8_t byte = b[4 + (j & 15)];
      const int q = j < 16 ? (byte & 0xf) : (byte >> 4);
      v = __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);
    } else {  // I4G: d * (q - z), each 32-value chunk laid out as Q4_0's
      const uint8_t byte = b[4 + 16 * (j / 32) + (j & 15)];
      const int q = (j & 31) < 16 ? (byte & 0xf) : (byte >> 4);
      v = __fmul_rn(d, static_cast<float>(q - b[2]));
    }
    dst[i] = from_float<TOut>(v);
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

void launch_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float_type(src_dtype, [&](auto ti) {
    using TIn = decltype(ti);
    dispatch_float_type(dst_dtype, [&](auto to) {
      using TOut = decltype(to);
      convert_kernel<TIn, TOut><<<grid_for(n), kThreads, 0, stream>>>(
          static_cast<const TIn*>(src), static_cast<TOut*>(dst), n);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_dequantize(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                       int64_t n_rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = n_rows * cols;
  if (n == 0) return;
  PAGELLM_CHECK_MSG(cols % block_elems(src_dtype) == 0,
                    "dequantize: row length not a whole number of blocks");
  const auto* s = static_cast<const uint8_t*>(src);
  dispatch_float_type(dst_dtype, [&](auto to) {
    using TOut = decltype(to);
    auto* d = static_cast<TOut*>(dst);
    // The block geometry is a template argument: dtype.h's constexpr functions are host-only.
    auto launch = [&](auto format) {
      constexpr DType f = decltype(format)::value;
      dequantize_kernel<f, block_elems(f), block_bytes(f), TOut>
          <<<grid_for(n), kThreads, 0, stream>>>(s, d, n);
    };
    switch (src_dtype) {
      case DType::kQ8_0: launch(std::integral_constant<DType, DType::kQ8_0>{}); break;
      case DType::kQ4_0: launch(std::integral_constant<DType, DType::kQ4_0>{}); break;
      case DType::kQ4_1: launch(std::integral_constant<DType, DType::kQ4_1>{}); break;
      case DType::kI4G32: launch(std::integral_constant<DType, DType::kI4G32>{}); break;
      case DType::kI4G64: launch(std::integral_constant<DType, DType::kI4G64>{}); break;
      case DType::kI4G128: launch(std::integral_constant<DType, DType::kI4G128>{}); break;
      default: PAGELLM_CHECK_MSG(false, "dequantize: not a block-quantized type");
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace pagellm::cuda
