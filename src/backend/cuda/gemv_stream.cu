// A chain of one-row products in one persistent launch, its weights streamed ahead of its inputs
// (launch_gemv_stream_chain, kernels.h).
//
// Why: in a batch-1 decode step each projection is its own GEMV launch, and each hand-over from
// one to the next costs ~3-6 us over its bytes (docs/perf-history, fourteenth to sixteenth rounds):
// the successor's blocks land as the predecessor's drain, and its memory pipe fills only then.
// Weights do not depend on activations, so nothing but the launch boundary stops them from
// streaming through the boundary. Here one block an SM stays for the whole chain; a producer warp
// streams the block's share of every phase's rows, phase after phase, into a ring of shared-memory
// stages with bulk copies (Hopper's tensor memory accelerator, one instruction a stage), never
// waiting for anything but a free stage; the consumer warps multiply the stages by the phase's
// input vector, which they take only after every block has finished the phase before (a grid-wide
// count). The ring's depth is what the stream runs ahead across such a wait.
//
// Shares are static (block b takes outputs [lo, lo + count) of every phase), so each block's
// partial sums are its own and a phase ends when its slowest SM's share has streamed. On the H200
// the Llama-3-8B step decodes 1.8% faster with it than with the projections' own launches,
// Llama-2-7B 0.1-0.4% (docs/perf-history, twenty-eighth round).
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = 32 * kConsumerWarps;
constexpr int kThreads = kConsumers + 32;  // + the producer warp
// Stages of 32 KB (a V2-Lite or Llama row fits one; 16 KB ones, twice as many, streamed slower).
// Three by default: a step decodes fastest with three (~3 us of run-ahead at an SM's share of the
// bandwidth, 115 KB of shared memory a block), which leave room on each SM for the blocks of the
// attention kernel before the chain, so the chain's blocks land and start streaming while it
// runs; with six they wait for it to end (Llama-3-8B 244.9 tok/s with three, 242.5 with four,
// 240.3 with six, 238.9 with two). PAGELLM_STREAM_STAGES (2 to kStages) sets it.
constexpr int kStageBytes = 32 * 1024;
constexpr int kStages = 6;  // the most a launch takes
constexpr int kDefaultStages = 3;
// A phase's rows of one block (its partial sums live in shared memory until the epilogue).
constexpr int kMaxBlockRows = 512;
// 16-byte pieces of x a consumer thread holds: K up to 8 * 8 * 256 = 16384.
constexpr int kMaxXPieces = 8;
constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warps (0 is __syncthreads)

struct Smem {
  uint64_t full[kStages];   // a stage's bytes have landed
  uint64_t empty[kStages];  // every consumer warp is done with a stage
  float partial[kMaxBlockRows][kConsumerWarps];
  float resid[kMaxBlockRows];  // kAdd: the outputs' values before the phase
  float red[kConsumerWarps];
  // Last: a launch with fewer stages allocates less of it.
  alignas(128) uint4 ring[kStages][kStageBytes / 16];
};

