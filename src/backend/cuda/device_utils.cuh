// Device-side helpers shared by the kernels: element loads/stores in any float type, warp and block
// reductions, launch arithmetic. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/tuning.h"

namespace pagellm::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 floats. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? scratch[lane] : 0.0f;
  return warp_sum(t);
}

// 16 bytes of a weight row that is read once per pass (8 bf16, or 32 packed 4-bit values): the
// load bypasses L1 so the activation rows the GEMV kernels reuse stay there (gemv.cu, moe.cu,
// int4_gemm.cu).
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One trip of a weight stream (the decode GEMVs): U 16-byte pieces of each of R rows, a lane's
// pieces `step` elements apart from k0 on, all loads issued before any is used; pieces at or past
// k_end are zeros, not loaded.
template <int U, int R>
__device__ __forceinline__ void load_trip(uint4 (&v)[U][R], const __nv_bfloat16* const (&rows)[R],
                                          int64_t k0, int64_t step, int64_t k_end) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t k = k0 + u * step;
#pragma unroll
    for (int r = 0; r < R; ++r)
      v[u][r] = k < k_end ? load_stream(rows[r] + k) : make_uint4(0, 0, 0, 0);
  }
}

// 8 bf16 (one 16-byte load) as floats, and 8 floats rounded to bf16 as one 16-byte store. Take
// the loaded value, not a dereferenced pointer: through a pointer nvcc may split the 16-byte load
// into 2-byte ones.
__device__ __forceinline__ void unpack_bf16x8(uint4 raw, float (&f)[8]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(p[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}
__device__ __forceinline__ uint4 pack_bf16x8(const float (&f)[8]) {
  uint4 raw;
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return raw;
}

// The dot product of two packs of 8 bf16, in fp32.
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

// Programmatic dependent launch (sm_90): a kernel launched with the programmatic-serialization
// attribute (launch_overlapped) may start while the kernel before it still runs, does whatever
// does not depend on it (the GEMVs prefetch their weights), then waits in pdl_wait() for that
// kernel to finish and its writes to be visible. Kernels that call pdl_allow_next() early let such
// a successor start as soon as all their own blocks are running. Both are no-ops on older GPUs and
// for kernels launched the ordinary way, so a kernel may contain them whoever launches it.
//
// The kernels of a step (embedding, norms, activations, RoPE and the KV store, attention, MoE,
// GEMVs) are launched this way, so each one's blocks are already resident when its predecessor
// ends and the launch gap (~1 us a kernel, even in a CUDA graph) is hidden. The rule for every
// kernel launched through launch_overlapped: every thread calls pdl_wait() before it touches any
// global memory its predecessors write (or read: it may overwrite them). The step's kernels call
// it first, before any early return, then pdl_allow_next(). Waiting covers all earlier kernels
// too, since each finishes only after its own wait; a kernel whose threads all left without
// waiting could finish before its predecessor and break that chain.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_allow_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// look_up(device) for the current device, computed once per device and kept in `cache` (an
// entry holds the value + 1; 0: not looked up yet). Devices past the cache look it up each time.
constexpr int kMaxCachedDevices = 64;
template <typename F>
int cached_per_device(std::atomic<int> (&cache)[kMaxCachedDevices], F look_up) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= kMaxCachedDevices) return look_up(dev);
  int k = cache[dev].load(std::memory_order_relaxed);
  if (k == 0) {
    k = look_up(dev) + 1;
    cache[dev].store(k, std::memory_order_relaxed);
  }
  return k - 1;
}

// Whether the current device has compute capability 9.0+ (sm_90: programmatic launch,
// thread-block clusters).
inline bool device_is_sm90() {
  static std::atomic<int> cache[kMaxCachedDevices];
  return cached_per_device(cache, [](int dev) {
           int major = 0;
           CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
           return major >= 9 ? 1 : 0;
         }) == 1;
}

// Whether the current device can overlap a kernel with its predecessor (compute capability 9.0+).
// PAGELLM_CUDA_PDL=0 turns overlapping off (docs/TUNING.md).
inline bool pdl_supported() {
  static const bool enabled = tuning::on("PAGELLM_CUDA_PDL");
  return enabled && device_is_sm90();
}

// Early loads: the step's kernels issue their loads of what no kernel still running can be
// writing before pdl_wait(), so those loads overlap the kernel before instead of lengthening the
// chain after it: weights, the step's metadata (copied from the host before the step), KV rows of
// earlier steps, and what kernels two back wrote (the kernel before let this one start only after
// its own wait; not so after a kernel that releases first, pdl_wait_and_release). A side branch's
// join is no exception: captured into a graph it is a programmatic edge too, so the branch's last
// kernel may still be running (moe.cu's gate|up kernel). Without them Llama-3-8B decoded 2% and
// DeepSeek-V2-Lite 4-6% slower on the H200 (docs/perf-history, thirteenth round).

// The start of a kernel launched overlapped: waits for the kernel before (pdl_wait) and lets the
// successor launch (pdl_allow_next), after the wait as the rule above has it or, with
// release_first, before it. Released first, the successor may start while the kernel before
// this one still runs, so it must not read what that kernel writes before its own wait, which
// early loads otherwise allow (who releases first: early_release() in kernels.h).
__device__ __forceinline__ void pdl_wait_and_release(bool release_first) {
  if (release_first) pdl_allow_next();
  pdl_wait();
  if (!release_first) pdl_allow_next();
}

// Launches `kernel` on `stream` so that it may overlap the kernel queued before it (see pdl_wait;
// the kernel must call pdl_wait() before it reads anything its predecessors write, or writes
// anything they read), in thread-block clusters of cluster_x blocks along x when cluster_x > 1
// (sm_90; above 8 the kernel must allow non-portable sizes). Falls back to an ordinary launch
// where the device cannot overlap.
template <typename... Params, typename... Args>
void launch_overlapped_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                   cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_supported()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...));
}

template <typename... Params, typename... Args>
void launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  launch_overlapped_in_clusters(kernel, grid, block, smem, stream, 1, std::forward<Args>(args)...);
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Calls f with a value of the C++ type matching `t` (float, bf16 or __half); other types are a
// programmer error (the backend checks dtypes before launching).
template <typename F>
void dispatch_float_type(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); return;
    case DType::kBF16: f(bf16{}); return;
    case DType::kF16: f(__half{}); return;
    default: PAGELLM_CHECK_MSG(false, "cuda: unsupported element type for this op");
  }
}

}  // namespace pagellm::cuda
