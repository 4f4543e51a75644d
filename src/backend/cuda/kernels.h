// Launchers of the CUDA kernels, callable from host C++ (no CUDA headers beyond the runtime API).
// Pointers are device pointers; a "row view" is `n_rows` rows of `cols` elements with row r at
// element offset r * ld. The backend (cuda_backend.cpp) checks shapes, dtypes and devices before
// calling these; the launchers only check launch errors. All work is queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/device_sample.h"
#include "core/dtype.h"
#include "core/tuning.h"

namespace pagellm::cuda {

// Whether the short kernels that may let their successor launch before their own wait do so
// (pdl_wait_and_release in device_utils.cuh): the norm ops CudaBackend runs alone (not the norm
// of rms_norm_matmul and rms_norm_swiglu) and the MoE combine. On by default;
// PAGELLM_EARLY_RELEASE=0 turns it off (docs/TUNING.md).
inline bool early_release() {
  static const bool on = tuning::on("PAGELLM_EARLY_RELEASE");
  return on;
}

// A 2-D strided view passed to kernels.
struct RowView {
  void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t n_rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;  // elements between consecutive rows
};
// Whether every row of a 2-byte-element view starts on a 16-byte boundary: the condition of the
// kernels that move 8 bf16 at a time.
inline bool rows_aligned16(const RowView& v) {
  return v.ld % 8 == 0 && reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
}

// The finest split of a row's K between warps (1, 2 or 4) that still leaves each warp at least one
// whole trip of loads (`trip` elements): the GEMV's rule for grids of many waves (gemv.cu) and the
// routed experts' gate|up rule at one token (moe.cu).
inline int finest_whole_trip_split(int64_t k_dim, int64_t trip) {
  int split = 1;
  while (split < 4 && k_dim >= trip * split * 2) split *= 2;
  return split;
}

// --- embedding.cu ---
// out[i, :] = table[ids[i], :]; rows with an id outside [0, vocab) are written as zeros (ids are
// validated on the host before a step; this only keeps a bad id from reading out of bounds).
// A negative id -(k + 1) is row k of the sampling call that last wrote `handover` (its layout:
// SampleLaunch::handover; 0 for a row it does not have), when handover is not null: a step
// planned before its input tokens were read takes them here, with no kernel of its own.
void launch_embedding(const RowView& table, const int32_t* ids, const int32_t* handover,
                      const RowView& out, cudaStream_t stream);

// --- norm.cu ---
// out = x / rms(x) * w per row (out may alias x); w f32, bf16 or f16 [cols].
// release_early: the kernel after may launch as soon as this one is resident, before it waits
// for the kernel before (pdl_wait_and_release, device_utils.cuh), so the successor's launch and
// early loads overlap that kernel's tail too. The successor must then read nothing before its
// own wait but weights, the step's metadata and earlier steps' cache rows: what the kernel two
// back writes may still be in flight. A large projection's GEMV after the norm loses by it
// (Llama's, 1-1.5%; likely its blocks land unevenly while that kernel drains: docs/PERF.md).
void launch_rms_norm(const RowView& x, const void* w, DType w_dtype, float eps, const RowView& out,
                     cudaStream_t stream, bool release_early);
// residual += x (rounded to the residual's dtype, bf16: the residual stream is kept in the
// activation type, as vLLM does); out = rms_norm(residual) * w computed from that rounded
// residual. out may alias x.
// release_early: as launch_rms_norm's.
void launch_add_rms_norm(const RowView& x, const RowView& residual, const void* w, DType w_dtype,
                         float eps, const RowView& out, cudaStream_t stream, bool release_early);
// w[m, c] *= g[c] for every row of w (bf16, rounded once), g f32 [w.cols]: a norm weight folded
// into the projection after the norm (Backend::fold_norm_weight), at load.
void launch_scale_columns(const RowView& w, const float* g, cudaStream_t stream);

// --- rope_kv.cu ---
// A [n, heads, dim] activation view (bf16) with element strides.
struct HeadsView {
  void* data = nullptr;
  int64_t n = 0, heads = 0, dim = 0;
  int64_t stride_tok = 0, stride_head = 0;
};
// A paged cache [n_blocks, block_size, heads, dim] (bf16) with element strides.
struct CacheView {
  void* data = nullptr;
  int64_t n_blocks = 0, block_size = 0, heads = 0, dim = 0;
  int64_t stride_block = 0, stride_tok = 0, stride_head = 0;
};
// Rotary embedding in place on the first rotary_dim dims of each head of x.
// cos_sin f32 rows of rotary_dim: cos of the rotary_dim/2 frequencies, then their sin.
void launch_rope(const HeadsView& x, const float* cos_sin, int64_t cos_sin_ld, int64_t rotary_dim,
                 bool interleaved, cudaStream_t stream);
// RoPE on q and k in place, then k and v stored to cache slot slot_mapping[i] (skipped when < 0
// or beyond the cache), in one kernel per token.
void launch_rope_store_kv(const HeadsView& q, const HeadsView& k, const HeadsView& v,
                          const float* cos_sin, int64_t cos_sin_ld, int64_t rotary_dim,
                          bool interleaved, const int32_t* slot_mapping, const CacheView& k_cache,
                          const CacheView& v_cache, cudaStream_t stream);

// --- activation.cu ---
// out = silu(gate) * up (all bf16 row views of equal shape; out may alias either input).
void launch_silu_mul(const RowView& gate, const RowView& up, const RowView& out,
                     cudaStream_t stream);
// out = a + b (bf16 or f32, all the same dtype; out may alias).
void launch_add(const RowView& a, const RowView& b, const RowView& out, cudaStream_t stream);
// out (f32) = x (bf16, f16 or f32).
void launch_to_f32(const RowView& x, const RowView& out, cudaStream_t stream);

// Uniform [lo, hi) values by index (random_uniform_at), for dummy weights.
void launch_fill_random(void* data, DType dtype, int64_t n, uint64_t seed, float lo, float hi,
                        cudaStream_t stream);
// out[i, :] = x[rows[i], :] (same dtype, any float type); out must not overlap x.
void launch_gather_rows(const RowView& x, const int32_t* rows, const RowView& out,
                        cudaStream_t stream);
// out[r, c] += bias[c] (out bf16 or f32; bias f32, bf16 or f16): the matmul's bias when the
// cuBLASLt epilogue cannot take it.
void launch_add_bias(const RowView& out, const void* bias, DType bias_dtype, cudaStream_t stream);

// --- convert.cu ---
// dst[i] = src[i] converted, for n values of plain float types (f32, f16, bf16), contiguous.
void launch_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                    cudaStream_t stream);
// Dequantizes n_rows rows of a block format launch_dequantize decodes (device_dequantizes: GGUF's
// Q8_0, Q4_0, Q4_1 and the I4G types), `cols` values per row, to dst_dtype (f32, f16 or bf16),
// contiguous.
inline bool device_dequantizes(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1 || is_group_int4(t);
}
void launch_dequantize(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n_rows,
                       int64_t cols, cudaStream_t stream);

