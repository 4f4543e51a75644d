// ProfilingBackend: a Backend that forwards every call to an inner backend and, while recording,
// brackets each op with two timestamps on the inner backend's own timeline (its OpTimer: CUDA
// events on the GPU, the steady clock on the CPU) and notes the op's cost model — bytes moved and
// flops computed, from its tensors' shapes and dtypes (op_cost below). Results are the inner
// backend's, bit for bit: the decorator never touches data.
//
// Ops run one by one as the model issues them: the decorator records no graphs (capture returns
// null, so the engine runs each op directly), since a replay would carry the timestamps along and
// hide each op's own time; the profiled step is the eager one. Timing costs host time per op
// (two timestamps, and the cost model's shape key), which widens launch gaps but not the
// bracketed device time; compare the summed op time with an unprofiled step's wall time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/op_profile.h"

namespace pagellm {

// The cost model of each op: name, shape key, bytes and flops (ms left 0). Bytes are the op's
// minimum memory traffic: every input read once and every output written once, at the storage
// size of its dtype (a quantized weight counts its blocks, scales included); an in-place operand
// counts as read and written. Flops are counted for matmul and attention only; the other ops
// are data movement, judged by their bandwidth.
namespace op_cost {

OpSample embedding(const Tensor& table, const Tensor& ids, const Tensor& out);
OpSample rms_norm(const Tensor& x, const Tensor& w, const Tensor& out);
OpSample add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& out);
// 2 n m k flops for x [n, k] @ w[m, k]^T; bytes: the weight, x, out and the bias.
OpSample matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);
// The fused projections count what their fused form moves: the weights, x, the norm weight and
// out (matmul_add reads out too); a backend running them as separate passes moves more, which
// shows as fewer GB/s. `op` names the Backend method (rms_norm_matmul or rms_norm_swiglu;
// matmul_swiglu, with no norm weight).
OpSample matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);
OpSample rms_norm_matmul(const char* op, const Tensor& x, const Tensor& norm_w, const Tensor& w,
                         const Tensor& bias, const Tensor& out);
// 2 B n m k flops for B products x[b] [n, k] @ w[b] [m, k]^T; bytes: the weights, x and out (a
// batch stride of 0 reads its operand once).
OpSample batched_matmul(const Tensor& x, const Tensor& w, const Tensor& out);
OpSample rope_store_kv(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos_sin,
                       const Tensor& slot_mapping, const Tensor& k_cache, const Tensor& v_cache);
OpSample rope(const Tensor& x, const Tensor& cos_sin);
// KV bytes are those of meta.total_kv_tokens (each sequence's cache read once); flops are
// 2 (D + Dv) per query head and query-key pair (meta.total_qk_pairs). A V cache that is a column
// view of the K cache's rows (MLA's latent cache) is not counted twice.
OpSample attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                   const AttentionMeta& meta, const Tensor& out);
OpSample attention_project(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           const AttentionMeta& meta, const Tensor& w, const Tensor& attn,
                           const Tensor& out);
