// Dense GEMM for matmul(): out[n, M] = x[n, K] . w[M, K]^T (+ bias), through cuBLASLt for bf16
// weights (fp32 compute, bf16 or f32 out) or, for decode-sized n, the GEMV kernel of gemv.cu when
// it measures faster on the shape, and a plain tiled kernel for weight types cuBLASLt cannot pair
// with bf16 activations (f32, f16).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels.h"

namespace pagellm::cuda {

// Strided batching of one GEMM plan: `count` entries, each operand's entries `stride_*` elements
// apart. count 1 is a plain GEMM.
struct GemmBatch {
  int64_t count = 1;
  int64_t stride_x = 0, stride_w = 0, stride_out = 0;
};

class Gemm {
 public:
  // The 32 MiB workspace is what cuBLASLt's larger Hopper kernels ask for (split-K, stream-K).
  static constexpr size_t kWorkspaceBytes = 32u << 20;

  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x bf16 [n, K] (row stride ldx); w [M, K]; out bf16 or f32 [n, M] (row stride ldo, e.g. a
  // column slice of a wider buffer); bias [M] or null.
  void run(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
           const RowView& out);

  // out += x . w^T (+ bias): the same choice of kernel as run(), with the product added in its
  // epilogue (cuBLASLt's beta = 1, the GEMV's add, the tiled kernel's). A shape's first call times
  // its candidates into `scratch` (out's shape), which it may overwrite, never into out.
  void run_add(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
               const RowView& out, const RowView& scratch);

  // Whether run() on these operands streams them through the GEMV kernel (choosing on a shape's
  // first call, as run() would, which may write out): the backend's fused decode projections
  // (norm in, SwiGLU or add out) apply exactly where the plain product would be a GEMV.
  bool uses_gemv(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                 const RowView& out);

  // out[b] = x[b] . w[b]^T for b < batch, in one strided-batched cuBLASLt call: entry b of each
  // operand starts b * its batch stride (in elements; 0 repeats the operand) after the row view,
  // which describes entry 0. w bf16; out bf16 or f32. One or two rows run the batched GEMV (as
  // run() does); shapes cuBLASLt has no algorithm for run the tiled kernel once per entry.
  void run_batched(const RowView& x, int64_t x_batch_stride, const RowView& w,
                   int64_t w_batch_stride, const RowView& out, int64_t out_batch_stride,
                   int64_t batch);

  // Loads, now, the cuBLASLt kernels that later run(), run_add() or run_batched() calls of the
  // shapes seen so far (above the GEMV's rows) may take for up to max_rows rows of x, so that no
  // step pays for one: cuBLASLt's first call of a kernel holds the host 3-4 ms while it loads it.
  // Row counts are cut into buckets; the heuristic's kernel for each bucket's top runs once, on
  // kPreloadRows rows of scratch against the shape's own weights. A later row count runs its
  // bucket's kernel first, then (refine_plans) the heuristic's own choice when that kernel has
  // run before, and otherwise its bucket's still. Call it after a step of every shape (the
  // engine's profile step), before the memory is handed out. PAGELLM_GEMM_PRELOAD=0 turns it off.
  void preload_kernels(int64_t max_rows);

  // After preload_kernels, a row count first seen on a step's path runs its bucket's loaded
  // kernel at once: cuBLASLt's heuristic takes 120-210 us a query on an H200, and a prompt
  // routed over many experts (a plan per expert's row count) queried hundreds per step. The
  // exact plan is made here instead, one query at a time while `busy` (the stream the step was
  // queued on) still has work, so it costs no step time; the next call of that row count takes
  // the heuristic's choice if its kernel is loaded (settle_algo's rule). True while plans remain
  // to refine. A graph recording refines a plan it meets at once, so no recording keeps a
  // bucket's kernel.
  bool refine_plans(cudaStream_t busy);

  // Number of cached plans (one per distinct problem shape, strides and alignments).
  size_t n_plans() const { return plans_.size() + batched_plans_.size(); }

  // cuBLASLt's algorithms for run()'s product on these operands (no bias), in its heuristic's
  // order, at most `max`: the first is the one run() takes. For benchmarks that time them all
  // (bench/micro/cuda_gemm_bench); empty when cuBLASLt has none.
  std::vector<cublasLtMatmulAlgo_t> candidates(const RowView& x, const RowView& w,
                                               const RowView& out, int max);
  // run()'s product through cuBLASLt with one of those algorithms instead of the chosen one.
  void run_candidate(const RowView& x, const RowView& w, const RowView& out,
                     const cublasLtMatmulAlgo_t& algo);

 private:
  // Everything cuBLASLt's choice depends on: shape, strides, types and pointer alignments.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, uint32_t,
                         uint32_t, uint32_t, uint32_t>;
  // The same for batched products: shape, strides, out type, batch count and batch strides, and
  // the alignments of every entry's start.
  using BatchedKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t,
                                int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>;

  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool bias_in_epilogue = false;  // otherwise added by a separate kernel
    bool use_fallback = false;      // cuBLASLt had no algorithm: the tiled kernel runs instead
    bool use_gemv = false;          // decode-sized n: gemv.cu measured faster than cuBLASLt
    bool provisional = false;       // its bucket's algorithm until refine_plans() queries its own
  };
  struct Shape;  // what a plan's kernel depends on, below the preload's members
  // For n <= kGemvMaxRows: times cuBLASLt's plan and the GEMV kernel on this call's buffers (a few
  // runs each, on the first call of a shape, which the engine makes op by op before recording
  // graphs) and keeps the faster. During a graph recording it cannot time, and keeps cuBLASLt.
  void choose_gemv(Plan& p, const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                   const RowView& out);
  void run_plan(const Plan& p, const RowView& x, const RowView& w, const void* bias,
                DType bias_dtype, const RowView& out, bool accumulate = false);
  // plan_for(), with the GEMV-or-cuBLASLt choice made when the plan is new: by rule for one or
  // two rows, otherwise timed into timing_out (a buffer with out's shape, strides and alignment
  // the candidates may overwrite; null: no timing, cuBLASLt stays).
  Plan& chosen_plan(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                    const RowView& out, const RowView* timing_out);
  Plan& plan_for(const RowView& x, const RowView& w, const void* bias, DType bias_dtype,
                 const RowView& out);
  // The plan's descriptors and the heuristic's first algorithm; with `all`, its first `want`
  // algorithms too. False when it has none.
  bool try_make_plan(Plan& p, const RowView& x, const RowView& w, const void* bias,
                     DType bias_dtype, const RowView& out, const uint32_t align[4],
                     const GemmBatch& batch = GemmBatch{}, int want = 1,
                     std::vector<cublasLtMatmulAlgo_t>* all = nullptr);
  // try_make_plan's two halves: the descriptors (the bias epilogue when bias is set), then the
  // heuristic's first `want` algorithms for them (false: none; p is left as it was).
  void make_descriptors(Plan& p, const RowView& x, const RowView& w, const void* bias,
                        DType bias_dtype, const RowView& out, const GemmBatch& batch);
  bool query_algos(const Plan& p, const uint32_t align[4], int want,
                   std::vector<cublasLtMatmulAlgo_t>& algos);
  // A new plan for n rows of a preloaded shape (`shape`, shape_of's for these operands), on its
  // bucket's loaded kernel without asking the heuristic; the caller keeps it with
  // keep_provisional(). False (p untouched) when the shape has no fitting bucket: the caller
  // plans as before preloading.
  bool plan_from_bucket(Plan& p, const RowView& x, const RowView& w, const void* bias,
                        DType bias_dtype, const RowView& out, const GemmBatch& batch,
                        const Shape& shape);
  // A plan being recorded into a graph is refined first (Plan::provisional).
  void refine_if_capturing(Plan& p);
  static void destroy(Plan& p);
  // Whether `algo` runs p's exact shape (cublasLtMatmulAlgoCheck) within the workspace.
  bool algo_fits(const Plan& p, const cublasLtMatmulAlgo_t& algo);

