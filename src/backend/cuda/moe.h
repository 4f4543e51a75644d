// Launchers of the mixture-of-experts kernels (moe.cu, moe_gemm.cu), callable from host C++.
// Pointers are device pointers; all work is queued on `stream`; the backend (cuda_moe.cpp) checks
// shapes, dtypes and devices before calling these.
//
// The routed experts of a step run in four stages, all on the device:
//   1. sort:     (token, k) pairs grouped by expert: per-expert offsets, the list of experts that
//                received tokens, each slot's token and each pair's slot (one block; the order of
//                pairs inside an expert's slots is not fixed, which changes no result: every row is
//                computed on its own);
//   2. gate|up:  per slot, act = silu(gate_e h) * up_e h, rounded to bf16 once;
//   3. down:     per slot, y = down_e act (bf16);
//   4. combine:  per token, out = sum of weight * y over its experts in ascending expert order,
//                plus the shared experts' output, in fp32, rounded to bf16 once.
// Stages 2 and 3 are either grouped GEMV kernels over (active expert, output rows) (decode), or
// grouped tensor-core GEMMs over (expert m-tile, column tile) (moe_gemm.cu; larger steps, see
// kMoeGemvMaxTokensPerExpert). Both read the experts' slot ranges from the device-side offsets,
// so they never wait for the host and every step size can be recorded into a CUDA graph. Large
// eager steps instead bring the counts to the host and run per-expert cuBLASLt GEMMs on the
// gathered rows (kMoeExpertGemmMinTokensPerExpert).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {

// The GEMV path takes a step when its (token, expert) pairs average at most this many per expert:
// n K <= kMoeGemvMaxTokensPerExpert E. The GEMV streams an expert's weights once per 8 of its
// tokens (kMoeGemvTokens) and multiplies on CUDA cores, 2 flops per weight element and token, so
// it stays bound by memory bandwidth up to roughly the H200's ratio of CUDA-core fp32 throughput
// (~67 TFLOP/s) to HBM bandwidth (4.8 TB/s) per 2-byte weight: ~14 tokens per expert. Past 8 the
// tensor-core GEMMs take over.
constexpr int64_t kMoeGemvMaxTokensPerExpert = 8;
// Steps that are not being recorded and average at least this many (token, expert) pairs per
// expert run each expert's products as its own cuBLASLt GEMM: at a full tile of rows per expert,
// cuBLASLt's Hopper kernels outrun the grouped mma.sync kernel by more than the one host round
// trip per layer costs (Mixtral-8x7B prefill of 512 tokens, 128 rows per expert, on the H200:
// 14,390 tok/s this way, 9,042 with the grouped GEMM).
constexpr int64_t kMoeExpertGemmMinTokensPerExpert = 128;
// Tokens an expert's weights are multiplied with per pass of the GEMV kernels (registers per
// lane hold one fp32 partial sum per output row and token).
constexpr int kMoeGemvTokens = 8;
// Limits of the routing kernel: experts per token, groups, experts.
constexpr int kMoeMaxTopK = 16;
constexpr int kMoeMaxGroups = 32;
constexpr int kMoeMaxExperts = 1024;
// A step of one token with at most this many experts runs stages 3 and 4 as one kernel
// (launch_moe_down_combine_gemv): one warp per expert in a block.
constexpr int kMoeFusedCombineMaxTopK = 8;

struct MoeRouteArgs {
  const float* logits = nullptr;  // f32 [n, E], row stride ld
  int64_t ld = 0;
  int32_t n_tokens = 0, n_experts = 0;
  const float* bias = nullptr;  // f32 [E] (kNoauxTc) or null
  MoeRouteParams p;
  int32_t* ids = nullptr;    // [n, top_k]
  float* weights = nullptr;  // [n, top_k]
};
// One warp per token (moe_route's semantics, backend.h).
void launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream);

// Scratch of one moe_experts call, carved from one device workspace.
struct MoeWorkspace {
  int32_t* offsets = nullptr;     // [E + 1]: expert e's slots are [offsets[e], offsets[e+1])
  // [E + 1]: experts with tokens, ascending, then -1; active[E] = how many
  int32_t* active = nullptr;
  int32_t* active_begin = nullptr;  // [E + 1]: active[j]'s first slot; past them, the slot count
  int32_t* slot_token = nullptr;  // [N]: the token of each slot
  int32_t* pair_slot = nullptr;   // [N]: the slot of pair t * K + k (-1: an id out of range)
  void* act = nullptr;  // bf16 [N, 2F]: gate|up products, then silu(gate) * up in the gate half
  void* xy = nullptr;   // bf16 [N, D]: gathered rows (per-expert GEMMs), then the down products
};
// Bytes of the workspace for N = n K pairs (both paths use the same layout): the sort's results
// (the "order": offsets, active, active_begin, slot_token, pair_slot) first, then act and xy.
int64_t moe_workspace_bytes(int64_t n_pairs, int64_t n_experts, int64_t hidden, int64_t inter);
MoeWorkspace moe_workspace_at(void* base, int64_t n_pairs, int64_t n_experts, int64_t hidden,
                              int64_t inter);
// The order alone (Backend::moe_order's buffer): its bytes, and ws's order arrays placed at base.
int64_t moe_order_layout_bytes(int64_t n_pairs, int64_t n_experts);
void moe_place_order(MoeWorkspace& ws, void* base, int64_t n_pairs, int64_t n_experts);

