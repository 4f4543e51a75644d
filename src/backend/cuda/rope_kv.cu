// Rotary embedding, alone and fused with the paged KV-cache write. One block per token (a warp per
// token and head for the fused kernel); the rotation of a pair (a, b) is done by one thread, so
// in-place updates never race. Pairs are (2j, 2j+1) when interleaved (GPT-J / DeepSeek) and (j, j +
// rotary_dim/2) otherwise (NeoX / HF Llama); both touch only the first rotary_dim dims of a head.
// Both kernels are launched overlapped with the kernel before (device_utils.cuh) and wait for it in
// pdl_wait() before touching memory.
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 128;

struct Pair {
  int64_t a, b;
};
__device__ __forceinline__ Pair pair_of(int64_t j, int64_t half, bool interleaved) {
  return interleaved ? Pair{2 * j, 2 * j + 1} : Pair{j, j + half};
}

// Rotates every pair of every head of token `i` in place; when `cache` is non-null, the rotated
// values are also written to the cache row of that head.
// Thread `me` of `count` takes pairs me, me + count, ...
__device__ __forceinline__ void rotate_heads(bf16* x, int64_t stride_head, int64_t heads,
                                             const float* cs, int64_t half, bool interleaved,
                                             bf16* cache, int64_t cache_stride_head, int me,
                                             int count) {
  for (int64_t t = me; t < heads * half; t += count) {
    const int64_t h = t / half, j = t % half;
    const Pair p = pair_of(j, half, interleaved);
    bf16* v = x + h * stride_head;
    const float c = cs[j], s = cs[half + j];
    const float x0 = to_float(v[p.a]), x1 = to_float(v[p.b]);
    const bf16 r0 = from_float<bf16>(x0 * c - x1 * s);
    const bf16 r1 = from_float<bf16>(x1 * c + x0 * s);
    v[p.a] = r0;
    v[p.b] = r1;
    if (cache != nullptr) {
      cache[h * cache_stride_head + p.a] = r0;
      cache[h * cache_stride_head + p.b] = r1;
    }
  }
}

__global__ void rope_kernel(HeadsView x, const float* __restrict__ cos_sin, int64_t cs_ld,
                            int64_t rotary_dim, bool interleaved) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t i = blockIdx.x;
  rotate_heads(static_cast<bf16*>(x.data) + i * x.stride_tok, x.stride_head, x.heads,
               cos_sin + i * cs_ld, rotary_dim / 2, interleaved, nullptr, 0, threadIdx.x,
               blockDim.x);
}

// A warp per (token, head), kHeadsPerBlock heads per block: head y < q.heads rotates that query
// head; the others rotate key head y - q.heads, store it and copy the same head of v. Warps rather
// than blocks per head because a head is only 64..256 values: a block each left most threads idle
// and made block scheduling the cost of a prefill's many (token, head) pairs.
constexpr int kHeadsPerBlock = kThreads / 32;

