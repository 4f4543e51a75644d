// Backend: the op interface every model is written against. The CPU backend (backend/cpu) is the
// reference: plain loops with fp32 accumulation, plus SIMD/threaded fast paths tested against it.
// The CUDA backend (backend/cuda) implements the same ops on the GPU, with fusions where they pay.
//
// Conventions
// - Tensors are views (core/tensor.h) on this backend's device; the caller owns memory.
// - "act" tensors use activation_dtype() (f32 on CPU, bf16 on CUDA); weights may be any DType,
//   quantized included; metadata tensors are i32.
// - Ops are asynchronous on device backends (ordered on the backend's stream); synchronize()
//   waits. Ops never fail on valid input: preconditions are CHECKed, since user input has been
//   validated before it reaches a step.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/device_sample.h"
#include "core/status.h"
#include "core/tensor.h"

namespace pagellm {

// An owning device allocation.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() const = 0;
  virtual int64_t nbytes() const = 0;
  virtual Device device() const { return Device::kCpu; }
  Tensor view(DType dtype, std::initializer_list<int64_t> shape) const;
};

// Metadata of one ragged batch for attention over the paged KV cache. Sequences are packed back to
// back; sequence s owns query tokens [cu_seqlens_q[s], cu_seqlens_q[s+1]), which are the last
// n_q(s) of its seq_lens_kv[s] tokens (its KV, new tokens included, is already in the cache).
// Query token i of sequence s sits at position seq_lens_kv[s] - n_q(s) + i and attends, causally,
// to KV positions [max(0, pos - window + 1), pos].
struct AttentionMeta {
  int32_t n_seqs = 0;
  Tensor cu_seqlens_q;    // i32 [n_seqs + 1]
  Tensor seq_lens_kv;     // i32 [n_seqs]
  Tensor block_tables;    // i32 [n_seqs, max_blocks_per_seq]; entry j = block of tokens j*bs..
  int32_t block_size = 16;
  int32_t max_seqlen_q = 0;   // host-side bounds, for launch shapes
  int32_t max_seqlen_kv = 0;
  // Host-side totals over the step, for cost accounting (ProfilingBackend): the KV tokens the
  // sequences hold (sum of seq_lens_kv: what one attention call must read per layer), and the
  // query-key pairs the causal mask admits (sum over query tokens of position + 1, before any
  // sliding window). 0 when the builder of the metadata did not count them.
  int64_t total_kv_tokens = 0;
  int64_t total_qk_pairs = 0;
};

struct AttentionParams {
  float scale = 1.0f;       // softmax scale, usually 1/sqrt(head_dim) (times yarn mscale^2)
  int32_t window = -1;      // sliding window in tokens; -1: none
  float softcap = 0.0f;     // tanh soft-capping of scores; 0: none
  // An FP8 cache's (float8_e4m3fn) dequantization: a key is k_scale * e4m3(q), a value v_scale *
  // e4m3(q). Unused by a cache in the activation dtype.
  float k_scale = 1.0f, v_scale = 1.0f;
};

// A recording of ops on a device backend, replayed with one launch (a CUDA graph): the device work
// of a decode step without the host cost of launching each kernel. Replays read and write the same
// addresses as the recording did, with whatever those buffers hold at replay time.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
  virtual void replay() = 0;
};

// Timestamps on a backend's own timeline, for timing ops one by one (ProfilingBackend).
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  // Enqueues a timestamp that is taken once all work queued before it has finished; returns its
  // index: 0, 1, 2, ... since the last reset().
  virtual int mark() = 0;
  // Milliseconds from mark a to mark b. Valid only once the backend has synchronized past b.
  virtual double elapsed_ms(int a, int b) const = 0;
  // Forgets every mark; their resources are reused by the next ones.
  virtual void reset() = 0;
};

// --- mixture of experts ---

// How a router scores experts and picks a token's top_k of them (DeepSeek's scoring_func and
// topk_method; Mixtral is softmax + greedy + norm_topk_prob).
enum class MoeScoreFunc { kSoftmax, kSigmoid };
enum class MoeSelect {
  kGreedy,              // the top_k scores
  kGroupLimitedGreedy,  // the top_k among the topk_group groups with the highest max score (V2)
  kNoauxTc,             // V3: groups ranked by the sum of their top-2 (score + correction bias),
                        // experts by score + bias; the weights are the raw scores
};