// The mbarrier and bulk-copy instructions are sm_90's; older GPUs never launch the chain
// (gemv_stream_chain_supported), so their build of these traps.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PAGELLM_SM90_ONLY(...) asm volatile(__VA_ARGS__)
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#else
#define PAGELLM_SM90_ONLY(...) __trap()
#endif
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  PAGELLM_SM90_ONLY("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  PAGELLM_SM90_ONLY("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  PAGELLM_SM90_ONLY("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                    "r"(bytes)
                    : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  unsigned done = 1;
  do {
    PAGELLM_SM90_ONLY(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
        "p; }"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// `bytes` (a multiple of 16) from global src to shared dst, completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
  PAGELLM_SM90_ONLY(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
  PAGELLM_SM90_ONLY("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(kConsumerBarrier), "n"(kConsumers) : "memory");
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block b's share of a phase: outputs [lo, lo + count) (spread to within one), read as one
// segment of rows (kStore, kAdd) or two (kSwiGlu: the gate rows, then the up rows m / 2 further).
struct Share {
  int lo, count, segments;
  int first_row[2];
};
__device__ __forceinline__ Share share_of(const StreamPhase& ph, int b, int blocks) {
  const int outputs = ph.epilogue == GemvEpilogue::kSwiGlu ? ph.m / 2 : ph.m;
  Share s;
  const int base = outputs / blocks, extra = outputs % blocks;
  s.lo = b * base + min(b, extra);
  s.count = base + (b < extra ? 1 : 0);
  s.segments = ph.epilogue == GemvEpilogue::kSwiGlu ? 2 : 1;
  s.first_row[0] = s.lo;
  s.first_row[1] = outputs + s.lo;
  return s;
}
__device__ __forceinline__ int rows_per_stage(int k) {
  return max(1, kStageBytes / (k * 2));
}

// The ring's position: stage index and how many times it went round (its barriers' parity).
struct RingPos {
  int stage = 0;
  unsigned round = 0;
  int n = kStages;
  __device__ void advance() {
    if (++stage == n) {
      stage = 0;
      ++round;
    }
  }
};

__device__ void produce(Smem& sm, const StreamChain& chain, int stages) {
  RingPos pos;
  pos.n = stages;
  for (int p = 0; p < chain.n_phases; ++p) {
    const StreamPhase& ph = chain.phase[p];
    const Share s = share_of(ph, blockIdx.x, gridDim.x);
    const int rps = rows_per_stage(ph.k);
    const size_t row_bytes = static_cast<size_t>(ph.k) * 2;
    for (int seg = 0; seg < s.segments; ++seg) {
      for (int r = 0; r < s.count; r += rps) {
        const int rows = min(rps, s.count - r);
        mbar_wait(&sm.empty[pos.stage], (pos.round & 1) ^ 1);
        const unsigned bytes = static_cast<unsigned>(rows * row_bytes);
        mbar_expect_tx(&sm.full[pos.stage], bytes);
        bulk_copy(sm.ring[pos.stage],
                  static_cast<const char*>(ph.w) + (s.first_row[seg] + r) * row_bytes, bytes,
                  &sm.full[pos.stage]);
        pos.advance();
      }
    }
  }
}

// x's pieces this thread multiplies (piece t + 256 j of every row, J of them), normalized first
// when the phase has a norm weight: x / rms(x) * norm_w, rounded to bf16 as the norm kernel's
// output is. Every load is issued before any is used (one round trip).
// kAdd: the block's outputs' values before the phase come in the same round trip, into
// sm.resid (the epilogue would otherwise wait for them behind the stream's bytes).
template <int J>
__device__ void load_x(Smem& sm, const StreamPhase& ph, const Share& s, float eps, uint4 (&xv)[J]) {
  const int t = threadIdx.x, pieces = ph.k / 8;
  const uint4* x = static_cast<const uint4*>(ph.x);
  // Written by other blocks in this launch: through L2, never a stale L1 line.
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int v = t + kConsumers * j;
    xv[j] = v < pieces ? __ldcg(x + v) : make_uint4(0, 0, 0, 0);
  }
  if (ph.epilogue == GemvEpilogue::kAdd) {
    const bf16* out = static_cast<const bf16*>(ph.out);
    for (int o = t; o < s.count; o += kConsumers)
      sm.resid[o] = __bfloat162float(__ldcg(out + s.lo + o));
  }
  if (ph.norm_w == nullptr) return;
  float4 nw[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int v = min(t + kConsumers * j, pieces - 1);
    nw[j][0] = __ldg(reinterpret_cast<const float4*>(ph.norm_w) + 2 * v);
    nw[j][1] = __ldg(reinterpret_cast<const float4*>(ph.norm_w) + 2 * v + 1);
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    float f[8];
    unpack_bf16x8(xv[j], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss = fmaf(f[e], f[e], ss);
  }
  ss = warp_sum(ss);
  if ((t & 31) == 0) sm.red[t >> 5] = ss;
  consumer_sync();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) total += sm.red[w];
  const float rstd = rsqrtf(total / static_cast<float>(ph.k) + eps);
#pragma unroll
  for (int j = 0; j < J; ++j) {
    float f[8];
    unpack_bf16x8(xv[j], f);
    const float w[8] = {nw[j][0].x, nw[j][0].y, nw[j][0].z, nw[j][0].w,
                        nw[j][1].x, nw[j][1].y, nw[j][1].z, nw[j][1].w};
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = f[e] * rstd * w[e];
    xv[j] = pack_bf16x8(f);  // pieces past the row are zeros: they multiply nothing
  }
  consumer_sync();  // sm.red is read before any thread's next phase writes it
}

// One phase's stages: each warp's part of every row of the stage (J pieces a thread), G rows
// at a time with all their pieces loaded before the sums, each row's warp sum into sm.partial.
template <int J>
__device__ void consume_stages(Smem& sm, const StreamPhase& ph, const Share& s, float eps,
                               RingPos& pos) {
  constexpr int G = J == 1 ? 8 : J == 2 ? 4 : J == 3 ? 2 : 1;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  uint4 xv[J];
  load_x<J>(sm, ph, s, eps, xv);
  const int rps = rows_per_stage(ph.k), pieces = ph.k / 8;
  for (int seg = 0; seg < s.segments; ++seg) {
    for (int r = 0; r < s.count; r += rps) {
      const int rows = min(rps, s.count - r);
      mbar_wait(&sm.full[pos.stage], pos.round & 1);
      const uint4* stage = sm.ring[pos.stage];
      for (int i = 0; i < rows; i += G) {
        uint4 wv[G][J];
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int j = 0; j < J; ++j) {
            const int v = t + kConsumers * j;
            wv[g][j] =
                (i + g < rows && v < pieces) ? stage[(i + g) * pieces + v] : make_uint4(0, 0, 0, 0);
          }
        float acc[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          acc[g] = 0.0f;
#pragma unroll
          for (int j = 0; j < J; ++j) acc[g] += dot8(wv[g][j], xv[j]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
          for (int g = 0; g < G; ++g) acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], o);
        if (lane == 0) {
#pragma unroll
          for (int g = 0; g < G; ++g)
            if (i + g < rows) sm.partial[seg * s.count + r + i + g][warp] = acc[g];
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&sm.empty[pos.stage]);
      pos.advance();
    }
  }
}

// The phase's outputs from the block's partial sums; every consumer thread takes outputs
// t, t + 256, ...
__device__ void finish_phase(Smem& sm, const StreamPhase& ph, const Share& s) {
  bf16* out = static_cast<bf16*>(ph.out);
  for (int o = threadIdx.x; o < s.count; o += kConsumers) {
    float y = 0.0f;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) y += sm.partial[o][w];
    if (ph.epilogue == GemvEpilogue::kSwiGlu) {
      float u = 0.0f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) u += sm.partial[s.count + o][w];
      y = y / (1.0f + __expf(-y)) * u;
    } else if (ph.epilogue == GemvEpilogue::kAdd) {
      y += sm.resid[o];
    }
    out[s.lo + o] = __float2bfloat16_rn(y);
  }
}

// The global nanosecond timer's low 32 bits: spans under 4 s come out right modulo 2^32, and a
// stamp held across phases takes one register instead of two.
__device__ __forceinline__ unsigned global_ns() {
  unsigned t;
  asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(t));
  return t;
}

// A block's time of phase p into `times` (thread 0; kTimed builds only).
__device__ __forceinline__ void add_phase_time(StreamChainTimes* times, int n, int p,
                                               unsigned start, unsigned ready, unsigned end) {
  const unsigned long long wait = ready - start, work = end - ready;
  atomicAdd(&times->wait[n][p], wait);
  atomicAdd(&times->work[n][p], work);
  atomicMax(&times->wait_max[n][p], wait);
  atomicMax(&times->work_max[n][p], work);
}

template <bool kTimed>
__device__ void consume(Smem& sm, const StreamChain& chain, unsigned* counter, float eps,
                        int stages, StreamChainTimes* times) {
  const int t = threadIdx.x;
  const unsigned blocks = gridDim.x;
  RingPos pos;
  pos.n = stages;
  unsigned start = 0, ready = 0;
  if constexpr (kTimed) start = global_ns();
  pdl_wait();  // the first phase's input comes from the kernel before
  const int n_phases = chain.n_phases;
  for (int p = 0; p < n_phases; ++p) {
    const StreamPhase& ph = chain.phase[p];
    if (p > 0) {
      // Every block's outputs of phase p - 1 are written.
      if (t == 0)
        while (load_acquire(counter) < blocks * p) {
        }
      consumer_sync();
    }
    if constexpr (kTimed) ready = global_ns();
    const Share s = share_of(ph, blockIdx.x, gridDim.x);
    // The pieces of a row a thread multiplies, as a constant of the stage loop. A switch (a jump
    // table) on purpose: a template recursion over the count compiled to 24 more instructions,
    // scheduled otherwise, in sources that decoded 1.2% slower (docs/perf-history, thirty-first
    // round).
    switch ((ph.k / 8 + kConsumers - 1) / kConsumers) {
      case 1:
        consume_stages<1>(sm, ph, s, eps, pos);
        break;
      case 2:
        consume_stages<2>(sm, ph, s, eps, pos);
        break;
      case 3:
        consume_stages<3>(sm, ph, s, eps, pos);
        break;
      case 4:
        consume_stages<4>(sm, ph, s, eps, pos);
        break;
      case 5:
        consume_stages<5>(sm, ph, s, eps, pos);
        break;
      case 6:
        consume_stages<6>(sm, ph, s, eps, pos);
        break;
      case 7:
        consume_stages<7>(sm, ph, s, eps, pos);
        break;
      default:
        consume_stages<8>(sm, ph, s, eps, pos);
        break;
    }
    consumer_sync();  // every warp's partial sums are in
    finish_phase(sm, ph, s);
    consumer_sync();  // every output of the block is stored (and sm.partial free again)
    if (t == 0) {
      __threadfence();
      const unsigned before = atomicAdd(counter, 1u);
      // The last block to finish the last phase sets the count back for the next launch: every
      // block has passed its last wait by then.
      if (p == n_phases - 1 && before == blocks * n_phases - 1) atomicExch(counter, 0u);
    }
    if constexpr (kTimed) {
      const unsigned end = global_ns();
      if (t == 0) {
        add_phase_time(times, n_phases, p, start, ready, end);
        if (p == 0 && blockIdx.x == 0) atomicAdd(&times->launches[n_phases], 1ull);
      }
      start = end;
    }
  }
}

template <bool kTimed>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_chain_kernel(const __grid_constant__ StreamChain chain, unsigned* counter,
                             float eps, int stages, StreamChainTimes* times) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      mbar_init(&sm.full[i], 1);
      mbar_init(&sm.empty[i], kConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();
  pdl_allow_next();  // the next kernel may land as this one's blocks leave; it waits for all
  if (threadIdx.x >= kConsumers) {
    // Weights only: nothing a kernel before writes, so no wait before streaming them.
    if (threadIdx.x == kConsumers) produce(sm, chain, stages);
    return;
  }
  consume<kTimed>(sm, chain, counter, eps, stages, times);
}

}  // namespace

int gemv_stream_chain_blocks() {
  static std::atomic<int> cache[kMaxCachedDevices];
  return cached_per_device(cache, [](int dev) {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    for (const auto kernel : {gemv_stream_chain_kernel<false>, gemv_stream_chain_kernel<true>})
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(sizeof(Smem))));
    return sms;
  });
}

