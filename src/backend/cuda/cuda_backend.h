// The CUDA backend: the Backend op interface (backend/backend.h) on one NVIDIA GPU, Hopper (sm_90a)
// first, Ampere (sm_80) supported.
//
// - Activations, the residual stream and the paged KV cache are bf16. Like vLLM, the residual
//   stream is kept in bf16: add_rms_norm rounds residual + x to bf16 before normalizing, while
//   every reduction (norm sums, GEMM, attention softmax) accumulates in fp32.
// - All work is queued on one non-default stream owned by the backend; ops are asynchronous and
//   copy_to_host / synchronize wait. The backend is used from one thread at a time (the engine
//   loop), and that thread's current device must be the backend's (set by the constructor).
// - Weights: upload_weight converts f32/f16/bf16 to the requested float type on the device. The
//   4-bit group types (AWQ, GPTQ, compressed-tensors) and GGUF's Q4_0 stay 4-bit, repacked into
//   the layout of int4_gemm.cu, and FP8 weights stay FP8 in fp8_gemm.cu's (cuda_quantized.cpp);
//   the other block formats are dequantized to bf16 on upload. matmul reads bf16 weights through
//   cuBLASLt or the GEMV, kept quantized ones through their format's GEMV or dequantized slices,
//   and f32/f16 weights through a plain tiled kernel.
// - Preconditions of ops (shapes, dtypes, devices) are CHECKed: a violation is a programmer error.
//   CUDA/cuBLAS failures abort with the failing call, file and line (cuda_check.h).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace pagellm::cuda {

class Gemm;
class Fp8Matmul;
struct MoeWorkspace;

// Whether PAGELLM_ABLATE_OPS names the op (a Backend method's name): it then returns at once,
// launching nothing, so that a benchmark measures what the op costs in place. For timing only.
bool ablated(std::string_view op);