struct MoeRouteParams {
  int32_t top_k = 1;
  MoeScoreFunc scoring = MoeScoreFunc::kSoftmax;
  MoeSelect select = MoeSelect::kGreedy;
  int32_t n_group = 1;     // experts split into n_group equal groups, in index order
  int32_t topk_group = 1;  // groups kept (group-limited methods)
  bool norm_topk_prob = false;         // renormalize the chosen weights to sum to 1
  float routed_scaling_factor = 1.0f;  // multiplies the weights last
};

// The routed experts of one MoE layer, each a SwiGLU MLP: x [D] -> down_e(silu(gate_e x) * up_e x)
// with intermediate size F. Device backends read the stacked form (one tensor per kind, so a kernel
// finds expert e at a fixed stride); the CPU also takes the checkpoint's own per-expert matrices,
// mapped without a copy, when the stack is undefined.
struct MoeExpertWeights {
  Tensor gate_up;  // [E, 2F, D]: expert e's F gate rows, then its F up rows
  Tensor down;     // [E, D, F]
  std::vector<Tensor> gate, up, down_each;  // CPU only, per expert: [F, D], [F, D], [D, F]

  bool stacked() const { return gate_up.defined(); }
  int64_t n_experts() const {
    return stacked() ? gate_up.size(0) : static_cast<int64_t>(gate.size());
  }
  int64_t hidden() const {  // D
    return stacked() ? gate_up.size(2) : (gate.empty() ? 0 : gate[0].cols());
  }
  int64_t inter() const {  // F
    return stacked() ? down.size(2) : (gate.empty() ? 0 : gate[0].rows());
  }
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;

  // --- memory ---
  // nbytes of this backend's memory, or null when it is not there (out of memory): the caller
  // reports it, through one of the two below.
  virtual std::unique_ptr<Buffer> allocate(int64_t nbytes) = 0;
  // allocate(), or a resource_exhausted Status "<backend> is out of memory for <what>: 1.2 MiB
  // wanted, 0.4 MiB free": for what a load reports to its caller (weights, and what is made
  // from them).
  Result<std::unique_ptr<Buffer>> allocate_or_error(int64_t nbytes, const std::string& what);
  // allocate(), failing (a CHECK with that message) when the memory is not there: for the scratch
  // and workspaces that a step cannot do without.
  std::unique_ptr<Buffer> must_allocate(int64_t nbytes, const std::string& what);
  // Bytes free for new allocations (device memory; on CPU, available system memory).
  virtual int64_t free_memory() const = 0;
  // Copies between this device and host memory (n bytes). Device backends order these on the
  // backend stream; copy_to_host waits for completion.
  virtual void copy_from_host(void* dst, const void* src, int64_t nbytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, int64_t nbytes) = 0;
  virtual void copy(void* dst, const void* src, int64_t nbytes) = 0;  // device to device
  virtual void synchronize() = 0;
  // Loads, now, kernels that a step of up to max_tokens tokens may pick and that this backend
  // would otherwise load on their first use, for the product shapes the steps run so far have
  // shown (the engine calls it after its profile step). It runs them against those products'
  // weights, which must still be alive. Device backends; by default nothing.
  virtual void preload_kernels(int64_t max_tokens) { (void)max_tokens; }
  // Host work the backend put off to keep it off a step's path (CUDA: the exact GEMM plans of row
  // counts first run on a preloaded kernel), done now for as long as the device is still busy
  // with what is queued, so it only fills time the host would spend waiting. Call it after
  // queuing a step and before waiting for its results. True while such work remains.
  virtual bool background_work() { return false; }
  // Makes a weight usable by this backend: CPU returns the view itself (mmap'd, zero-copy) or a
  // converted copy kept in `storage`; device backends upload. `dtype` is the wanted storage type
  // (e.g. keep Q4_1, or convert f32 to bf16); kF32 for norms and other small vectors.
  virtual Result<Tensor> upload_weight(const Tensor& host, DType dtype,
                                       std::unique_ptr<Buffer>& storage) = 0;
  // The quantized type this backend keeps a [rows, cols] weight stored as `host` (a quantized
  // type) in, to pass to upload_weight; kF32 when it dequantizes such a weight to its float
  // weight type instead. The CPU keeps every type; the CUDA backend the 4-bit group types and
  // Q4_0 where their rows fit its layout.
  virtual DType quantized_storage(DType host, int64_t rows, int64_t cols) const {
    (void)host, (void)rows, (void)cols;
    return DType::kF32;
  }
  // A pre-norm's weight g [D] (f32) and the projection w [M, D] that reads its output, at load:
  // a backend that normalizes faster with a weight of ones scales w's columns by g in place
  // (rms_norm(x) * g @ w^T == rms_norm(x) @ (w * g)^T, w rounded once more to its type) and
  // returns a weight of ones to pass to rms_norm_matmul / rms_norm_swiglu from then on, which it
  // recognizes there; otherwise it returns g and leaves w as it is (the default).
  virtual Tensor fold_norm_weight(const Tensor& g, Tensor& w) {
    (void)w;
    return g;
  }