// --- int4_gemm.cu ---
// 4-bit weights kept 4-bit on the device: the I4G types, in the stripe layout int4_gemm.cu
// describes (a tensor's bytes are dtype_bytes of its type; only the CUDA backend reads them).
// GGUF's Q4_0 is uploaded as I4G32 (zero point 8: the same values).
inline int64_t int4_group(DType t) {
  return is_group_int4(t) ? block_elems(t) : 0;
}
// The device type a host 4-bit type is kept as, or kF32 when it is not kept 4-bit.
inline DType int4_device_type(DType host) {
  if (host == DType::kQ4_0) return DType::kI4G32;
  return is_group_int4(host) ? host : DType::kF32;
}
// Whether a [rows, cols] weight of I4G type t fits the layout: whole 16-row stripes, whole
// 64-column chunks and groups.
inline bool int4_layout_fits(DType t, int64_t rows, int64_t cols) {
  return is_group_int4(t) && rows % 16 == 0 && cols % 64 == 0 && cols % int4_group(t) == 0;
}
// Host blocks (src_dtype: the I4G type itself, or Q4_0 for I4G32) of n_rows x cols -> the device
// layout of dst_dtype. src and dst are device memory.
void launch_int4_repack(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                        int64_t n_rows, int64_t cols, cudaStream_t stream);
// Rows [first_row, first_row + n_rows) (whole stripes) of a device-layout weight -> bf16
// row-major [n_rows, cols] at out: what cuBLASLt multiplies for batches past the GEMV's.
void launch_int4_dequantize(const void* w, DType dtype, int64_t first_row, int64_t n_rows,
                            int64_t cols, void* out, cudaStream_t stream);