OpSample silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
OpSample add(const Tensor& a, const Tensor& b, const Tensor& out);
OpSample gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out);
OpSample to_f32(const Tensor& x, const Tensor& out);
// Router logits read, ids and weights written.
OpSample moe_route(const Tensor& logits, const Tensor& ids, const Tensor& weights);
// The activations, routing and outputs, plus the weights of min(E, n K) experts: which experts a
// step touches is known only on the device, so this is the bound (exact at batch 1, where the K
// experts are distinct). Flops: 6 D F per (token, expert) pair (gate, up and down products).
OpSample moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                     const MoeExpertWeights& experts, const Tensor& shared, const Tensor& out);
// The pairs' ids read, the grouping written.
OpSample moe_order(const Tensor& ids, const Tensor& order);
OpSample fill_random(const Tensor& t);
// The logits rows it samples from (a row sampled twice, n > 1, is read twice), the rows and edits
// going up and the results coming back.
OpSample sample(const Tensor& logits, const DeviceSampleInputs& in);
// Host<->device copies count the bytes that cross the bus; a device copy counts them read and
// written (the convention of measure_memory_bandwidth_gbs).
OpSample copy_from_host(int64_t nbytes);
OpSample copy_to_host(int64_t nbytes);
OpSample copy(int64_t nbytes);

}  // namespace op_cost

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner);

  Backend& inner() { return *inner_; }

  // Starts recording (dropping anything recorded before). Ops are forwarded whether or not
  // recording is on; off, they cost one extra virtual call.
  void start();
  // Stops recording, waits for the backend, and returns the ops run since start(), in order,
  // with their times. A long recording (a whole serving run) keeps at most kFlushOps ops' timer
  // marks outstanding: past that, the next op first waits for the backend and reads their times.
  std::vector<OpSample> stop();
  static constexpr size_t kFlushOps = 4096;
  bool recording() const { return recording_; }

  std::string name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }

  std::unique_ptr<Buffer> allocate(int64_t nbytes) override { return inner_->allocate(nbytes); }
  int64_t free_memory() const override { return inner_->free_memory(); }
  void copy_from_host(void* dst, const void* src, int64_t nbytes) override;
  void copy_to_host(void* dst, const void* src, int64_t nbytes) override;
  void copy(void* dst, const void* src, int64_t nbytes) override;
  void synchronize() override { inner_->synchronize(); }
  void preload_kernels(int64_t max_tokens) override { inner_->preload_kernels(max_tokens); }
  bool background_work() override { return inner_->background_work(); }
  Result<Tensor> upload_weight(const Tensor& host, DType dtype,
                               std::unique_ptr<Buffer>& storage) override {
    return inner_->upload_weight(host, dtype, storage);
  }
  DType quantized_storage(DType host, int64_t rows, int64_t cols) const override {
    return inner_->quantized_storage(host, rows, cols);
  }
  Tensor fold_norm_weight(const Tensor& g, Tensor& w) override {
    return inner_->fold_norm_weight(g, w);
  }
  std::unique_ptr<OpGraph> capture(const std::function<void()>& record) override {
    (void)record;
    return nullptr;  // see the top of this file
  }
  uint64_t allocation_epoch() const override { return inner_->allocation_epoch(); }

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                    Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) override;
  void matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& scratch,
                  Tensor& out) override;
  void matmul_swiglu(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& gate_up,
                     Tensor& out) override;
  void rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                       const Tensor& bias, Tensor& h, Tensor& out) override;
  void rms_norm_swiglu(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                       const Tensor& bias, Tensor& h, Tensor& gate_up, Tensor& out) override;
  void batched_matmul(const Tensor& x, const Tensor& w, Tensor& out) override;
  void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos_sin, bool interleaved,
                     const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache, float k_scale,
                     float v_scale) override;
  bool supports_fp8_kv_cache() const override { return inner_->supports_fp8_kv_cache(); }
  void round_to_fp8_cache(Tensor& x, float scale) override { inner_->round_to_fp8_cache(x, scale); }
  void rope(Tensor& x, const Tensor& cos_sin, bool interleaved) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const AttentionMeta& meta, const AttentionParams& params, Tensor& out) override;
  void attention_project(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const AttentionMeta& meta, const AttentionParams& params, const Tensor& w,
                         Tensor& attn, Tensor& out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void to_f32(const Tensor& x, Tensor& out) override;
  void moe_route(const Tensor& logits, const Tensor& correction_bias, const MoeRouteParams& p,
                 Tensor& ids, Tensor& weights) override;
  void moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                   const MoeExpertWeights& experts, const Tensor& shared, Tensor& out) override;
  int64_t moe_order_bytes(int64_t n_pairs, int64_t n_experts) const override {
    return inner_->moe_order_bytes(n_pairs, n_experts);
  }
  void moe_order(const Tensor& ids, int64_t n_experts, Tensor& order) override;
  void moe_experts_ordered(const Tensor& h, const Tensor& ids, const Tensor& weights,
                           const Tensor& order, const MoeExpertWeights& experts,
                           const Tensor& shared, Tensor& out) override;
  void fill_random(Tensor& t, uint64_t seed, float lo, float hi) override;
  bool supports_sampling() const override { return inner_->supports_sampling(); }
  void sample(const Tensor& logits, const DeviceSampleInputs& in, DeviceSampleResult* out) override;
  uint64_t sample_async(const Tensor& logits, const DeviceSampleInputs& in) override;
  void sample_results(uint64_t ticket, DeviceSampleResult* out) override {
    inner_->sample_results(ticket, out);
  }
  void take_sampled_tokens(Tensor& tokens, uint64_t ticket) override {
    inner_->take_sampled_tokens(tokens, ticket);
  }

  std::unique_ptr<OpTimer> make_op_timer() override { return inner_->make_op_timer(); }

 private:
  // Runs `op`; while recording, between two marks, noting cost() (evaluated before the first
  // mark, so building the shape key is not timed).
  template <typename Cost, typename Op>
  void timed(Cost&& cost, Op&& op);

  struct Pending {
    OpSample sample;
    int begin = 0, end = 0;  // timer marks
  };
  std::unique_ptr<Backend> inner_;
  std::unique_ptr<OpTimer> timer_;  // made on the first start()
  // Reads the pending ops' times into done_ (waits for the backend) and frees their marks.
  void flush();

  std::vector<Pending> pending_;
  std::vector<OpSample> done_;  // flushed ops of this recording, in order
  bool recording_ = false;
};

}  // namespace pagellm