  // --- graphs ---
  // Runs `record` with the backend's ops recorded instead of executed and returns the recording;
  // null when this backend cannot record (the CPU backend) or the recording failed (the caller
  // then runs the ops directly). Recorded ops must not copy to or from the host or allocate: run
  // the same ops once directly first, so scratch buffers and workspaces already have their size.
  virtual std::unique_ptr<OpGraph> capture(const std::function<void()>& record) {
    (void)record;
    return nullptr;
  }
  // Increases whenever device memory that a recording may reference is released (a buffer freed,
  // a workspace regrown): a recording made at an older epoch may point at freed memory and must be
  // made again.
  virtual uint64_t allocation_epoch() const { return 0; }

  // --- side branches ---
  // The ops issued between begin_side() and end_side() form a side branch, which a device may run
  // alongside the ops issued after end_side() until join_side(); everything issued after
  // join_side() runs after both. The branch starts after everything issued before begin_side().
  // Neither line may write what the other reads or writes; both may read the same tensors. One
  // branch at a time, joined before the step ends (and before a recording ends). Recorded in
  // graphs like any op. The defaults run everything in issue order (the CPU backend, and
  // wrappers such as the profiling backend, which times ops one by one).
  virtual void begin_side() {}
  virtual void end_side() {}
  virtual void join_side() {}

  // --- ops ---
  // out[i, :] = table[ids[i], :]   table [V, D] any dtype; ids i32 [n]; out act [n, D]
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;

  // out = x / rms(x) * w, per row.   x act [n, D]; w [D]; out act [n, D] (may alias x)
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;