// Random weights equal to the CPU backend's fill_random of the same type, seed and range: n_rows
// rows (whole stripes) from the tensor's block first_block on, made in `staging` (their bytes,
// device memory) and repacked into `data` (where those rows start).
void launch_int4_random(void* data, DType dtype, int64_t n_rows, int64_t cols, int64_t first_block,
                        void* staging, uint64_t seed, float lo, float hi, cudaStream_t stream);
// The decode product with 4-bit weights: out (+)= x . w^T + bias for up to kInt4GemvMaxRows rows
// of x, reading each weight byte once (tensor-core mma on the dequantized fragments, fp32 sums).
constexpr int64_t kInt4GemvMaxRows = 32;
bool int4_gemv_supported(const RowView& x, const RowView& w, const RowView& out);
void launch_int4_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                      const RowView& out, bool accumulate, cudaStream_t stream);

// --- fp8_gemm.cu ---
// FP8 weights kept FP8 on the device: F8G128 in the layout fp8_gemm.cu describes (a tensor's
// bytes are dtype_bytes of its type; only the CUDA backend reads them). Host F8B32
// weights (FP8 checkpoints as the loader reads them) are kept as F8G128 where each 128 values of
// a row share one scale, as every FP8 checkpoint scheme's do (fp8_kept_type).
// Whether a [rows, cols] FP8 weight fits the layout: whole 16-row stripes and 128-column groups.
inline bool fp8_layout_fits(int64_t rows, int64_t cols) {
  return rows % 16 == 0 && cols % 128 == 0;
}
// n_rows rows of host blocks (src_dtype F8B32 or F8G128) -> rows [first_row, first_row + n_rows)
// of the device-layout weight of total_rows x cols at w. src and w are device memory.
void launch_fp8_repack(const void* src, DType src_dtype, void* w, int64_t total_rows,
                       int64_t first_row, int64_t n_rows, int64_t cols, cudaStream_t stream);
// Rows [first_row, first_row + n_rows) of a device-layout weight of total_rows rows -> bf16
// row-major [n_rows, cols] at out.
void launch_fp8_dequantize(const void* w, int64_t total_rows, int64_t first_row, int64_t n_rows,
                           int64_t cols, void* out, cudaStream_t stream);
// Random weights: rows [first_row, first_row + n_rows) of the weight at w, made in `staging`
// (their host blocks, device memory) and repacked. F8G128: equal to the CPU backend's fill_random
// of F8G128 with the same seed and range; F8Row: the same values with one scale for all,
// max(|lo|, |hi|) / 448.
void launch_fp8_random(void* w, DType dtype, int64_t total_rows, int64_t first_row, int64_t n_rows,
                       int64_t cols, void* staging, uint64_t seed, float lo, float hi,
                       cudaStream_t stream);
// x (bf16, whole 128-column groups) -> values (e4m3, [n, K]) and scales: each row's 128-column
// groups with their largest magnitude mapped to 448, scales [K / 128][n] f32 (per_row false), or
// each whole row, scales [n] (per_row true): Fp8Matmul's activations.
void launch_fp8_quantize_rows(const RowView& x, bool per_row, uint8_t* values, float* scales,
                              cudaStream_t stream);
// The decode product with FP8 weights: out (+)= x . w^T + bias for up to kFp8GemvMaxRows rows of
// x, reading each weight byte once (values decoded exactly to bf16 for tensor-core mma, fp32
// sums, the scales applied per 128 columns).
constexpr int64_t kFp8GemvMaxRows = 32;
bool fp8_gemv_supported(const RowView& x, const RowView& w, const RowView& out);
void launch_fp8_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                     const RowView& out, bool accumulate, cudaStream_t stream);

// --- weights kept quantized on the device (cuda_quantized.cpp) ---
// The device's FP8 types: F8G128, and F8Row where each row's scales are one (upload_weight finds
// out; Fp8Matmul then scales per row and token instead of per 128 columns).
inline bool is_kept_fp8(DType t) {
  return t == DType::kF8G128 || t == DType::kF8Row;
}
inline bool kept_quantized(DType t) {
  return is_group_int4(t) || is_kept_fp8(t);
}
// The device type a host quantized type is kept as, or kF32 when it is not kept quantized.
inline DType kept_type(DType host) {
  if (host == DType::kF8B32 || host == DType::kF8G128) return DType::kF8G128;
  if (host == DType::kF8Row) return DType::kF8Row;
  return int4_device_type(host);
}
inline bool kept_layout_fits(DType t, int64_t rows, int64_t cols) {
  return is_kept_fp8(t) ? fp8_layout_fits(rows, cols) : int4_layout_fits(t, rows, cols);
}
// The device FP8 type a host FP8 weight (F8B32, F8G128 or F8Row blocks, `rows` x `cols`, whole
// 128-column groups) is kept as, from its scales in one pass: F8Row where each row has one scale,
// F8G128 where each 128 values of a row do, else kF32 (not kept).
DType fp8_kept_type(DType host, const void* data, int64_t rows, int64_t cols);