__global__ void rope_store_kv_kernel(HeadsView q, HeadsView k, HeadsView v,
                                     const float* __restrict__ cos_sin, int64_t cs_ld,
                                     int64_t rotary_dim, bool interleaved,
                                     const int32_t* __restrict__ slot_mapping, CacheView kc,
                                     CacheView vc, bool k_vec, bool v_vec) {
  pdl_wait();  // first: the kernel before may still be running (launch_overlapped)
  pdl_allow_next();
  const int64_t i = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int64_t y = static_cast<int64_t>(blockIdx.y) * kHeadsPerBlock + (threadIdx.x >> 5);
  if (y >= q.heads + k.heads) return;
  const float* cs = cos_sin + i * cs_ld;
  const int64_t half = rotary_dim / 2;
  if (y < q.heads) {
    rotate_heads(static_cast<bf16*>(q.data) + i * q.stride_tok + y * q.stride_head, q.stride_head,
                 1, cs, half, interleaved, nullptr, 0, lane, 32);
    return;
  }
  const int64_t h = y - q.heads;
  const int64_t slot = slot_mapping[i];
  // Negative slots are padding; slots past the cache cannot come from a valid plan, and are
  // skipped rather than written out of bounds.
  const bool store = slot >= 0 && slot < kc.n_blocks * kc.block_size;
  bf16* kdst = nullptr;
  bf16* vdst = nullptr;
  if (store) {
    const int64_t blk = slot / kc.block_size, off = slot % kc.block_size;
    kdst = static_cast<bf16*>(kc.data) + blk * kc.stride_block + off * kc.stride_tok + h * kc.stride_head;
    vdst = static_cast<bf16*>(vc.data) + blk * vc.stride_block + off * vc.stride_tok + h * vc.stride_head;
  }
  bf16* krow = static_cast<bf16*>(k.data) + i * k.stride_tok + h * k.stride_head;
  rotate_heads(krow, k.stride_head, 1, cs, half, interleaved, kdst, kc.stride_head, lane, 32);
  if (!store) return;
  // K dims past rotary_dim are copied unrotated (partial rotary: Phi, GLM, DeepSeek's latent
  // c_kv), in 16-byte pieces where both rows allow: element by element, the 512 values of an MLA
  // row were a chain of 16 dependent load-store round trips per lane.
  if (k_vec) {
    for (int64_t e = rotary_dim + 8 * lane; e < k.dim; e += 8 * 32)
      *reinterpret_cast<uint4*>(kdst + e) = *reinterpret_cast<const uint4*>(krow + e);
  } else {
    for (int64_t e = rotary_dim + lane; e < k.dim; e += 32) kdst[e] = krow[e];
  }
  const bf16* vrow = static_cast<const bf16*>(v.data) + i * v.stride_tok + h * v.stride_head;
  if (v_vec) {  // 16-byte pieces where both rows allow (every model's layout)
    for (int64_t e = 8 * lane; e < v.dim; e += 8 * 32)
      *reinterpret_cast<uint4*>(vdst + e) = *reinterpret_cast<const uint4*>(vrow + e);
  } else {
    for (int64_t e = lane; e < v.dim; e += 32) vdst[e] = vrow[e];
  }
}

}  // namespace

void launch_rope(const HeadsView& x, const float* cos_sin, int64_t cos_sin_ld, int64_t rotary_dim,
                 bool interleaved, cudaStream_t stream) {
  if (x.n == 0) return;
  launch_overlapped(rope_kernel, static_cast<unsigned>(x.n), dim3(kThreads), 0, stream, x, cos_sin,
                    cos_sin_ld, rotary_dim, interleaved);
  CUDA_CHECK_LAUNCH();
}

void launch_rope_store_kv(const HeadsView& q, const HeadsView& k, const HeadsView& v,
                          const float* cos_sin, int64_t cos_sin_ld, int64_t rotary_dim,
                          bool interleaved, const int32_t* slot_mapping, const CacheView& k_cache,
                          const CacheView& v_cache, cudaStream_t stream) {
  if (q.n == 0) return;
  PAGELLM_CHECK(q.heads + k.heads <= 65535 && v.heads == k.heads);
  const auto vec_ok = [](const void* p, int64_t a, int64_t b, int64_t c) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && a % 8 == 0 && b % 8 == 0 && c % 8 == 0;
  };
  const bool k_vec =
      k.dim % 8 == 0 && rotary_dim % 8 == 0 && vec_ok(k.data, k.stride_tok, k.stride_head, 0) &&
      vec_ok(k_cache.data, k_cache.stride_block, k_cache.stride_tok, k_cache.stride_head);
  const bool v_vec =
      v.dim % 8 == 0 && vec_ok(v.data, v.stride_tok, v.stride_head, 0) &&
      vec_ok(v_cache.data, v_cache.stride_block, v_cache.stride_tok, v_cache.stride_head);
  const dim3 grid(static_cast<unsigned>(q.n),
                  static_cast<unsigned>((q.heads + k.heads + kHeadsPerBlock - 1) / kHeadsPerBlock));
  launch_overlapped(rope_store_kv_kernel, grid, dim3(kThreads), 0, stream, q, k, v, cos_sin,
                    cos_sin_ld, rotary_dim, interleaved, slot_mapping, k_cache, v_cache, k_vec,
                    v_vec);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pagellm::cuda