class CudaBackend final : public Backend {
 public:
  // Opens `device_index`; an error when there is no such device or the runtime cannot start.
  static Result<std::unique_ptr<CudaBackend>> create(int device_index);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kBF16; }

  std::unique_ptr<Buffer> allocate(int64_t nbytes) override;
  int64_t free_memory() const override;
  void copy_from_host(void* dst, const void* src, int64_t nbytes) override;
  void copy_to_host(void* dst, const void* src, int64_t nbytes) override;
  void copy(void* dst, const void* src, int64_t nbytes) override;
  void synchronize() override;
  void preload_kernels(int64_t max_tokens) override;
  bool background_work() override;
  Result<Tensor> upload_weight(const Tensor& host, DType dtype,
                               std::unique_ptr<Buffer>& storage) override;
  DType quantized_storage(DType host, int64_t rows, int64_t cols) const override;
  // Folds with PAGELLM_GEMV_FUSIONS's "fold" (off by default; cuda_backend.cpp says why) and bf16
  // w; the weight of ones it returns is one buffer per width, which fused_gemv recognizes by its
  // address.
  Tensor fold_norm_weight(const Tensor& g, Tensor& w) override;
  std::unique_ptr<OpGraph> capture(const std::function<void()>& record) override;
  uint64_t allocation_epoch() const override { return epoch_->load(); }
  // A second stream with its own cuBLASLt workspace: begin_side() swaps it (and its Gemm) in for
  // the main stream, so every op of the branch queues there unchanged; events fork it from and
  // join it to the main stream (graph capture follows them into the side stream).
  void begin_side() override;
  void end_side() override;
  void join_side() override;

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                    Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) override;
  // The fused projections: matmul_add adds in the product's epilogue (the GEMV's at decode
  // sizes, cuBLASLt's beta = 1 otherwise). Where matmul() would run the GEMV, the GEMV can also
  // normalize x on the way in and apply SwiGLU (PAGELLM_GEMV_FUSIONS, see gemv_fusions in
  // cuda_backend.cpp); otherwise the norm and SwiGLU run as their own kernels around the product.
  void matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& scratch,
                  Tensor& out) override;
  void matmul_swiglu(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& gate_up,
                     Tensor& out) override;
  void rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                       const Tensor& bias, Tensor& h, Tensor& out) override;
  void rms_norm_swiglu(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                       const Tensor& bias, Tensor& h, Tensor& gate_up, Tensor& out) override;
  // One row through the whole chain: one launch of the streamed chain (gemv_stream.cu) when
  // every link fits it (PAGELLM_STREAM_CHAIN=0 turns it off); otherwise the links one by one.
  void projection_chain(const std::vector<ProjectionLink>& links) override;
  // One strided-batched cuBLASLt GEMM for bf16 weights; f32/f16 weights run the tiled kernel per
  // batch entry.
  void batched_matmul(const Tensor& x, const Tensor& w, Tensor& out) override;
  void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos_sin, bool interleaved,
                     const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache, float k_scale,
                     float v_scale) override;
  void rope(Tensor& x, const Tensor& cos_sin, bool interleaved) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const AttentionMeta& meta, const AttentionParams& params, Tensor& out) override;
  // The latent kernel's merge of the splits applies w when it splits (attention_mla.cu's
  // mla_merge_project_kernel); otherwise attention() then batched_matmul().
  void attention_project(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const AttentionMeta& meta, const AttentionParams& params, const Tensor& w,
                         Tensor& attn, Tensor& out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void to_f32(const Tensor& x, Tensor& out) override;
  void fill_random(Tensor& t, uint64_t seed, float lo, float hi) override;
  // Mixture of experts (cuda_moe.cpp, kernels in moe.cu and moe_gemm.cu): routing on the device;
  // the experts by grouped GEMVs for decode-sized steps, grouped tensor-core GEMMs for larger ones,
  // per-expert cuBLASLt GEMMs for large eager steps (moe.h). Every step size can be recorded.
  void moe_route(const Tensor& logits, const Tensor& correction_bias, const MoeRouteParams& p,
                 Tensor& ids, Tensor& weights) override;
  void moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                   const MoeExpertWeights& experts, const Tensor& shared, Tensor& out) override;
  // The sort of moe_experts as its own op (moe.h's "order"), and moe_experts taking it.
  int64_t moe_order_bytes(int64_t n_pairs, int64_t n_experts) const override;
  void moe_order(const Tensor& ids, int64_t n_experts, Tensor& order) override;
  void moe_experts_ordered(const Tensor& h, const Tensor& ids, const Tensor& weights,
                           const Tensor& order, const MoeExpertWeights& experts,
                           const Tensor& shared, Tensor& out) override;
  // moe_experts() on a chosen path (tests and benchmarks run each on every shape); kAuto chooses
  // as moe_experts() does. kExpertGemm waits for the host, so it cannot be recorded. kGemv makes
  // a one-token step's down products and combine in one kernel where it can; kGemvApart keeps
  // them two (what that kernel must equal bit for bit). Quantized experts have their format's
  // grouped GEMV (kGemv, kGemvApart and kGroupedGemm name it) and kExpertGemm. order: made by
  // moe_order, or null to sort here.
  enum class MoePath { kAuto, kGemv, kGemvApart, kGroupedGemm, kExpertGemm };
  void moe_experts_on_path(const Tensor& h, const Tensor& ids, const Tensor& weights,
                           const MoeExpertWeights& experts, const Tensor& shared, Tensor& out,
                           MoePath path, const Tensor* order = nullptr);
  // CUDA events on stream() (backend/cuda/op_timer.cpp).
  std::unique_ptr<OpTimer> make_op_timer() override;
  // Device sampling (sampling.cu).
  bool supports_sampling() const override { return true; }
  void sample(const Tensor& logits, const DeviceSampleInputs& in, DeviceSampleResult* out) override;
  uint64_t sample_async(const Tensor& logits, const DeviceSampleInputs& in) override;
  void sample_results(uint64_t ticket, DeviceSampleResult* out) override;
  void take_sampled_tokens(Tensor& tokens, uint64_t ticket) override;
  // sample() with the blocks per row fixed (tests and benchmarks exercise every layout); 0 chooses
  // from the shape, as sample() does.
  void sample_with_group(const Tensor& logits, const DeviceSampleInputs& in,
                         DeviceSampleResult* out, int group);

  // The stream all ops are queued on (for CUDA graph capture and events).
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_; }
  int n_sms() const { return n_sms_; }

 private:
  explicit CudaBackend(int device_index);

  // Small host<->device copies go through a ring of pinned slots: the host copy into pinned memory
  // returns at once and the DMA runs asynchronously. A slot is reused only after the event of
  // its previous copy has fired (kSlots copies ago, so this rarely waits).
  static constexpr int64_t kSlotBytes = 256 << 10;
  static constexpr int kSlots = 16;
  // Device staging for weight conversion on upload, in chunks of whole rows.
  static constexpr int64_t kUploadChunkBytes = 64 << 20;
  // The bf16 slice a quantized weight is dequantized into for products past its GEMV's rows,
  // mostly still in L2 (50 MB on the H100 and H200) when cuBLASLt reads it. Llama-3-8B's
  // 512-token prefill on the H100: 26.5 ms with 16 MB slices (down_proj's 576 rows make narrow
  // GEMMs), 20.6 ms with 32 MB, 20.5 ms with 48 MB.
  static constexpr int64_t kQuantSliceBytes = 32 << 20;

  // matmul()'s operands, checked: x, w and out as row views and the bias pointer and type.
  struct MatmulOperands {
    RowView x, w, out;
    const void* bias = nullptr;
    DType bias_dtype = DType::kF32;
  };
  MatmulOperands matmul_operands(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Tensor& out, const char* op) const;
  // The fused GEMV of matmul_swiglu / rms_norm_matmul / rms_norm_swiglu when it applies
  // (decode-sized n, bf16 weights the plain product would stream through the GEMV, an f32 norm
  // weight, a folded one's weight of ones, or none); false when the caller must run the steps
  // apart. `product` is the buffer matmul() would write.
  bool fused_gemv(const Tensor& x, const Tensor* norm_w, float eps, const Tensor& w,
                  const Tensor& bias, const Tensor& product, GemvEpilogue epilogue, Tensor& out);
  // Whether norm_w is a weight of ones fold_norm_weight handed out.
  bool is_unit_norm(const Tensor& norm_w) const;
  // attention()'s operands, checked, as the kernels' arguments.
  AttentionArgs attention_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const AttentionMeta& meta, const AttentionParams& params,
                               const Tensor& out) const;
  // The latent kernel with its workspace, and proj (may be null) taken into its merge.
  void run_attention_mla(const AttentionArgs& a, int64_t n_tokens, const MlaProjection* proj);
  // rms_norm's checks and launch; release_early as launch_rms_norm's (kernels.h).
  void run_rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out, bool release_early);

  // Weights kept quantized (kept_quantized: cuda_quantized.cpp): upload_weight's repacking,
  // fill_random's, and the products of matmul (add_scratch null) and matmul_add (its scratch).
  Result<Tensor> upload_kept(const Tensor& host, DType dtype, std::unique_ptr<Buffer>& storage);
  void fill_random_kept(Tensor& t, uint64_t seed, float lo, float hi);
  void kept_matmul(const MatmulOperands& m, const Tensor* add_scratch);
  // kept_matmul's product past its GEMV and FP8 GEMM: rows [first_row, first_row + m.w.n_rows)
  // of the kept weight of total_rows rows at m.w.data (a stacked expert's, for FP8 whose scales
  // interleave), dequantized a slice at a time into the bf16 scratch, each slice through cuBLASLt.
  void sliced_matmul(const MatmulOperands& m, int64_t total_rows, int64_t first_row,
                     const Tensor* add_scratch);
  // The slices of both streams (and the FP8 GEMMs where the device has FP8 tensor cores),
  // made with the first quantized weight.
  void ensure_quant_slices();
  // Logs once that FP8 weights take the bf16 GEMM past the GEMV (a device without FP8 tensor
  // cores, sm_80).
  void note_fp8_without_tensor_cores();
  // Fp8Matmul's scratch for x quantized on the stream in use, grown like the MoE workspace (a
  // recording cannot grow it).
  void* ensure_fp8_scratch(int64_t nbytes);

  int next_slot();
  void* ensure_upload_staging(int64_t nbytes);
  void* ensure_attention_workspace(int64_t nbytes);
  // The decode kernel's arrival counters (attention_counters in kernels.h): zeroed when allocated,
  // left zero by every launch; grown like the workspaces.
  int32_t* ensure_attention_counters(int64_t count);
  // The MoE scratch (moe.h's MoeWorkspace), grown like the attention workspace; a recording that
  // would need it larger fails with a CHECK naming the cause.
  void* ensure_moe_workspace(int64_t nbytes);
  // `buf` at least nbytes long: reallocated (to at least twice its size) when shorter, which a
  // graph recording cannot do (a CHECK naming op and what). For the grown-on-demand workspaces.
  void* grow_workspace(std::unique_ptr<Buffer>& buf, int64_t nbytes, const char* op,
                       const char* what);
  // The routed experts' products of moe_experts() on its two GEMM paths (cuda_moe.cpp).
  void moe_grouped_gemms(const Tensor& h, const Tensor& gu, const Tensor& dn,
                         const MoeWorkspace& ws, int64_t n_pairs);
  void moe_expert_gemms(const Tensor& h, const Tensor& gu, const Tensor& dn,
                        const MoeWorkspace& ws);
  // The same with quantized experts through their format's grouped GEMV (moe.h, MoeKeptGemv).
  void moe_kept_gemvs(const Tensor& h, const Tensor& gu, const Tensor& dn, const MoeWorkspace& ws,
                      int64_t max_active, int64_t max_tokens, int64_t n_pairs);

  // Shared with the buffers this backend hands out, which bump it when they free their memory
  // (they may outlive the backend, hence shared ownership).
  std::shared_ptr<std::atomic<uint64_t>> epoch_ = std::make_shared<std::atomic<uint64_t>>(0);
  int device_ = 0;
  int n_sms_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  // The side branch's stream and Gemm (swapped with stream_ and gemm_ while a branch is open),
  // and the events that fork and join it.
  cudaStream_t side_stream_ = nullptr;
  std::unique_ptr<Gemm> side_gemm_;
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  enum class Side { kNone, kOpen, kEnded } side_ = Side::kNone;
  // Moves side_ from `from` (else CHECK-fails with `misuse`) to `to`.
  void advance_side(Side from, Side to, const char* misuse);
  // Swaps the side stream and its Gemm with the main ones (in at begin_side, out at end_side).
  void swap_side();
  char* pinned_ = nullptr;  // kSlots * kSlotBytes
  std::array<cudaEvent_t, kSlots> slot_events_{};
  int slot_ = 0;
  void* upload_staging_ = nullptr;
  int64_t upload_staging_bytes_ = 0;
  void* attn_workspace_ = nullptr;
  int64_t attn_workspace_bytes_ = 0;
  std::unique_ptr<Buffer> attn_counters_;  // freeing it moves the allocation epoch
  std::unique_ptr<Buffer> moe_workspace_;  // freeing it moves the allocation epoch
  // kept_matmul's bf16 slice for the stream in use, and the other stream's (swapped with it).
  std::unique_ptr<Buffer> quant_slice_, side_quant_slice_;
  // FP8 weights' GEMMs past the GEMV (null without FP8 tensor cores) and their activation
  // scratch, for the stream in use and the other stream's (swapped with them).
  std::unique_ptr<Fp8Matmul> fp8_matmul_, side_fp8_matmul_;
  std::unique_ptr<Buffer> fp8_scratch_, side_fp8_scratch_;
  bool fp8_fallback_noted_ = false;        // note_fp8_without_tensor_cores has logged
  std::vector<int32_t> moe_offsets_;       // host copy of the per-expert offsets (kExpertGemm)
  std::map<int64_t, std::unique_ptr<Buffer>> unit_norms_;  // fold_norm_weight's ones, by width
  std::unique_ptr<Buffer> chain_counter_;  // launch_gemv_stream_chain's grid-wide count
  // PAGELLM_CHAIN_TIMES=1: the chain's phase times (StreamChainTimes), and each launch length's
  // phases as the first launch of that length had them, logged when the backend is destroyed.
  std::unique_ptr<Buffer> chain_times_;
  std::array<std::vector<std::string>, kMaxStreamPhases + 1> chain_phase_names_;
  void log_chain_times();
  bool cluster_ok_ = false;  // sm_90: thread-block clusters
  // Device sampling. A call's rows and edits go up and its results come back through one of
  // kSampleSlots pinned host areas and device areas (grown on demand), so a call can be queued
  // while the one before is unread (sample_async). Both copies run on a stream of their own:
  // the rows go up while the step still runs, and the step after the sampling kernel need not
  // wait for the results' trip to the host.
  struct SampleSlot {
    char* host = nullptr;
    char* dev = nullptr;
    int64_t bytes = 0;
    uint64_t ticket = 0;  // the call using it; 0: none yet
    int32_t n_rows = 0;
    int64_t edits_offset = 0;    // of the edits, in the device area
    int64_t masks_offset = 0;    // of the grammar masks, in the device area
    int64_t results_offset = 0;  // of the results, in both areas
    cudaEvent_t uploaded = nullptr, sampled = nullptr, done = nullptr;
  };
  SampleSlot& sample_slot(uint64_t ticket);
  uint64_t enqueue_sample(const Tensor& logits, const DeviceSampleInputs& in, int group);
  // A call's rows (at 0), edits (at edits_offset) and masks (at masks_offset) up to `slot`'s
  // device area on the sampling stream; the main stream waits for them.
  void upload_sample_rows(const SampleSlot& slot, const DeviceSampleInputs& in);
  // The general sampling kernel over a call's inputs, uploaded to `slot`.
  void launch_sample_rows(const Tensor& logits, int64_t vocab, const SampleSlot& slot,
                          DeviceSampleResult* results, int32_t n_rows, int32_t* handover,
                          int group);
  // The lean argmax kernel over rows that all satisfy greedy_row_is_lean (kernels.h).
  void launch_greedy_rows(const Tensor& logits, int64_t vocab, const DeviceSampleRow* rows,
                          int32_t n_rows, const SampleSlot& slot, DeviceSampleResult* results,
                          int32_t* handover);
  std::array<SampleSlot, kSampleSlots> sample_slots_;
  uint64_t sample_tickets_ = 0;
  cudaStream_t sample_stream_ = nullptr;
  // Where every sampling call of up to kHandoverRows rows leaves its tokens for the next step's
  // embedding (kernels.h: launch_embedding), and the ticket of the call that wrote it last (0:
  // the last call did not). Allocated once, so recorded graphs keep its address.
  static constexpr int32_t kHandoverRows = 4096;
  int32_t* handover_ = nullptr;
  uint64_t handover_ticket_ = 0;
  // The lean argmax kernel's scratch (launch_greedy_sample), for greedy_rows_ rows.
  void* greedy_scratch_ = nullptr;
  int32_t greedy_rows_ = 0;
};

}  // namespace pagellm::cuda