// --- gemm.cu (fallback) ---
// out[n, M] = x[n, K] . w[M, K]^T (+ bias) with fp32 accumulation, for weight types cuBLASLt
// cannot pair with bf16 activations (f32, f16). x bf16; out bf16 or f32; bias may be null.
// accumulate: out += the product instead.
void launch_gemm_fallback(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                          const RowView& out, cudaStream_t stream, bool accumulate = false);

// --- gemv.cu ---
// out[n, M] = x[n, K] . w[M, K]^T (+ bias) for decode-sized n (1..kGemvMaxRows), bf16 x and w,
// bf16 or f32 out (rows may be strided), fp32 accumulation. Needs K, x's and w's row strides
// multiples of 8 elements and x, w 16-byte aligned (gemv_supported).
constexpr int64_t kGemvMaxRows = 8;
bool gemv_supported(const RowView& x, const RowView& w, const RowView& out);
// The transformer block's fused forms (CudaBackend::matmul_add, rms_norm_matmul,
// rms_norm_swiglu), each writing bf16: with unit_norm x's rows are RMS-normalized with a weight
// of ones (the model folded the norm weight into w's columns at load), each row's sum of squares
// taken in a pass over x before w streams, so the stream is the plain product's. kAdd
// adds the product to out; kSwiGlu takes w as [gate; up] of 2F rows and writes silu(gate) * up to
// out [n, F]. Supported: plain (f32 or bf16 out), kAdd without a norm, SwiGLU with or without
// one, a norm with kStore (gemv_fusion_supported).
enum class GemvEpilogue { kStore, kAdd, kSwiGlu };
struct GemvFusion {
  bool unit_norm = false;  // normalize with a weight of ones
  float eps = 0.0f;
  GemvEpilogue epilogue = GemvEpilogue::kStore;
  // Not a fusion but how the launch splits the work: the warps sharing each row's K (1, 2, 4 or
  // 8), or 0 for gemv.cu's rule. Micro-benchmarks and tests set it; the backend keeps the rule.
  int k_split = 0;
};
bool gemv_fusion_supported(const RowView& x, const RowView& w, const RowView& out,
                           const GemvFusion& fusion);
void launch_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                 const RowView& out, cudaStream_t stream, const GemvFusion& fusion = {});
// `batch` products of one shape in one launch (Backend::batched_matmul at decode sizes): entry b
// reads x and w `b * *_batch_stride` elements past the views and writes out likewise; no bias.
// Needs gemv_supported() and batch strides of x and w that are multiples of 8 elements.
bool gemv_batched_supported(const RowView& x, int64_t x_batch_stride, const RowView& w,
                            int64_t w_batch_stride, const RowView& out, int64_t batch);
void launch_gemv_batched(const RowView& x, int64_t x_batch_stride, const RowView& w,
                         int64_t w_batch_stride, const RowView& out, int64_t out_batch_stride,
                         int64_t batch, cudaStream_t stream);