bool gemv_stream_chain_supported(const StreamPhase& ph) {
  if (!device_is_sm90()) return false;  // bulk copies and transaction-counted barriers
  const int outputs = ph.epilogue == GemvEpilogue::kSwiGlu ? ph.m / 2 : ph.m;
  const int blocks = gemv_stream_chain_blocks();
  const int block_rows = (outputs + blocks - 1) / blocks * (ph.m == outputs ? 1 : 2);
  return ph.k % 8 == 0 && block_rows <= kMaxBlockRows && ph.k * 2 <= kStageBytes &&
         ph.k <= kMaxXPieces * kConsumers * 8 &&
         (ph.epilogue != GemvEpilogue::kSwiGlu || ph.m % 2 == 0) && outputs > 0 &&
         reinterpret_cast<uintptr_t>(ph.w) % 16 == 0 && reinterpret_cast<uintptr_t>(ph.x) % 16 == 0;
}

void launch_gemv_stream_chain(const StreamChain& chain, unsigned* counter, float eps,
                              cudaStream_t stream, StreamChainTimes* times) {
  PAGELLM_CHECK_MSG(chain.n_phases > 0 && chain.n_phases <= kMaxStreamPhases,
                    "gemv_stream_chain: 1 to kMaxStreamPhases phases");
  const int blocks = gemv_stream_chain_blocks();
  static const int stages =
      static_cast<int>(tuning::integer("PAGELLM_STREAM_STAGES", kDefaultStages));
  PAGELLM_CHECK_MSG(stages >= 2 && stages <= kStages, "gemv_stream_chain: stages out of range");
  const size_t smem = sizeof(Smem) - static_cast<size_t>(kStages - stages) * kStageBytes;
  if (times != nullptr) {
    launch_overlapped(gemv_stream_chain_kernel<true>, dim3(blocks), dim3(kThreads), smem, stream,
                      chain, counter, eps, stages, times);
  } else {
    launch_overlapped(gemv_stream_chain_kernel<false>, dim3(blocks), dim3(kThreads), smem, stream,
                      chain, counter, eps, stages, times);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace pagellm::cuda