// Stage 1. ids i32 [n_pairs] (pair p = t * K + k).
void launch_moe_sort(const int32_t* ids, int64_t n_pairs, int32_t top_k, int32_t n_experts,
                     const MoeWorkspace& ws, cudaStream_t stream);

// The routed experts' stacked weights (bf16, contiguous) and sizes.
struct MoeExpertsArgs {
  const void* gate_up = nullptr;  // [E, 2F, D]
  const void* down = nullptr;     // [E, D, F]
  int32_t n_experts = 0;
  int64_t hidden = 0, inter = 0;  // D, F (multiples of 8: 16-byte weight loads)
};

// Stages 2 and 3 as grouped GEMVs: grids over (output rows, active-expert slot) with
// max_active = min(E, N) slots; blocks past the step's active experts return at once.
// max_tokens bounds the slots of one expert (the step's token count: routing picks distinct
// experts per token); it only sizes the kernels' passes, any bound gives the same results.
//   h bf16 [n, D] (row stride ldh, a multiple of 8, 16-byte aligned)
void launch_moe_gate_up_gemv(const MoeExpertsArgs& w, const void* h, int64_t ldh,
                             const MoeWorkspace& ws, int64_t max_active, int64_t max_tokens,
                             cudaStream_t stream);
void launch_moe_down_gemv(const MoeExpertsArgs& w, const MoeWorkspace& ws, int64_t max_active,
                          int64_t max_tokens, cudaStream_t stream);

// Stages 2 and 3 with experts kept quantized on the device, gate_up [E, 2F, D] and down
// [E, D, F] as one weight each in the device's layout: the 4-bit I4G stripes (int4_gemm.cu) or
// FP8 (fp8_gemm.cu, whose stacked experts' scales interleave). For every active expert e and slot
// s of it, out[s, :] = x[row, :] . w_e^T with row = x_rows[s] (s when x_rows is null), bf16, fp32
// sums, tensor-core mma on weights decoded in registers (the dense GEMV's kernel of the format).
// An expert's slots go in passes of up to 32 (the GEMV's rows), each pass reading its weights
// once; max_tokens bounds an expert's slots (sizes the passes: any bound gives the same results)
// and max_active the active experts.
struct MoeKeptGemv {
  const void* x = nullptr;  // bf16, row stride ldx (a multiple of 8, 16-byte aligned)
  int64_t ldx = 0;
  const int32_t* x_rows = nullptr;
  const void* w = nullptr;  // the stacked experts: n_experts weights of [rows, cols]
  DType dtype = DType::kF32;
  int64_t n_experts = 0, rows = 0, cols = 0;
  void* out = nullptr;  // bf16, row stride ldo
  int64_t ldo = 0;
};
void launch_moe_int4_gemv(const MoeKeptGemv& g, const MoeWorkspace& ws, int64_t max_active,
                          int64_t max_tokens, cudaStream_t stream);
void launch_moe_fp8_gemv(const MoeKeptGemv& g, const MoeWorkspace& ws, int64_t max_active,
                         int64_t max_tokens, cudaStream_t stream);

// Stages 3 and 4 in one kernel for a step of one token (top_k <= kMoeFusedCombineMaxTopK): each
// block makes a few output rows of every expert of the token and adds them as the combine does,
// so out is bit for bit what launch_moe_down_gemv then launch_moe_combine give, and the step's
// chain has one kernel fewer. ids and weights [1, top_k] as given to moe_experts; shared bf16
// [1, D] or null; out bf16 [1, D]. Follows launch_moe_gate_up_gemv.
void launch_moe_down_combine_gemv(const MoeExpertsArgs& w, const int32_t* ids, const float* weights,
                                  int32_t top_k, const MoeWorkspace& ws, const RowView& shared,
                                  const RowView& out, cudaStream_t stream);

// Stages 2 and 3 as one grouped tensor-core GEMM each (moe_gemm.cu): for every expert e and slot
// s in [offsets[e], offsets[e + 1]), c[s, :] = a[row(s), :] . b_e^T with row(s) = a_rows[s] (or s
// when a_rows is null). bf16 operands and output, fp32 accumulation.
struct MoeGemmArgs {
  const void* a = nullptr;  // bf16 rows of K, row stride lda
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;  // [slots]: the a row of each slot, or null
  const void* b = nullptr;          // bf16 [E][N, K], expert e at b + e * b_expert_stride
  int64_t b_expert_stride = 0, ldb = 0;
  void* c = nullptr;  // bf16 [slots, N], row stride ldc
  int64_t ldc = 0;
  const int32_t* offsets = nullptr;  // [E + 1], on the device
  int32_t n_experts = 0;
  int64_t n = 0, k = 0;
};
// Multiples of 8 (N, K, strides) and 16-byte aligned bases.
bool moe_gemm_supported(const MoeGemmArgs& g);
// max_slots bounds offsets[E] (the step's pair count); it sizes the grid, any bound gives the same
// results.
void launch_moe_gemm(const MoeGemmArgs& g, int64_t max_slots, cudaStream_t stream);

// Stage 4. ids and weights [n, K] as given to moe_experts; shared bf16 [n, D] or null; out bf16.
void launch_moe_combine(const int32_t* ids, const float* weights, int64_t n_tokens, int32_t top_k,
                        int32_t n_experts, const MoeWorkspace& ws, int64_t hidden,
                        const RowView& shared, const RowView& out, cudaStream_t stream);

}  // namespace pagellm::cuda