  // residual += x; out = rms_norm(residual) * w.   x, residual, out act [n, D]
  // (out may alias x). This is the pre-norm transformer's "add & norm" in one pass.
  virtual void add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                            Tensor& out) = 0;

  // out = x @ w^T (+ bias).   x act [n, K]; w [M, K] any dtype; bias [M] or undefined;
  // out act [n, M] (rows may be strided: a slice of a wider buffer). w is a weight, or another
  // matrix that the op issued just before does not write (the products below likewise): a device
  // backend may start fetching it while that op still runs.
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) = 0;

  // out += x @ w^T (+ bias): a projection whose output is added to the residual stream, one op
  // so a backend can add in the product's epilogue instead of a pass of its own.
  //   x act [n, K]; w [M, K]; bias [M] or undefined; out act [n, M] (not aliasing x)
  //   scratch act [n, M]: for a backend that runs the product and the add apart (contents
  //   afterwards unspecified).
  virtual void matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& scratch,
                          Tensor& out);

  // A SwiGLU MLP's first half, one op so a backend can apply the activation in the product's
  // epilogue:  y = x @ w^T (+ bias) with w = [gate; up] of 2F rows; out[:, i] = silu(y[:, i]) *
  // y[:, F + i].   x act [n, K]; out act [n, F]; gate_up act [n, 2F]: scratch for a backend that
  // runs the steps apart (contents afterwards unspecified).
  virtual void matmul_swiglu(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& gate_up,
                             Tensor& out);

  // The pre-norm projections of a transformer block, one op each so a backend can normalize the
  // rows inside the product (for decode-sized n the CUDA GEMV takes each row's sum of squares as
  // it streams the weights, and needs no pass of its own):
  //   rms_norm_matmul: out = rms_norm(x) * norm_w @ w^T (+ bias)          out act [n, M]
  //   rms_norm_swiglu: y = rms_norm(x) * norm_w @ w^T (+ bias), w = [gate; up] of 2F rows;
  //                    out[:, i] = silu(y[:, i]) * y[:, F + i]             out act [n, F]
  // x act [n, K]; norm_w [K]; h act [n, K] and gate_up act [n, 2F]: scratch for a backend that
  // runs the steps apart (contents afterwards unspecified). out aliases neither x nor scratch.
  virtual void rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                               const Tensor& bias, Tensor& h, Tensor& out);
  virtual void rms_norm_swiglu(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                               const Tensor& bias, Tensor& h, Tensor& gate_up, Tensor& out);

  // A transformer block's projections from one attention to the next, as one op so a device
  // backend can run them as one chain (CUDA, one row: one launch whose weights stream through
  // the steps' hand-overs, gemv_stream.cu): each link is one of the three ops above with its own
  // operands, and runs after the one before. The default runs them one by one.
  struct ProjectionLink {
    enum class Kind { kMatmulAdd, kNormMatmul, kNormSwiGlu };
    Kind kind = Kind::kMatmulAdd;
    const Tensor* x = nullptr;
    const Tensor* norm_w = nullptr;  // kNormMatmul, kNormSwiGlu
    float eps = 0.0f;
    const Tensor* w = nullptr;
    const Tensor* bias = nullptr;
    Tensor* scratch = nullptr;  // matmul_add's scratch; the norms' h
    Tensor* gate_up = nullptr;  // kNormSwiGlu
    Tensor* out = nullptr;      // kMatmulAdd: the rows the product is added to
  };
  virtual void projection_chain(const std::vector<ProjectionLink>& links);

  // out[b] = x[b] @ w[b]^T for every b < B: independent matmuls of one shape, such as per-head
  // projections (MLA's absorbed query and value up-projection).
  //   x act [B, n, K]; w [B, M, K] f32/f16/bf16; out act [B, n, M]
  // Batch and row strides are free (head h of an [n, H*K] activation is batch entry h with batch
  // stride K and row stride H*K; a batch stride of 0 repeats one operand); the last dim is
  // contiguous. The default runs one matmul per entry; device backends run one batched GEMM.
  virtual void batched_matmul(const Tensor& x, const Tensor& w, Tensor& out);

  // Rotary embedding in place on the first rotary_dim dims of each head, then the new keys and
  // values are written to the paged cache: cache slot slot_mapping[i] gets token i's k and v.
  //   q act [n, Hq, D]; k act [n, Hkv, D]; v act [n, Hkv, Dv]
  //   cos_sin f32 [n, rotary_dim]: cos of the rotary_dim/2 frequencies, then their sin
  //   k_cache [n_blocks, block_size, Hkv, D]; v_cache [n_blocks, block_size, Hkv, Dv]
  //   slot_mapping i32 [n]: block * block_size + offset; negative: do not store (padding)
  // interleaved: rotate pairs (2i, 2i+1) (GPT-J / DeepSeek); otherwise halves (NeoX / HF Llama).
  // Caches in the activation dtype, or both float8_e4m3fn where supports_fp8_kv_cache(): then a
  // key is stored as e4m3(k / k_scale), a value as e4m3(v / v_scale), rounded to nearest even and
  // saturated to +-448 (AttentionParams' scales read them back).
  virtual void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos_sin,
                             bool interleaved, const Tensor& slot_mapping, Tensor& k_cache,
                             Tensor& v_cache, float k_scale, float v_scale) = 0;
  // Whether rope_store_kv and the attention ops take float8_e4m3fn caches (--kv-cache-dtype fp8).
  virtual bool supports_fp8_kv_cache() const { return false; }
  // x = scale * e4m3(x / scale) in place: what an FP8 cache gives back for x, for attention that
  // reads a step's fresh keys where they were made rather than from the cache (MLA's expanded
  // prompts), so that it sees what later steps will.   x act [n, d] (rows may be strided)
  virtual void round_to_fp8_cache(Tensor& x, float scale) {
    (void)x, (void)scale;
    PAGELLM_CHECK_MSG(false, "round_to_fp8_cache() called on a backend without an FP8 KV cache");
  }

  // Rotary embedding alone, in place.   x act [n, H, D]; cos_sin f32 [n, rotary_dim]
  virtual void rope(Tensor& x, const Tensor& cos_sin, bool interleaved) = 0;

  // Causal attention of packed queries over the paged cache (see AttentionMeta).
  //   q act [n, Hq, D]; caches as in rope_store_kv; out act [n, Hq, Dv]
  // GQA: query head h reads KV head h / (Hq / Hkv). A sequence with no keys and one query (the
  // padding of a recorded decode batch, runtime/step_batch.h) gets zeros.
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const AttentionMeta& meta, const AttentionParams& params,
                         Tensor& out) = 0;

  // Attention, then each query head's output through that head's own matrix (MLA's absorbed
  // decode: the latent attention, then the value up-projection W_UV):
  //   out[:, h] = attention(q, k_cache, v_cache)[:, h] @ w[h]^T
  //   q, caches, meta, params as in attention(); w [Hq, M, Dv] f32/f16/bf16 (strided as
  //   batched_matmul's w); out act [n, Hq, M] (strides free, last dim contiguous)
  // attn act [n, Hq, Dv]: the attention's output rounded to the activation type, which the
  // product reads; scratch for a backend that takes the product into the attention (contents
  // afterwards unspecified). The default runs attention() then batched_matmul().
  virtual void attention_project(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                 const AttentionMeta& meta, const AttentionParams& params,
                                 const Tensor& w, Tensor& attn, Tensor& out);

  // out = silu(gate) * up.   gate, up act [n, F] (may be column slices of one [n, 2F] buffer)
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;

  // out = a + b, elementwise.   act tensors of equal shape
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;

  // out[i, :] = x[rows[i], :].   x act [n, D]; rows i32 [m]; out act [m, D]
  virtual void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) = 0;

  // Converts act rows to f32 (for logits leaving the device).   x act [n, D]; out f32 [n, D]
  virtual void to_f32(const Tensor& x, Tensor& out) = 0;

  // Fills a contiguous f32/f16/bf16 tensor with values uniform in [lo, hi), a pure function of
  // (seed, element index), so every backend makes the same weights. For `--load-format dummy`:
  // benchmark models are made directly in device memory, with no checkpoint.
  virtual void fill_random(Tensor& t, uint64_t seed, float lo, float hi) = 0;

  // --- mixture of experts ---
  // Every compute backend implements these two; the defaults only keep wrappers of other
  // backends (test doubles) compiling, and fail when called.
  //
  // Routes n tokens: per token the scores of its router logits (softmax or sigmoid, in f32), the
  // top_k experts by p.select (ties: the lower expert index first), and their weights (the chosen
  // scores, renormalized when p.norm_topk_prob, then times p.routed_scaling_factor), exactly as
  // transformers computes them.   logits f32 [n, E]; correction_bias f32 [E] (kNoauxTc only,
  // undefined otherwise); ids i32 [n, top_k] and weights f32 [n, top_k], contiguous, in the order
  // chosen (best first).
  virtual void moe_route(const Tensor& logits, const Tensor& correction_bias,
                         const MoeRouteParams& p, Tensor& ids, Tensor& weights) {
    (void)logits, (void)correction_bias, (void)p, (void)ids, (void)weights;
    PAGELLM_CHECK_MSG(false, "moe_route() called on a backend that does not implement it");
  }
  // The routed experts of a step:
  //   out[t] = sum over k of weights[t, k] * expert_{ids[t, k]}(h[t])  (+ shared[t])
  // with the sum formed in ascending expert order (transformers' loop over experts), then the
  // shared experts' output added (DeepSeek; undefined when the model has none).
  //   h act [n, D]; ids i32 [n, K], each in [0, E) (CHECKed on the CPU; on a device, where ids
  //   are made by moe_route, a pair out of range adds nothing); weights f32 [n, K]; shared act
  //   [n, D] or undefined; out act [n, D]: may alias shared, not h.
  virtual void moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                           const MoeExpertWeights& experts, const Tensor& shared, Tensor& out) {
    (void)h, (void)ids, (void)weights, (void)experts, (void)shared, (void)out;
    PAGELLM_CHECK_MSG(false, "moe_experts() called on a backend that does not implement it");
  }
  // moe_experts() in two steps, so the first can run beside other work (DeepSeek makes it in the
  // router's side branch): moe_order() groups the (token, expert) pairs of ids by expert into
  // `order` (i32, moe_order_bytes(n * K, E) / 4 values, laid out as the backend likes), and
  // moe_experts_ordered() takes that grouping instead of making it; its ids must be the ones the
  // order was made from. A backend that needs no grouping (the CPU) has 0 bytes and runs
  // moe_experts().
  virtual int64_t moe_order_bytes(int64_t n_pairs, int64_t n_experts) const {
    (void)n_pairs, (void)n_experts;
    return 0;
  }
  virtual void moe_order(const Tensor& ids, int64_t n_experts, Tensor& order) {
    (void)ids, (void)n_experts, (void)order;
  }
  virtual void moe_experts_ordered(const Tensor& h, const Tensor& ids, const Tensor& weights,
                                   const Tensor& order, const MoeExpertWeights& experts,
                                   const Tensor& shared, Tensor& out) {
    (void)order;
    moe_experts(h, ids, weights, experts, shared, out);
  }

  // --- profiling ---
  // A timer on this backend's timeline. The default synchronizes and reads the host's steady
  // clock at each mark: exact for a synchronous backend (the CPU), correct but intrusive for an
  // asynchronous one, which should override it with device-side timestamps (CUDA events).
  virtual std::unique_ptr<OpTimer> make_op_timer();

  // --- sampling ---
  // Whether sample() runs here. The CPU backend says no: the engine then downloads the logits and
  // runs the host Sampler (sample/sampler.h), which is the reference this op reproduces.
  virtual bool supports_sampling() const { return false; }
  // Samples in.n_rows tokens from logits [n, vocab] (bf16 or f32, on this device) with the
  // semantics of the CPU Sampler; row i reads logits row rows[i].logits_row, its edits
  // edits[rows[i].edit_begin .. edit_end) and, when rows[i].mask_word >= 0, its grammar mask.
  // `in` and `out` are host memory; the results are complete when the call returns: the inputs
  // go up in one copy, only the results come back (one copy, one wait). Preconditions (shapes,
  // sorted in-range edits, masks inside the mask list) are CHECKed.
  virtual void sample(const Tensor& logits, const DeviceSampleInputs& in, DeviceSampleResult* out) {
    (void)logits, (void)in, (void)out;
    PAGELLM_CHECK_MSG(false, "sample() called on a backend without device sampling");
  }

  // Pipelined sampling: the next step queued before this one's tokens reach the host.
  // sample_async() queues what sample() does and returns a ticket at once; sample_results()
  // waits for that call's results. take_sampled_tokens() lets the next step read the tokens
  // where they already are: every negative entry t of `tokens` (a step's i32 token ids on this
  // device) becomes the token of result row -(t + 1) of the ticket's call (0 where that row
  // failed or does not exist, so a discarded step still reads a valid embedding row). A backend
  // may instead leave the entries negative and substitute them where the step reads them (the
  // CUDA backend's embedding does, for the last call's tokens): the step that holds `tokens`
  // must run before the next sampling call is queued, and only embedding() may read them. Each
  // ticket's results must be read before kSampleSlots more calls are queued.
  // The defaults serve a synchronous backend (and test doubles): sample() at once, the results
  // kept on the host, the substitution on host memory.
  static constexpr int kSampleSlots = 2;
  virtual uint64_t sample_async(const Tensor& logits, const DeviceSampleInputs& in);
  virtual void sample_results(uint64_t ticket, DeviceSampleResult* out);
  virtual void take_sampled_tokens(Tensor& tokens, uint64_t ticket);

 private:
  // The defaults' results, by ticket % kSampleSlots.
  struct HostSampleSlot {
    uint64_t ticket = 0;
    std::vector<DeviceSampleResult> results;
  };
  HostSampleSlot& host_sample_slot(uint64_t ticket);
  std::array<HostSampleSlot, kSampleSlots> host_samples_;
  uint64_t host_sample_tickets_ = 0;
};