  // A shape run(), run_add() or run_batched() has planned above the GEMV's rows: everything of a
  // plan's key but the row count, and the weights and bias of its first plan (the model's, alive
  // as long as the backend's user), for preload_kernels; then the algorithm it chose for each
  // bucket.
  struct BucketAlgo {
    cublasLtMatmulAlgo_t algo;
    bool bias_in_epilogue;
  };
  struct Shape {
    int64_t k_dim = 0, m_dim = 0, ldx = 0, ldw = 0, ldo = 0;
    DType out_dtype = DType::kBF16, bias_dtype = DType::kF32;
    const void* w = nullptr;
    const void* bias = nullptr;
    uint32_t align[4] = {};
    int64_t batch = 1, stride_x = 0, stride_w = 0, stride_out = 0;  // GemmBatch's
    bool operator==(const Shape& o) const;
  };
  static Shape shape_of(const RowView& x, const RowView& w, const RowView& out, const void* bias,
                        DType bias_dtype, const uint32_t align[4], const GemmBatch& batch);
  struct KnownShape {
    Shape shape;
    std::map<int64_t, BucketAlgo> buckets;  // by the bucket's top row count
  };
  std::vector<KnownShape> shapes_;
  KnownShape* find_shape(const Shape& shape);  // null when not yet seen
  // What picks a cuBLASLt kernel: an algorithm's bytes, and what else is compiled in.
  struct KernelKey {
    cublasLtMatmulAlgo_t algo;
    DType out_dtype, bias_dtype;
    bool bias_in_epilogue, batched;
    bool operator==(const KernelKey& o) const;
  };
  static KernelKey kernel_of(const Plan& p, const Shape& s);
  bool loaded(const KernelKey& k) const;
  // Records a new cuBLASLt plan's shape and kernel (n rows of x); once the shape's buckets are
  // planned, a plan whose kernel has never run takes its bucket's instead.
  void settle_algo(Plan& p, const Shape& shape, int64_t n);
  std::vector<KernelKey> loaded_;  // the kernels run so far
  // Plans made from a bucket, oldest first, for refine_plans() (the maps' nodes never move).
  struct PendingPlan {
    Plan* plan;
    Shape shape;
  };
  // Queues `kept`, a plan from plan_from_bucket now in one of the maps, for refine_plans().
  Plan& keep_provisional(Plan& kept, const Shape& shape);
  // The heuristic's own choice for a provisional plan, kept if its kernel is loaded.
  void refine(Plan& p, const Shape& shape);
  std::vector<PendingPlan> pending_;
  size_t pending_head_ = 0;  // pending_[0, head) are refined

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  // choose_gemv's L2 flush buffer (twice the L2), made at the first timing and kept: shapes are
  // timed one after another during warm-up, and a cudaFree per shape would wait for the device.
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  std::map<Key, Plan> plans_;
  std::map<BatchedKey, Plan> batched_plans_;
};

}  // namespace pagellm::cuda
