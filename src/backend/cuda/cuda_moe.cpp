// CudaBackend's mixture-of-experts ops: checks, the MoE workspace, and the choice between the
// grouped GEMVs (decode-sized steps), the grouped tensor-core GEMMs (larger ones, and every
// recording) and per-expert cuBLASLt GEMMs (large eager steps), as described in moe.h; quantized
// (4-bit, FP8) experts between their format's grouped GEMV and per-expert products.
#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"

namespace pagellm::cuda {
namespace {

void check_device_tensor(const Tensor& t, const char* what) {
  if (t.device != Device::kCuda) {
    std::fprintf(stderr, "cuda backend: tensor '%s' %s is not on the CUDA device\n", what,
                 t.shape_string().c_str());
    PAGELLM_CHECK_MSG(false, "tensor passed to the CUDA backend is not a device tensor");
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

RowView row_view(const Tensor& t) {
  return RowView{t.data, t.dtype, t.rows(), t.cols(), t.row_stride()};
}

// Whether a one-token GEMV step makes its down products and combine in one kernel (moe.h). On by
// default; PAGELLM_MOE_FUSED_COMBINE=0 keeps the two kernels (A/B runs).
bool fused_down_combine() {
  static const bool on = tuning::on("PAGELLM_MOE_FUSED_COMBINE");
  return on;
}

}  // namespace

void CudaBackend::moe_route(const Tensor& logits, const Tensor& correction_bias,
                            const MoeRouteParams& p, Tensor& ids, Tensor& weights) {
  check_device_tensor(logits, "logits");
  check_device_tensor(ids, "ids");
  check_device_tensor(weights, "weights");
  PAGELLM_CHECK_MSG(logits.dtype == DType::kF32 && logits.ndim == 2 && logits.stride[1] == 1,
                    "moe_route: logits must be f32 [n, E]");
  const int64_t n = logits.size(0), E = logits.size(1), K = p.top_k;
  PAGELLM_CHECK_MSG(E > 0 && E <= kMoeMaxExperts, "moe_route: at most 1024 experts on CUDA");
  PAGELLM_CHECK_MSG(K > 0 && K <= E && K <= kMoeMaxTopK,
                    "moe_route: top_k must be in [1, E] and at most 16 on CUDA");
  if (p.select != MoeSelect::kGreedy) {
    PAGELLM_CHECK_MSG(p.n_group >= 1 && p.n_group <= kMoeMaxGroups && E % p.n_group == 0 &&
                          p.topk_group >= 1 && p.topk_group <= p.n_group,
                      "moe_route: E must split into n_group <= 32 groups, topk_group in "
                      "[1, n_group]");
  }
  PAGELLM_CHECK_MSG(p.select != MoeSelect::kNoauxTc || E / p.n_group >= 2,
                    "moe_route: noaux_tc ranks groups by their top two: groups need 2 experts");
  const bool needs_bias = p.select == MoeSelect::kNoauxTc;
  PAGELLM_CHECK_MSG(correction_bias.defined() == needs_bias,
                    "moe_route: a correction bias goes with noaux_tc, and only with it");
  if (needs_bias) {
    check_device_tensor(correction_bias, "correction_bias");
    PAGELLM_CHECK_MSG(correction_bias.dtype == DType::kF32 && correction_bias.numel() == E &&
                          correction_bias.is_contiguous(),
                      "moe_route: correction_bias must be f32 [E]");
  }
  PAGELLM_CHECK_MSG(
      ids.dtype == DType::kI32 && ids.is_contiguous() && ids.rows() == n && ids.cols() == K,
      "moe_route: ids must be i32 [n, top_k], contiguous");
  PAGELLM_CHECK_MSG(weights.dtype == DType::kF32 && weights.is_contiguous() &&
                        weights.rows() == n && weights.cols() == K,
                    "moe_route: weights must be f32 [n, top_k], contiguous");
  PAGELLM_CHECK_MSG(n < INT32_MAX, "moe_route: too many tokens");
  MoeRouteArgs a;
  a.logits = logits.ptr<float>();
  a.ld = logits.stride[0];
  a.n_tokens = static_cast<int32_t>(n);
  a.n_experts = static_cast<int32_t>(E);
  a.bias = needs_bias ? correction_bias.ptr<float>() : nullptr;
  a.p = p;
  a.ids = ids.ptr<int32_t>();
  a.weights = weights.ptr<float>();
  launch_moe_route(a, stream_);
}

void* CudaBackend::ensure_moe_workspace(int64_t nbytes) {
  return grow_workspace(moe_workspace_, nbytes, "moe_experts", "the MoE workspace");
}

void CudaBackend::moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                              const MoeExpertWeights& experts, const Tensor& shared, Tensor& out) {
  if (ablated("moe_experts")) return;
  moe_experts_on_path(h, ids, weights, experts, shared, out, MoePath::kAuto);
}

int64_t CudaBackend::moe_order_bytes(int64_t n_pairs, int64_t n_experts) const {
  return moe_order_layout_bytes(n_pairs, n_experts);
}

void CudaBackend::moe_order(const Tensor& ids, int64_t n_experts, Tensor& order) {
  if (ablated("moe_order")) return;
  check_device_tensor(ids, "ids");
  check_device_tensor(order, "order");
  PAGELLM_CHECK_MSG(ids.dtype == DType::kI32 && ids.is_contiguous() && ids.ndim == 2,
                    "moe_order: ids must be i32 [n, K], contiguous");
  const int64_t n_pairs = ids.numel(), K = ids.cols();
  PAGELLM_CHECK_MSG(n_experts > 0 && n_experts <= kMoeMaxExperts && K > 0 && K <= kMoeMaxTopK,
                    "moe_order: at most 1024 experts and 16 per token on CUDA");
  PAGELLM_CHECK_MSG(
      order.is_contiguous() && aligned16(order.data) &&
          dtype_bytes(order.dtype, order.numel()) >= moe_order_layout_bytes(n_pairs, n_experts),
      "moe_order: order must be contiguous and hold moe_order_bytes(n K, E)");
  if (n_pairs == 0) return;
  MoeWorkspace ws;
  moe_place_order(ws, order.data, n_pairs, n_experts);
  launch_moe_sort(ids.ptr<int32_t>(), n_pairs, static_cast<int32_t>(K),
                  static_cast<int32_t>(n_experts), ws, stream_);
}

void CudaBackend::moe_experts_ordered(const Tensor& h, const Tensor& ids, const Tensor& weights,
                                      const Tensor& order, const MoeExpertWeights& experts,
                                      const Tensor& shared, Tensor& out) {
  if (ablated("moe_experts")) return;
  check_device_tensor(order, "order");
  PAGELLM_CHECK_MSG(dtype_bytes(order.dtype, order.numel()) >=
                        moe_order_layout_bytes(ids.numel(), experts.n_experts()),
                    "moe_experts_ordered: order is smaller than moe_order_bytes(n K, E)");
  moe_experts_on_path(h, ids, weights, experts, shared, out, MoePath::kAuto, &order);
}

void CudaBackend::moe_experts_on_path(const Tensor& h, const Tensor& ids, const Tensor& weights,
                                      const MoeExpertWeights& experts, const Tensor& shared,
                                      Tensor& out, MoePath path, const Tensor* order) {
  check_device_tensor(h, "h");
  check_device_tensor(ids, "ids");
  check_device_tensor(weights, "weights");
  check_device_tensor(out, "out");
  PAGELLM_CHECK_MSG(experts.stacked(),
                    "moe_experts: the CUDA backend needs the experts stacked ([E, 2F, D] gate|up, "
                    "[E, D, F] down)");
  const Tensor& gu = experts.gate_up;
  const Tensor& dn = experts.down;
  check_device_tensor(gu, "gate_up");
  check_device_tensor(dn, "down");
  const int64_t n = h.rows(), D = h.cols(), E = experts.n_experts(), F = experts.inter();
  PAGELLM_CHECK_MSG(h.dtype == DType::kBF16 && out.dtype == DType::kBF16,
                    "moe_experts: h and out must be bf16");
  PAGELLM_CHECK_MSG(out.rows() == n && out.cols() == D, "moe_experts: out shape differs from h");
  // bf16 experts, or ones kept quantized (4-bit or FP8) in the device's layout, each expert whole
  // 16-row stripes.
  const bool kept = kept_quantized(gu.dtype);
  const auto same_kind = [&](DType t) {
    return kept ? is_group_int4(t) == is_group_int4(gu.dtype) && kept_quantized(t)
                : t == DType::kBF16;
  };
  PAGELLM_CHECK_MSG(gu.ndim == 3 && (gu.dtype == DType::kBF16 || kept) && gu.is_contiguous() &&
                        gu.size(1) == 2 * F && gu.size(2) == D,
                    "moe_experts: gate_up must be a contiguous [E, 2F, D], bf16, 4-bit or FP8");
  PAGELLM_CHECK_MSG(dn.ndim == 3 && same_kind(dn.dtype) && dn.is_contiguous() && dn.size(0) == E &&
                        dn.size(1) == D,
                    "moe_experts: down must be a contiguous [E, D, F] of gate_up's kind");
  PAGELLM_CHECK_MSG(
      !kept || (kept_layout_fits(gu.dtype, 2 * F, D) && kept_layout_fits(dn.dtype, D, F)),
      "moe_experts: quantized experts must be whole 16-row stripes, and 64-column "
      "chunks (4-bit) or 128-column groups (FP8)");
  PAGELLM_CHECK_MSG(E > 0 && E <= kMoeMaxExperts, "moe_experts: at most 1024 experts on CUDA");
  // The GEMV kernels read 16-byte pieces of weight rows and activation rows.
  PAGELLM_CHECK_MSG(D % 8 == 0 && F % 8 == 0 && D > 0 && F > 0,
                    "moe_experts: hidden and intermediate sizes must be multiples of 8 on CUDA");
  PAGELLM_CHECK_MSG(
      aligned16(gu.data) && aligned16(dn.data) && aligned16(h.data) && h.row_stride() % 8 == 0,
      "moe_experts: weights and h must be 16-byte aligned, h's rows a multiple of "
      "8 elements apart");
  PAGELLM_CHECK_MSG(ids.dtype == DType::kI32 && ids.is_contiguous() && ids.rows() == n,
                    "moe_experts: ids must be i32 [n, K], contiguous");
  const int64_t K = ids.cols();
  PAGELLM_CHECK_MSG(K > 0 && K <= kMoeMaxTopK, "moe_experts: at most 16 experts per token");
  PAGELLM_CHECK_MSG(weights.dtype == DType::kF32 && weights.is_contiguous() &&
                        weights.rows() == n && weights.cols() == K,
                    "moe_experts: weights must be f32 [n, K] like ids");
  RowView shared_view{};
  if (shared.defined()) {
    check_device_tensor(shared, "shared");
    PAGELLM_CHECK_MSG(shared.dtype == DType::kBF16 && shared.rows() == n && shared.cols() == D,
                      "moe_experts: shared must be bf16 [n, D]");
    shared_view = row_view(shared);
  }
  if (n == 0) return;
  const int64_t n_pairs = n * K;
  MoeWorkspace ws = moe_workspace_at(ensure_moe_workspace(moe_workspace_bytes(n_pairs, E, D, F)),
                                     n_pairs, E, D, F);
  MoeExpertsArgs w;
  w.gate_up = gu.data;
  w.down = dn.data;
  w.n_experts = static_cast<int32_t>(E);
  w.hidden = D;
  w.inter = F;
  if (order != nullptr) {
    moe_place_order(ws, order->data, n_pairs, E);  // moe_order sorted these ids there
  } else {
    launch_moe_sort(ids.ptr<int32_t>(), n_pairs, static_cast<int32_t>(K), static_cast<int32_t>(E),
                    ws, stream_);
  }
  const bool recording = capturing(stream_);
  PAGELLM_CHECK_MSG(!(recording && path == MoePath::kExpertGemm),
                    "moe_experts: the per-expert GEMM path waits for the host and cannot be "
                    "recorded");
  if (kept) {
    // Quantized experts take two paths: the format's grouped GEMV (every recorded step, and eager
    // ones up to a pass of 32 slots an expert on average; the GEMV paths and the grouped GEMM's
    // name it), and per-expert products on the gathered rows for larger eager steps (4-bit as the
    // dense 4-bit matmul makes them, FP8 as dequantized slices through cuBLASLt).
    static_assert(kInt4GemvMaxRows == kFp8GemvMaxRows, "one pass width for both formats");
    if (path == MoePath::kAuto)
      path = recording || n_pairs <= kInt4GemvMaxRows * E ? MoePath::kGemv : MoePath::kExpertGemm;
    if (path == MoePath::kExpertGemm) {
      moe_expert_gemms(h, gu, dn, ws);
    } else {
      moe_kept_gemvs(h, gu, dn, ws, std::min(E, n_pairs), n, n_pairs);
    }
    launch_moe_combine(ids.ptr<int32_t>(), weights.ptr<float>(), n, static_cast<int32_t>(K),
                       static_cast<int32_t>(E), ws, D, shared_view, row_view(out), stream_);
    return;
  }
  if (path == MoePath::kAuto) {
    path = n_pairs <= kMoeGemvMaxTokensPerExpert * E                       ? MoePath::kGemv
           : !recording && n_pairs >= kMoeExpertGemmMinTokensPerExpert * E ? MoePath::kExpertGemm
                                                                           : MoePath::kGroupedGemm;
  }
  switch (path) {
    case MoePath::kGemv:
    case MoePath::kGemvApart: {
      const int64_t max_active = std::min(E, n_pairs);
      launch_moe_gate_up_gemv(w, h.data, h.row_stride(), ws, max_active, n, stream_);
      if (path == MoePath::kGemv && n == 1 && K <= kMoeFusedCombineMaxTopK &&
          fused_down_combine()) {
        launch_moe_down_combine_gemv(w, ids.ptr<int32_t>(), weights.ptr<float>(),
                                     static_cast<int32_t>(K), ws, shared_view, row_view(out),
                                     stream_);
        return;
      }
      launch_moe_down_gemv(w, ws, max_active, n, stream_);
      break;
    }
    case MoePath::kExpertGemm:
      moe_expert_gemms(h, gu, dn, ws);
      break;
    case MoePath::kGroupedGemm:
    case MoePath::kAuto:  // resolved above
      moe_grouped_gemms(h, gu, dn, ws, n_pairs);
      break;
  }
  launch_moe_combine(ids.ptr<int32_t>(), weights.ptr<float>(), n, static_cast<int32_t>(K),
                     static_cast<int32_t>(E), ws, D, shared_view, row_view(out), stream_);
}

void CudaBackend::moe_grouped_gemms(const Tensor& h, const Tensor& gu, const Tensor& dn,
                                    const MoeWorkspace& ws, int64_t n_pairs) {
  // Tensor-core GEMMs over every expert's slots at once: gate|up gathers the token rows of h,
  // silu(gate) * up goes into the gate half, down reads it. Slots past the step's count (pairs
  // with an id out of range) hold stale values that nothing reads.
  const int64_t D = h.cols(), F = dn.size(2), E = gu.size(0);
  MoeGemmArgs gate_up;
  gate_up.a = h.data;
  gate_up.lda = h.row_stride();
  gate_up.a_rows = ws.slot_token;
  gate_up.b = gu.data;
  gate_up.b_expert_stride = 2 * F * D;
  gate_up.ldb = D;
  gate_up.c = ws.act;
  gate_up.ldc = 2 * F;
  gate_up.offsets = ws.offsets;
  gate_up.n_experts = static_cast<int32_t>(E);
  gate_up.n = 2 * F;
  gate_up.k = D;
  launch_moe_gemm(gate_up, n_pairs, stream_);
  auto* act = static_cast<char*>(ws.act);
  const RowView gate{act, DType::kBF16, n_pairs, F, 2 * F};
  const RowView up{act + F * 2, DType::kBF16, n_pairs, F, 2 * F};
  launch_silu_mul(gate, up, gate, stream_);
  MoeGemmArgs down = gate_up;
  down.a = ws.act;
  down.lda = 2 * F;
  down.a_rows = nullptr;
  down.b = dn.data;
  down.b_expert_stride = D * F;
  down.ldb = F;
  down.c = ws.xy;
  down.ldc = D;
  down.n = D;
  down.k = F;
  launch_moe_gemm(down, n_pairs, stream_);
}

void CudaBackend::moe_kept_gemvs(const Tensor& h, const Tensor& gu, const Tensor& dn,
                                 const MoeWorkspace& ws, int64_t max_active, int64_t max_tokens,
                                 int64_t n_pairs) {
  // gate|up of each slot's token row into act, silu(gate) * up into its gate half, down into xy.
  // Slots past the step's count (pairs with an id out of range) hold stale values nothing reads.
  const int64_t D = h.cols(), F = dn.size(2), E = gu.size(0);
  const auto launch = [&](const MoeKeptGemv& g) {
    if (is_kept_fp8(g.dtype)) {
      launch_moe_fp8_gemv(g, ws, max_active, max_tokens, stream_);
    } else {
      launch_moe_int4_gemv(g, ws, max_active, max_tokens, stream_);
    }
  };
  MoeKeptGemv g;
  g.x = h.data;
  g.ldx = h.row_stride();
  g.x_rows = ws.slot_token;
  g.w = gu.data;
  g.dtype = gu.dtype;
  g.n_experts = E;
  g.rows = 2 * F;
  g.cols = D;
  g.out = ws.act;
  g.ldo = 2 * F;
  launch(g);
  auto* act = static_cast<char*>(ws.act);
  const RowView gate{act, DType::kBF16, n_pairs, F, 2 * F};
  const RowView up{act + F * 2, DType::kBF16, n_pairs, F, 2 * F};
  launch_silu_mul(gate, up, gate, stream_);
  MoeKeptGemv d;
  d.x = ws.act;
  d.ldx = 2 * F;
  d.w = dn.data;
  d.dtype = dn.dtype;
  d.n_experts = E;
  d.rows = D;
  d.cols = F;
  d.out = ws.xy;
  d.ldo = D;
  launch(d);
}

void CudaBackend::moe_expert_gemms(const Tensor& h, const Tensor& gu, const Tensor& dn,
                                   const MoeWorkspace& ws) {
  // The per-expert counts come to the host (one wait per layer) so each expert's products are
  // cuBLASLt GEMMs on its gathered rows. y overwrites the gathered rows of its own expert, which
  // its gate|up GEMM has already read.
  const int64_t D = h.cols(), F = dn.size(2), E = gu.size(0);
  moe_offsets_.resize(E + 1);
  copy_to_host(moe_offsets_.data(), ws.offsets, (E + 1) * sizeof(int32_t));
  const int64_t n_slots = moe_offsets_[E];
  launch_gather_rows(row_view(h), ws.slot_token, RowView{ws.xy, DType::kBF16, n_slots, D, D},
                     stream_);
  auto* act = static_cast<char*>(ws.act);
  auto* xy = static_cast<char*>(ws.xy);
  // The product with expert e's [rows, cols] weight of a stack: bf16 through cuBLASLt, 4-bit as
  // the dense 4-bit matmul makes it (the GEMV, or dequantized slices through cuBLASLt; an
  // expert's stripes stand alone), FP8 as dequantized slices (its scales interleave with the
  // other experts', which neither the FP8 GEMV alone nor cuBLASLt's FP8 GEMM reads).
  const auto product = [&](const RowView& x, const Tensor& w, int64_t e, int64_t rows, int64_t cols,
                           const RowView& out) {
    char* base = static_cast<char*>(w.data);
    if (w.dtype == DType::kBF16) {
      gemm_->run(x, RowView{base + e * rows * cols * 2, w.dtype, rows, cols, cols}, nullptr,
                 DType::kF32, out);
    } else if (is_kept_fp8(w.dtype)) {
      sliced_matmul(MatmulOperands{x, RowView{base, w.dtype, rows, cols, cols}, out},
                    w.size(0) * rows, e * rows, nullptr);
    } else {
      const RowView we{base + dtype_bytes(w.dtype, e * rows * cols), w.dtype, rows, cols, cols};
      kept_matmul(MatmulOperands{x, we, out}, nullptr);
    }
  };
  for (int64_t e = 0; e < E; ++e) {
    const int64_t s0 = moe_offsets_[e], m = moe_offsets_[e + 1] - s0;
    if (m == 0) continue;
    const RowView x{xy + s0 * D * 2, DType::kBF16, m, D, D};
    const RowView g{act + s0 * 2 * F * 2, DType::kBF16, m, 2 * F, 2 * F};
    product(x, gu, e, 2 * F, D, g);
  }
  // silu(gate) * up over every slot at once, into the gate half.
  const RowView gate{act, DType::kBF16, n_slots, F, 2 * F};
  const RowView up{act + F * 2, DType::kBF16, n_slots, F, 2 * F};
  launch_silu_mul(gate, up, gate, stream_);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t s0 = moe_offsets_[e], m = moe_offsets_[e + 1] - s0;
    if (m == 0) continue;
    const RowView a{act + s0 * 2 * F * 2, DType::kBF16, m, F, 2 * F};
    const RowView y{xy + s0 * D * 2, DType::kBF16, m, D, D};
    product(a, dn, e, D, F, y);
  }
}

}  // namespace pagellm::cuda