// A size as people read it: "512 bytes", "3.5 KiB", "12.3 MiB", "93.42 GiB".
std::string memory_size(int64_t nbytes);

// The memory-bandwidth ceiling benchmarks report against, in GB/s: on the CPU, multithreaded
// streaming reads; on a device, a large device-to-device copy counting bytes read + written
// (the convention of the 4.25 TB/s H200 figure in docs/PERF.md).
double measure_memory_bandwidth_gbs(Backend& backend);

// The value fill_random puts at `index`: uniform in [lo, hi) from a splitmix64 hash.
PAGELLM_BACKEND_HD inline float random_uniform_at(uint64_t seed, uint64_t index, float lo, float hi) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float u = static_cast<float>((z >> 40) * (1.0 / 16777216.0));
#ifdef __CUDA_ARCH__
  return __fadd_rn(lo, __fmul_rn(hi - lo, u));  // no fused multiply-add: the CPU's rounding
#else
  return lo + (hi - lo) * u;
#endif
}

// The CPU reference backend. `fast`: use the SIMD/threaded paths (default); false runs the plain
// reference loops (tests compare the two).
std::unique_ptr<Backend> make_cpu_backend(bool fast = true);
// The CUDA backend on `device_index`; an error when built without CUDA or no GPU is present.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device_index = 0);

}  // namespace pagellm