// --- gemv_stream.cu ---
// One phase of a chain of one-row products run in one launch: out = x . w^T (bf16 w [m, K], x
// [K], out [m]; kSwiGlu: w is [gate; up], out [m / 2]; kAdd: out += the product), x first
// RMS-normalized and scaled by norm_w (f32 [K]) when that is set. x may be what an earlier phase
// of the chain writes.
struct StreamPhase {
  const void* w = nullptr;
  int m = 0, k = 0;
  const void* x = nullptr;
  const float* norm_w = nullptr;
  void* out = nullptr;
  GemvEpilogue epilogue = GemvEpilogue::kStore;
};
bool gemv_stream_chain_supported(const StreamPhase& phase);
// Blocks of a chain's launch (one an SM).
int gemv_stream_chain_blocks();
// The phases in order, each starting once every output of the one before is written; the
// weights of later phases stream while earlier ones finish. Passed by value (the launch's
// parameters), so a recorded graph keeps them.
constexpr int kMaxStreamPhases = 8;
struct StreamChain {
  StreamPhase phase[kMaxStreamPhases];
  int n_phases = 0;
};
// Where the chain's time goes, phase by phase (device memory, zeroed before the first launch;
// PAGELLM_CHAIN_TIMES=1 in the backend). Indexed [n_phases][p] for launches of n_phases phases:
// the nanoseconds each block spent from the end of phase p - 1 (for p = 0, the block's start)
// until every input of phase p was written (`wait`: the grid-wide count, or the kernel before),
// and from then until its own outputs of phase p were stored (`work`), summed over blocks and
// launches, and the most one block took; `launches` counts the launches of each length.
struct StreamChainTimes {
  unsigned long long wait[kMaxStreamPhases + 1][kMaxStreamPhases];
  unsigned long long work[kMaxStreamPhases + 1][kMaxStreamPhases];
  unsigned long long wait_max[kMaxStreamPhases + 1][kMaxStreamPhases];
  unsigned long long work_max[kMaxStreamPhases + 1][kMaxStreamPhases];
  unsigned long long launches[kMaxStreamPhases + 1];
};
// `counter` is a device word that is 0 before the launch and is 0 again after it. `times`: null,
// or where a timed build of the kernel adds its phases' times (a few stamps and atomics a phase;
// the untimed kernel has none of that code).
void launch_gemv_stream_chain(const StreamChain& chain, unsigned* counter, float eps,
                              cudaStream_t stream, StreamChainTimes* times = nullptr);

// --- attention.cu ---
struct AttentionArgs {
  const void* q = nullptr;  // bf16 [n_tokens, hq, head_dim]
  int64_t q_stride_tok = 0, q_stride_head = 0;
  void* out = nullptr;  // bf16 [n_tokens, hq, head_dim_v]
  int64_t o_stride_tok = 0, o_stride_head = 0;
  CacheView k_cache, v_cache;
  const int32_t* cu_seqlens_q = nullptr;  // [n_seqs + 1]
  const int32_t* seq_lens_kv = nullptr;   // [n_seqs]
  const int32_t* block_tables = nullptr;  // [n_seqs, block_table_ld]
  int64_t block_table_ld = 0;
  int32_t n_seqs = 0, hq = 0, hkv = 0, head_dim = 0, head_dim_v = 0;
  int32_t block_size = 16;
  int32_t max_seqlen_q = 0, max_seqlen_kv = 0;
  float scale = 1.0f;
  int32_t window = -1;  // <= 0: none
  float softcap = 0.0f;
};
// Bytes of scratch the decode path needs for split-KV partial results (0 when it does not split).
int64_t attention_workspace_bytes(const AttentionArgs& a, int n_sms);
// Arrival counters the decode path needs when it splits (one per sequence and KV head; 0 when it
// does not). They must be zero before the launch, and the kernel leaves them zero.
int64_t attention_counters(const AttentionArgs& a, int n_sms);
// Runs decode (max_seqlen_q == 1: split-KV, the last split of each KV head merging them all) or
// ragged prefill (tiled). `workspace` must hold attention_workspace_bytes(a, n_sms) and
// `counters` attention_counters(a, n_sms) zeros.
void launch_attention(const AttentionArgs& a, void* workspace, int32_t* counters, int n_sms,
                      cudaStream_t stream);

// --- attention_mla.cu ---
// Attention over a latent cache (DeepSeek MLA in the absorbed form) and any head dims above 256:
// one block per (query token, KV split, tile of 16 query heads) loads each cache row once for
// all its heads; decode and prefill alike (one block per query token); tensor cores for the
// DeepSeek shapes, CUDA cores for the rest. head_dim and head_dim_v even, head_dim_v <= 1024;
// when V is a column view of the K rows it is read from them.
// V's first column inside the K rows when v_cache is a column view of k_cache (same blocks,
// tokens, heads and strides; V within the row), else -1.
int64_t attention_v_offset_in_k(const AttentionArgs& a);
// Whether launch_attention sends `a` here: head dims above 256, or V inside the K rows.
bool attention_mla_wanted(const AttentionArgs& a);
// Scratch of the split-KV partial results for n_tokens query tokens (0 when it does not split).
int64_t attention_mla_workspace_bytes(const AttentionArgs& a, int64_t n_tokens, int n_sms);
// Backend::attention_project's per-head product taken into the merge of the splits:
// out[tok, h, r] = sum_e attn[tok, h, e] * w[h, r, e] for r < m, attn rounded to bf16 first (as
// the merge writes it), without writing attn.
struct MlaProjection {
  const void* w = nullptr;  // bf16 [hq, m, head_dim_v], rows 16-byte aligned
  int64_t w_stride_head = 0, w_stride_row = 0;
  void* out = nullptr;  // bf16 [n_tokens, hq, m]
  int64_t o_stride_tok = 0, o_stride_head = 0;
  int32_t m = 0;
};
// Whether launch_attention_mla can take `p`: a launch that splits the context (decode at small
// batches), at most 8 tokens (attention_mla.cu's kProjectMaxTokens), head_dim_v of 256, 512 or
// 1024, w rows 16-byte aligned.
bool attention_mla_projection_fusable(const AttentionArgs& a, int64_t n_tokens, int n_sms,
                                      const MlaProjection& p);
// Queues the kernel (and the merge of the splits, with `proj` applied when given: it must be
// fusable, and the attention output is then not written). `workspace` must hold
// attention_mla_workspace_bytes(a, n_tokens, n_sms); out pairs must be 4-byte aligned.
void launch_attention_mla(const AttentionArgs& a, int64_t n_tokens, void* workspace, int n_sms,
                          cudaStream_t stream, const MlaProjection* proj = nullptr);

// --- sampling.cu ---
// One device sampling step (Backend::sample): rows[i] samples logits row rows[i].logits_row of
// `logits` [*, vocab] (bf16 or f32, row stride ld elements) and writes results[i]. rows, edits
// and results are device pointers.
struct SampleLaunch {
  const void* logits = nullptr;
  DType dtype = DType::kBF16;
  int64_t ld = 0;
  int32_t vocab = 0;
  const DeviceSampleRow* rows = nullptr;
  int32_t n_rows = 0;
  const DeviceSampleEdit* edits = nullptr;
  const uint32_t* masks = nullptr;  // rows' grammar masks (DeviceSampleRow::mask_word)
  DeviceSampleResult* results = nullptr;
  int n_sms = 0;
  bool cluster_ok = false;  // thread-block clusters available (sm_90)
  int force_group = 0;      // > 0: blocks per row (tests and benchmarks); 0: chosen from the shape
  // Null, or where the next step's embedding finds this call's tokens (launch_embedding):
  // [0] = n_rows, [1 + i] = row i's token, or 0 where the row failed (sampled_token_for).
  int32_t* handover = nullptr;
};
void launch_sample(const SampleLaunch& l, cudaStream_t stream);
// Dynamic shared memory of one sampling block whose slice of the row is `slice` tokens.
int64_t sample_shared_bytes(int32_t slice);

// --- sampling_greedy.cu ---
// A call whose every row only takes the argmax (kSampleGreedy alone, no edits, no logprobs):
// launch_sample's results, field for field, from one lean pass. Up to kGreedyParamRows rows'
// logits rows travel in the launch itself (host_rows), so such a call uploads nothing.
inline constexpr int32_t kGreedyParamRows = 64;
inline bool greedy_row_is_lean(const DeviceSampleRow& r) {
  return r.flags == kSampleGreedy && r.edit_begin == r.edit_end && r.n_logprobs < 0 &&
         r.mask_word < 0;
}
struct GreedySampleLaunch {
  const void* logits = nullptr;
  DType dtype = DType::kBF16;
  int64_t ld = 0;
  int32_t vocab = 0;
  int32_t n_rows = 0;
  // The rows on the host when n_rows <= kGreedyParamRows (their logits rows travel in the
  // launch); else `rows`, on the device.
  const DeviceSampleRow* host_rows = nullptr;
  const DeviceSampleRow* rows = nullptr;
  DeviceSampleResult* results = nullptr;
  int32_t* handover = nullptr;  // as SampleLaunch::handover
  // greedy_sample_scratch_bytes(scratch_rows) bytes, zeroed once when allocated (the kernel
  // leaves its counters at zero); scratch_rows >= n_rows. Calls on one stream may share it.
  void* scratch = nullptr;
  int32_t scratch_rows = 0;
  int n_sms = 0;
};
int64_t greedy_sample_scratch_bytes(int32_t rows);
void launch_greedy_sample(const GreedySampleLaunch& l, cudaStream_t stream);

// Backend::take_sampled_tokens: every negative tokens[i] becomes sampled_token_for(tokens[i],
// results, n_rows) (device_sample.h).
void launch_take_sampled_tokens(int32_t* tokens, int64_t n, const DeviceSampleResult* results,
                                int32_t n_rows, cudaStream_t stream);

}  // namespace pagellm::cuda
