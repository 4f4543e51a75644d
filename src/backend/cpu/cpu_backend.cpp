// The CPU backend: reference loops (reference.cpp) or, when `fast`, the SIMD kernels of the best
// ISA this CPU has (kernels.h) spread over the global thread pool. Both paths share the
// precondition checks below.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fp8_kv.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/reference.h"
#include "core/check.h"
#include "core/kquants.h"
#include "core/thread_pool.h"

namespace pagellm {
namespace {

using cpu::row_f32;
using cpu::row_offset;

constexpr int64_t kAlignment = 64;  // a cache line, and an AVX-512 vector

class CpuBuffer final : public Buffer {
 public:
  CpuBuffer(void* data, int64_t nbytes) : data_(data), nbytes_(nbytes) {}
  ~CpuBuffer() override { std::free(data_); }
  void* data() const override { return data_; }
  int64_t nbytes() const override { return nbytes_; }
  Device device() const override { return Device::kCpu; }

 private:
  void* data_;
  int64_t nbytes_;
};

// Rows of an elementwise op per thread-pool chunk: enough work (~64K values) to pay for a wake-up.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, cols)); }

void check_act(const Tensor& t, const char* what) {
  PAGELLM_CHECK_MSG(t.defined() && t.dtype == DType::kF32 && t.device == Device::kCpu, what);
  PAGELLM_CHECK_MSG(t.ndim >= 1 && t.stride[t.ndim - 1] == 1, what);
}
// A KV cache: f32, or float8_e4m3fn (--kv-cache-dtype fp8); k and v alike.
void check_caches(const Tensor& k_cache, const Tensor& v_cache, const char* what) {
  for (const Tensor* t : {&k_cache, &v_cache}) {
    PAGELLM_CHECK_MSG(t->defined() && t->device == Device::kCpu && t->ndim == 4 &&
                          t->stride[3] == 1 &&
                          (t->dtype == DType::kF32 || t->dtype == DType::kF8E4M3),
                      what);
  }
  PAGELLM_CHECK_MSG(k_cache.dtype == v_cache.dtype, what);
}
void check_same_rows(const Tensor& a, const Tensor& b, const char* what) {
  PAGELLM_CHECK_MSG(a.rows() == b.rows() && a.cols() == b.cols(), what);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const cpu::Kernels* kernels) : kernels_(kernels) {}

  std::string name() const override {
    return kernels_ ? std::string("cpu-") + kernels_->isa : std::string("cpu-reference");
  }
  Device device() const override { return Device::kCpu; }
  DType activation_dtype() const override { return DType::kF32; }

  std::unique_ptr<Buffer> allocate(int64_t nbytes) override {
    PAGELLM_CHECK(nbytes >= 0);
    // aligned_alloc needs a size that is a multiple of the alignment; never zero.
    const int64_t size = std::max<int64_t>(kAlignment, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
    void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(size));
    if (!p) return nullptr;  // out of memory: the caller reports it
    return std::make_unique<CpuBuffer>(p, nbytes);
  }

  int64_t free_memory() const override {
    std::ifstream f("/proc/meminfo");
    std::string key;
    int64_t value = 0;
    std::string unit;
    while (f >> key >> value) {
      std::getline(f, unit);
      if (key == "MemAvailable:") return value * 1024;  // reported in kB
    }
    return 0;
  }

  void copy_from_host(void* dst, const void* src, int64_t nbytes) override {
    std::memcpy(dst, src, static_cast<size_t>(nbytes));
  }
  void copy_to_host(void* dst, const void* src, int64_t nbytes) override {
    std::memcpy(dst, src, static_cast<size_t>(nbytes));
  }
  void copy(void* dst, const void* src, int64_t nbytes) override {
    std::memmove(dst, src, static_cast<size_t>(nbytes));
  }
  void synchronize() override {}

  Result<Tensor> upload_weight(const Tensor& host, DType dtype,
                               std::unique_ptr<Buffer>& storage) override;

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                    Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) override;
  void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos_sin, bool interleaved,
                     const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache, float k_scale,
                     float v_scale) override;
  bool supports_fp8_kv_cache() const override { return true; }
  void round_to_fp8_cache(Tensor& x, float scale) override;
  void rope(Tensor& x, const Tensor& cos_sin, bool interleaved) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const AttentionMeta& meta, const AttentionParams& params, Tensor& out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void to_f32(const Tensor& x, Tensor& out) override;
  void moe_route(const Tensor& logits, const Tensor& correction_bias, const MoeRouteParams& p,
                 Tensor& ids, Tensor& weights) override;
  void moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                   const MoeExpertWeights& experts, const Tensor& shared, Tensor& out) override;
  void fill_random(Tensor& t, uint64_t seed, float lo, float hi) override {
    PAGELLM_CHECK(t.is_contiguous());
    if (is_quantized(t.dtype)) return fill_random_blocks(t, seed, lo, hi);
    const int64_t n = t.numel();
    ThreadPool::global().parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float v = random_uniform_at(seed, static_cast<uint64_t>(i), lo, hi);
        switch (t.dtype) {
          case DType::kF32: t.ptr<float>()[i] = v; break;
          case DType::kBF16: t.ptr<uint16_t>()[i] = f32_to_bf16(v); break;
          case DType::kF16: t.ptr<uint16_t>()[i] = f32_to_f16(v); break;
          default: PAGELLM_CHECK_MSG(false, "fill_random: unsupported dtype");
        }
      }
    });
  }

 private:
  // Random 4-bit blocks (--load-format dummy --quantization) whose values spread over [lo, hi]:
  // random nibbles, every group's scale and zero point (I4G) or every chunk's scale and minimum
  // (Q4_K) set so that 0..15 maps onto [lo, hi]; FP8 blocks (F8B32, F8G128): random values in
  // [lo, hi] quantized as from_f32 does.
  void fill_random_blocks(Tensor& t, uint64_t seed, float lo, float hi);
  void matmul_fast(const Tensor& x, const Tensor& w, const float* bias, Tensor& out);
  void check_rope(const Tensor& x, const Tensor& cos_sin) const;

  const cpu::Kernels* kernels_;  // null: reference loops
  cpu::MoeExpertsRunner moe_;
};

// --- weights ---

void CpuBackend::fill_random_blocks(Tensor& t, uint64_t seed, float lo, float hi) {
  const DType dt = t.dtype;
  const bool fp8 = dt == DType::kF8B32 || dt == DType::kF8G128;
  PAGELLM_CHECK_MSG(is_group_int4(dt) || dt == DType::kQ4_K || fp8,
                    "fill_random: random blocks are made for the I4G, Q4_K and FP8 types only");
  const int64_t blocks = t.numel() / block_elems(dt), bytes = block_bytes(dt);
  if (fp8) {
    const int n = block_elems(dt);
    ThreadPool::global().parallel_for(blocks, 256, [&](int64_t b, int64_t e) {
      float v[128];
      for (int64_t i = b; i < e; ++i) {
        for (int j = 0; j < n; ++j)
          v[j] = random_uniform_at(seed, static_cast<uint64_t>(i * n + j), lo, hi);
        from_f32(dt, v, static_cast<uint8_t*>(t.data) + i * bytes, n);
      }
    });
    return;
  }
  const float step = (hi - lo) / 15.0f;
  ThreadPool::global().parallel_for(blocks, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint8_t* blk = static_cast<uint8_t*>(t.data) + i * bytes;
      for (int64_t j = 0; j < bytes; ++j)
        blk[j] = static_cast<uint8_t>(
            random_uniform_at(seed, static_cast<uint64_t>(i * bytes + j), 0.0f, 256.0f));
      if (dt == DType::kQ4_K) {
        // Every chunk's 6-bit scale and minimum 32 (the low six bits of bytes 0..7 and the top
        // two of bytes 0..7 for chunks 4..7): x = d * 32 * q - dmin * 32.
        auto* q = reinterpret_cast<BlockQ4_K*>(blk);
        q->d = f32_to_f16(step / 32.0f);
        q->dmin = f32_to_f16(-lo / 32.0f);
        for (int j = 0; j < 8; ++j) q->scales[j] = 32 | (2 << 6);
        for (int j = 8; j < 12; ++j) q->scales[j] = 0;
      } else {
        const uint16_t d = f32_to_f16(step);  // x = d * (q - z): d = step, z = -lo / step
        std::memcpy(blk, &d, 2);
        blk[2] = static_cast<uint8_t>(std::clamp(static_cast<int>(std::lround(-lo / step)), 0, 15));
        blk[3] = 0;
      }
    }
  });
}

Result<Tensor> CpuBackend::upload_weight(const Tensor& host, DType dtype,
                                         std::unique_ptr<Buffer>& storage) {
  if (!host.defined() || host.device != Device::kCpu)
    return invalid_argument("upload_weight: the source tensor is not in host memory");
  if (host.dtype == dtype) return host;  // zero-copy: compute straight from the mapping
  const bool plain_dst = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  const bool float_src = host.dtype == DType::kF32 || host.dtype == DType::kF16 ||
                         host.dtype == DType::kBF16 || is_quantized(host.dtype);
  if (!float_src || !(plain_dst || is_quantized(dtype)))
    return invalid_argument("upload_weight: cannot convert " + std::string(dtype_name(host.dtype)) +
                            " to " + std::string(dtype_name(dtype)));
  if (is_quantized(host.dtype) && is_quantized(dtype))
    return unimplemented("upload_weight: re-quantizing " + std::string(dtype_name(host.dtype)) +
                         " to " + std::string(dtype_name(dtype)) + " would compound the error");
  const int64_t rows = host.rows(), cols = host.cols();
  if (is_quantized(dtype) && (host.ndim != 2 || cols % block_elems(dtype) != 0))
    return invalid_argument("upload_weight: " + std::string(dtype_name(dtype)) +
                            " needs a 2-D tensor whose rows are a multiple of " +
                            std::to_string(block_elems(dtype)) + " values, got " +
                            host.shape_string());
  const int64_t row_bytes = dtype_bytes(dtype, cols);
  PAGELLM_ASSIGN_OR_RETURN(storage,
                           allocate_or_error(rows * row_bytes, "a weight " + host.shape_string()));
  Tensor out = host;
  out.data = storage->data();
  out.dtype = dtype;
  out.set_contiguous_strides();
  std::vector<float> tmp(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const char* src = static_cast<const char*>(host.data) + dtype_bytes(host.dtype, row_offset(host, r));
    pagellm::to_f32(host.dtype, src, tmp.data(), cols);
    from_f32(dtype, tmp.data(), static_cast<char*>(storage->data()) + r * row_bytes, cols);
  }
  return out;
}

// --- elementwise and row ops ---

void CpuBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  PAGELLM_CHECK(table.ndim == 2 && ids.dtype == DType::kI32 && ids.is_contiguous());
  check_act(out, "embedding: out must be f32 on the CPU");
  PAGELLM_CHECK(out.rows() == ids.numel() && out.cols() == table.cols());
  for (int64_t i = 0; i < ids.numel(); ++i)
    PAGELLM_CHECK_MSG(ids.ptr<int32_t>()[i] >= 0 && ids.ptr<int32_t>()[i] < table.size(0),
                      "embedding: token id out of range");
  cpu::ref::embedding(table, ids, out);
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  check_act(x, "rms_norm: x must be f32");
  check_act(out, "rms_norm: out must be f32");
  check_same_rows(x, out, "rms_norm: out shape differs from x");
  PAGELLM_CHECK_MSG(w.dtype == DType::kF32 && w.numel() == x.cols() && w.is_contiguous(),
                    "rms_norm: weight must be f32 [D] (upload it as kF32)");
  if (!kernels_) return cpu::ref::rms_norm(x, w, eps, out);
  const int64_t d = x.cols();
  ThreadPool::global().parallel_for(x.rows(), row_grain(d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      kernels_->rms_norm_row(row_f32(x, r), w.ptr<float>(), eps, row_f32(out, r), d);
  });
}

void CpuBackend::add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                              Tensor& out) {
  check_act(x, "add_rms_norm: x must be f32");
  check_act(residual, "add_rms_norm: residual must be f32");
  check_act(out, "add_rms_norm: out must be f32");
  check_same_rows(x, residual, "add_rms_norm: residual shape differs from x");
  check_same_rows(x, out, "add_rms_norm: out shape differs from x");
  PAGELLM_CHECK_MSG(w.dtype == DType::kF32 && w.numel() == x.cols() && w.is_contiguous(),
                    "add_rms_norm: weight must be f32 [D] (upload it as kF32)");
  if (!kernels_) return cpu::ref::add_rms_norm(x, residual, w, eps, out);
  const int64_t d = x.cols();
  ThreadPool::global().parallel_for(x.rows(), row_grain(d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      kernels_->add_rms_norm_row(row_f32(x, r), row_f32(residual, r), w.ptr<float>(), eps,
                                 row_f32(out, r), d);
  });
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  check_act(gate, "silu_mul: gate must be f32");
  check_act(up, "silu_mul: up must be f32");
  check_act(out, "silu_mul: out must be f32");
  check_same_rows(gate, up, "silu_mul: up shape differs from gate");
  check_same_rows(gate, out, "silu_mul: out shape differs from gate");
  if (!kernels_) return cpu::ref::silu_mul(gate, up, out);
  const int64_t d = gate.cols();
  ThreadPool::global().parallel_for(gate.rows(), row_grain(d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      kernels_->silu_mul_row(row_f32(gate, r), row_f32(up, r), row_f32(out, r), d);
  });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_act(a, "add: a must be f32");
  check_act(b, "add: b must be f32");
  check_act(out, "add: out must be f32");
  check_same_rows(a, b, "add: shapes differ");
  check_same_rows(a, out, "add: out shape differs");
  if (!kernels_) return cpu::ref::add(a, b, out);
  const int64_t d = a.cols();
  ThreadPool::global().parallel_for(a.rows(), row_grain(d), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      kernels_->add_row(row_f32(a, r), row_f32(b, r), row_f32(out, r), d);
  });
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  check_act(x, "gather_rows: x must be f32");
  check_act(out, "gather_rows: out must be f32");
  PAGELLM_CHECK(rows.dtype == DType::kI32 && rows.is_contiguous());
  PAGELLM_CHECK(out.rows() == rows.numel() && out.cols() == x.cols());
  for (int64_t i = 0; i < rows.numel(); ++i)
    PAGELLM_CHECK_MSG(rows.ptr<int32_t>()[i] >= 0 && rows.ptr<int32_t>()[i] < x.rows(),
                      "gather_rows: row index out of range");
  cpu::ref::gather_rows(x, rows, out);
}

void CpuBackend::to_f32(const Tensor& x, Tensor& out) {
  check_act(x, "to_f32: x must be f32 (the CPU activation type)");
  check_act(out, "to_f32: out must be f32");
  check_same_rows(x, out, "to_f32: out shape differs");
  cpu::ref::to_f32(x, out);
}

// --- mixture of experts ---

void CpuBackend::moe_route(const Tensor& logits, const Tensor& correction_bias,
                           const MoeRouteParams& p, Tensor& ids, Tensor& weights) {
  PAGELLM_CHECK_MSG(logits.defined() && logits.dtype == DType::kF32 && logits.ndim == 2 &&
                        logits.stride[1] == 1 && logits.device == Device::kCpu,
                    "moe_route: logits must be f32 [n, E] on the CPU");
  const int64_t n = logits.size(0), E = logits.size(1), K = p.top_k;
  PAGELLM_CHECK_MSG(E > 0 && K > 0 && K <= E, "moe_route: top_k must be in [1, E]");
  PAGELLM_CHECK_MSG(p.select == MoeSelect::kGreedy ||
                        (p.n_group >= 1 && E % p.n_group == 0 && p.topk_group >= 1 &&
                         p.topk_group <= p.n_group),
                    "moe_route: E must split into n_group groups, topk_group in [1, n_group]");
  PAGELLM_CHECK_MSG(p.select != MoeSelect::kNoauxTc || E / p.n_group >= 2,
                    "moe_route: noaux_tc ranks groups by their top two: groups need 2 experts");
  const bool needs_bias = p.select == MoeSelect::kNoauxTc;
  PAGELLM_CHECK_MSG(correction_bias.defined() == needs_bias,
                    "moe_route: a correction bias goes with noaux_tc, and only with it");
  if (needs_bias)
    PAGELLM_CHECK_MSG(correction_bias.dtype == DType::kF32 && correction_bias.numel() == E &&
                          correction_bias.is_contiguous() && correction_bias.device == Device::kCpu,
                      "moe_route: correction_bias must be f32 [E] on the CPU");
  PAGELLM_CHECK_MSG(ids.dtype == DType::kI32 && ids.is_contiguous() && ids.rows() == n &&
                        ids.cols() == K && ids.device == Device::kCpu,
                    "moe_route: ids must be i32 [n, top_k], contiguous");
  PAGELLM_CHECK_MSG(weights.dtype == DType::kF32 && weights.is_contiguous() &&
                        weights.rows() == n && weights.cols() == K &&
                        weights.device == Device::kCpu,
                    "moe_route: weights must be f32 [n, top_k], contiguous");
  const float* bias = needs_bias ? correction_bias.ptr<float>() : nullptr;
  for (int64_t t = 0; t < n; ++t)
    cpu::moe_route_token(logits.ptr<float>() + t * logits.stride[0], E, bias, p,
                         ids.ptr<int32_t>() + t * K, weights.ptr<float>() + t * K);
}

void CpuBackend::moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                             const MoeExpertWeights& experts, const Tensor& shared, Tensor& out) {
  check_act(h, "moe_experts: h must be f32");
  check_act(out, "moe_experts: out must be f32");
  check_same_rows(h, out, "moe_experts: out shape differs from h");
  const int64_t n = h.rows(), D = h.cols(), E = experts.n_experts(), F = experts.inter();
  PAGELLM_CHECK_MSG(E > 0 && F > 0 && experts.hidden() == D,
                    "moe_experts: expert weights do not match h's width");
  if (experts.stacked()) {
    const Tensor& gu = experts.gate_up;
    const Tensor& dn = experts.down;
    PAGELLM_CHECK_MSG(gu.ndim == 3 && gu.size(1) == 2 * F && gu.is_contiguous() &&
                          !is_quantized(gu.dtype) && gu.device == Device::kCpu,
                      "moe_experts: gate_up must be a contiguous [E, 2F, D] on the CPU");
    PAGELLM_CHECK_MSG(dn.ndim == 3 && dn.size(0) == E && dn.size(1) == D && dn.is_contiguous() &&
                          !is_quantized(dn.dtype) && dn.device == Device::kCpu,
                      "moe_experts: down must be a contiguous [E, D, F] on the CPU");
  } else {
    PAGELLM_CHECK_MSG(static_cast<int64_t>(experts.up.size()) == E &&
                          static_cast<int64_t>(experts.down_each.size()) == E,
                      "moe_experts: per-expert gate, up and down lists differ in length");
    for (int64_t e = 0; e < E; ++e) {
      PAGELLM_CHECK_MSG(experts.gate[e].rows() == F && experts.gate[e].cols() == D &&
                            experts.up[e].rows() == F && experts.up[e].cols() == D &&
                            experts.down_each[e].rows() == D && experts.down_each[e].cols() == F,
                        "moe_experts: an expert's matrices are not [F, D], [F, D], [D, F]");
    }
  }
  PAGELLM_CHECK_MSG(ids.dtype == DType::kI32 && ids.is_contiguous() && ids.rows() == n,
                    "moe_experts: ids must be i32 [n, K], contiguous");
  PAGELLM_CHECK_MSG(weights.dtype == DType::kF32 && weights.is_contiguous() &&
                        weights.rows() == n && weights.cols() == ids.cols(),
                    "moe_experts: weights must be f32 [n, K] like ids");
  if (shared.defined()) {
    check_act(shared, "moe_experts: shared must be f32");
    check_same_rows(shared, out, "moe_experts: shared shape differs from out");
  }
  if (n == 0) return;
  moe_.run(*this, h, ids, weights, experts, shared, out);
}

// --- rope and KV store ---

void CpuBackend::check_rope(const Tensor& x, const Tensor& cos_sin) const {
  check_act(x, "rope: x must be f32");
  PAGELLM_CHECK_MSG(x.ndim == 3 || x.ndim == 2, "rope: x must be [n, H, D]");
  PAGELLM_CHECK(cos_sin.dtype == DType::kF32 && cos_sin.ndim == 2);
  PAGELLM_CHECK_MSG(cos_sin.size(0) == x.size(0), "rope: cos_sin rows differ from tokens");
  PAGELLM_CHECK_MSG(cos_sin.cols() % 2 == 0 && cos_sin.cols() <= x.cols(),
                    "rope: rotary_dim must be even and at most head_dim");
}

void CpuBackend::rope(Tensor& x, const Tensor& cos_sin, bool interleaved) {
  check_rope(x, cos_sin);
  if (!kernels_) return cpu::ref::rope(x, cos_sin, interleaved);
  // The reference loop is already vectorizable (and cheap next to matmul); split it by tokens.
  ThreadPool::global().parallel_for(x.size(0), row_grain(x.numel() / std::max<int64_t>(1, x.size(0))),
                                    [&](int64_t b, int64_t e) {
                                      Tensor xs = x.slice_rows(b, e);
                                      cpu::ref::rope(xs, cos_sin.slice_rows(b, e), interleaved);
                                    });
}

void CpuBackend::rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos_sin,
                               bool interleaved, const Tensor& slot_mapping, Tensor& k_cache,
                               Tensor& v_cache, float k_scale, float v_scale) {
  check_rope(q, cos_sin);
  check_rope(k, cos_sin);
  check_act(v, "rope_store_kv: v must be f32");
  PAGELLM_CHECK(q.ndim == 3 && k.ndim == 3 && v.ndim == 3);
  PAGELLM_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && v.size(1) == k.size(1));
  check_caches(k_cache, v_cache, "rope_store_kv: the caches must be both f32 or both fp8 (e4m3)");
  const bool fp8 = k_cache.dtype == DType::kF8E4M3;
  PAGELLM_CHECK_MSG(!fp8 || (std::isfinite(k_scale) && k_scale > 0.0f && std::isfinite(v_scale) &&
                             v_scale > 0.0f),
                    "rope_store_kv: an FP8 cache's scales must be positive and finite");
  PAGELLM_CHECK_MSG(k_cache.size(2) == k.size(1) && k_cache.size(3) == k.size(2),
                    "rope_store_kv: k_cache is not [n_blocks, block_size, Hkv, D]");
  PAGELLM_CHECK_MSG(v_cache.size(0) == k_cache.size(0) && v_cache.size(1) == k_cache.size(1) &&
                        v_cache.size(2) == v.size(1) && v_cache.size(3) == v.size(2),
                    "rope_store_kv: v_cache is not [n_blocks, block_size, Hkv, Dv]");
  PAGELLM_CHECK(slot_mapping.dtype == DType::kI32 && slot_mapping.numel() == q.size(0));
  const int64_t n_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t i = 0; i < slot_mapping.numel(); ++i)
    PAGELLM_CHECK_MSG(slot_mapping.ptr<int32_t>()[i] < n_slots, "rope_store_kv: slot out of range");
  rope(q, cos_sin, interleaved);
  rope(k, cos_sin, interleaved);
  if (fp8) return cpu::store_kv_fp8(k, v, slot_mapping, k_scale, v_scale, k_cache, v_cache);
  cpu::ref::store_kv(k, v, slot_mapping, k_cache, v_cache);
}

void CpuBackend::round_to_fp8_cache(Tensor& x, float scale) {
  check_act(x, "round_to_fp8_cache: x must be f32");
  for (int64_t r = 0; r < x.rows(); ++r) cpu::round_to_fp8(row_f32(x, r), x.cols(), scale);
}

// --- attention ---

void CpuBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           const AttentionMeta& meta, const AttentionParams& params, Tensor& out) {
  check_act(q, "attention: q must be f32");
  check_act(out, "attention: out must be f32");
  check_caches(k_cache, v_cache, "attention: the caches must be both f32 or both fp8 (e4m3)");
  PAGELLM_CHECK(q.ndim == 3 && out.ndim == 3);
  const int64_t n = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t hkv = k_cache.size(2), dv = v_cache.size(3);
  PAGELLM_CHECK_MSG(k_cache.size(3) == d, "attention: k_cache head_dim differs from q");
  PAGELLM_CHECK_MSG(hkv > 0 && hq % hkv == 0 && v_cache.size(2) == hkv,
                    "attention: query heads must be a multiple of KV heads");
  PAGELLM_CHECK_MSG(out.size(0) == n && out.size(1) == hq && out.size(2) == dv,
                    "attention: out is not [n, Hq, Dv]");
  PAGELLM_CHECK(k_cache.size(1) == meta.block_size && v_cache.size(1) == meta.block_size);
  PAGELLM_CHECK(v_cache.size(0) == k_cache.size(0));
  PAGELLM_CHECK(meta.cu_seqlens_q.dtype == DType::kI32 && meta.seq_lens_kv.dtype == DType::kI32 &&
                meta.block_tables.dtype == DType::kI32);
  PAGELLM_CHECK(meta.cu_seqlens_q.numel() == meta.n_seqs + 1 &&
                meta.seq_lens_kv.numel() == meta.n_seqs && meta.block_tables.size(0) >= meta.n_seqs);
  const int32_t* cu = meta.cu_seqlens_q.ptr<int32_t>();
  const int32_t* lens = meta.seq_lens_kv.ptr<int32_t>();
  const int64_t table_stride = meta.block_tables.row_stride();
  const int64_t max_blocks = meta.block_tables.cols();
  PAGELLM_CHECK_MSG(cu[0] == 0 && cu[meta.n_seqs] == n, "attention: cu_seqlens_q does not cover q");
  for (int32_t s = 0; s < meta.n_seqs; ++s) {
    const int32_t n_q = cu[s + 1] - cu[s];
    // A sequence with no context (a graph batch's padding: one query) gets zeros.
    PAGELLM_CHECK_MSG(n_q >= 0 && (n_q <= lens[s] || (lens[s] == 0 && n_q == 1)),
                      "attention: more queries than KV tokens");
    const int64_t n_blocks = (lens[s] + meta.block_size - 1) / meta.block_size;
    PAGELLM_CHECK_MSG(n_blocks <= max_blocks, "attention: block table too short");
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int32_t blk = meta.block_tables.ptr<int32_t>()[s * table_stride + b];
      PAGELLM_CHECK_MSG(blk >= 0 && blk < k_cache.size(0), "attention: block id out of range");
    }
  }
  if (k_cache.dtype == DType::kF8E4M3)
    return cpu::attention_fp8(q, k_cache, v_cache, meta, params, out, kernels_);
  if (!kernels_) return cpu::ref::attention(q, k_cache, v_cache, meta, params, out);
  PAGELLM_CHECK_MSG(dv <= 1024, "attention: Dv above 1024 is not supported by the fast path");

  std::vector<int32_t> seq_of(n);  // token -> sequence
  for (int32_t s = 0; s < meta.n_seqs; ++s)
    std::fill(seq_of.begin() + cu[s], seq_of.begin() + cu[s + 1], s);
  const int64_t group = hq / hkv;
  // Work items are (head, token), head-major: contiguous chunks then hold whole heads, so causal
  // prefill (later tokens cost more) still spreads evenly.
  ThreadPool::global().parallel_for(hq * n, 1, [&](int64_t b, int64_t e) {
    cpu::AttentionRow a;
    a.k_block_stride = k_cache.stride[0];
    a.k_token_stride = k_cache.stride[1];
    a.v_block_stride = v_cache.stride[0];
    a.v_token_stride = v_cache.stride[1];
    a.block_size = meta.block_size;
    a.head_dim = static_cast<int32_t>(d);
    a.head_dim_v = static_cast<int32_t>(dv);
    a.scale = params.scale;
    a.softcap = params.softcap;
    for (int64_t item = b; item < e; ++item) {
      const int64_t h = item / n, i = item % n;
      const int32_t s = seq_of[i];
      const int32_t n_q = cu[s + 1] - cu[s];
      const int32_t pos = lens[s] - n_q + static_cast<int32_t>(i - cu[s]);
      const int64_t kh = h / group;
      a.q = q.ptr<float>() + i * q.stride[0] + h * q.stride[1];
      a.out = out.ptr<float>() + i * out.stride[0] + h * out.stride[1];
      if (lens[s] == 0) {  // padding (see above)
        std::fill_n(a.out, dv, 0.0f);
        continue;
      }
      a.k_cache = k_cache.ptr<float>() + kh * k_cache.stride[2];
      a.v_cache = v_cache.ptr<float>() + kh * v_cache.stride[2];
      a.block_table = meta.block_tables.ptr<int32_t>() + s * table_stride;
      a.kv_begin = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
      a.kv_end = pos + 1;
      kernels_->attention_row(a);
    }
  });
}

// --- matmul ---

void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  check_act(x, "matmul: x must be f32");
  check_act(out, "matmul: out must be f32");
  PAGELLM_CHECK_MSG(w.ndim == 2 && w.device == Device::kCpu, "matmul: w must be [M, K] on the CPU");
  PAGELLM_CHECK_MSG(w.dtype != DType::kI32 && w.dtype != DType::kI64, "matmul: integer weight");
  PAGELLM_CHECK_MSG(x.cols() == w.size(1), "matmul: x columns differ from w's K");
  PAGELLM_CHECK_MSG(out.rows() == x.rows() && out.cols() == w.size(0), "matmul: out is not [n, M]");
  std::vector<float> bias_f32;
  const float* b = nullptr;
  if (bias.defined()) {
    PAGELLM_CHECK_MSG(bias.numel() == w.size(0) && bias.is_contiguous() && !is_quantized(bias.dtype),
                      "matmul: bias is not [M]");
    if (bias.dtype == DType::kF32) {
      b = bias.ptr<float>();
    } else {
      bias_f32.resize(w.size(0));
      pagellm::to_f32(bias.dtype, bias.data, bias_f32.data(), w.size(0));
      b = bias_f32.data();
    }
  }
  if (x.rows() == 0) return;
  if (!kernels_) return cpu::ref::matmul(x, w, b, out);
  matmul_fast(x, w, b, out);
}

void CpuBackend::matmul_fast(const Tensor& x, const Tensor& w, const float* bias, Tensor& out) {
  const int64_t n = x.rows(), k_dim = x.cols(), m_dim = w.size(0);
  // The kernels take a row stride; 3-D views whose rows are not evenly spaced (rare: a head slice
  // of a wider buffer) go through a contiguous copy.
  auto evenly_strided = [](const Tensor& t) {
    for (int i = 0; i + 2 < t.ndim; ++i)
      if (t.shape[i] != 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1]) return false;
    return true;
  };
  if (!evenly_strided(x) || !evenly_strided(out)) {
    std::vector<float> xc(n * k_dim), oc(n * m_dim);
    for (int64_t r = 0; r < n; ++r) std::memcpy(&xc[r * k_dim], row_f32(x, r), k_dim * 4);
    Tensor xt(xc.data(), DType::kF32, {n, k_dim}), ot(oc.data(), DType::kF32, {n, m_dim});
    matmul_fast(xt, w, bias, ot);
    for (int64_t r = 0; r < n; ++r) std::memcpy(row_f32(out, r), &oc[r * m_dim], m_dim * 4);
    return;
  }
  const float* xp = x.ptr<float>();
  const int64_t ldx = x.ndim == 1 ? k_dim : x.row_stride();
  float* op = out.ptr<float>();
  const int64_t ldo = out.ndim == 1 ? m_dim : out.row_stride();
  const cpu::WeightRows wr{static_cast<const char*>(w.data), dtype_bytes(w.dtype, w.stride[0]),
                           w.dtype, cpu::gemv_prefetch_bytes()};
  ThreadPool& pool = ThreadPool::global();

  if (n <= cpu::kGemvMaxRows) {
    // Decode: memory-bound, every weight row streamed once. Chunks of >= 16 rows keep the
    // per-chunk overhead small; the pool makes at most one chunk per thread.
    pool.parallel_for(m_dim, 16, [&](int64_t b, int64_t e) {
      kernels_->gemv(wr, k_dim, xp, ldx, static_cast<int>(n), bias, op, ldo, b, e);
    });
    return;
  }

  // Prefill: blocked GEMM. A task is (panel of kPanelRows weight rows, block of kRowBlock
  // activation rows); inside it, K is walked in kKc slices: the weight slice is converted to f32
  // once (kPanelRows x kKc floats, ~120 KiB: stays in L2) and used by every activation row.
  constexpr int64_t kKc = 512;  // a multiple of 32 so quantized blocks never straddle slices
  constexpr int64_t kPanelRows = 60;  // a multiple of both ISAs' register tile (4 and 6 rows)
  constexpr int64_t kRowBlock = 256;
  const int64_t n_panels = (m_dim + kPanelRows - 1) / kPanelRows;
  const int64_t n_row_blocks = (n + kRowBlock - 1) / kRowBlock;
  const bool direct = w.dtype == DType::kF32;
  pool.parallel_for(n_panels * n_row_blocks, 1, [&](int64_t tb, int64_t te) {
    thread_local std::vector<float> panel;
    if (!direct) panel.resize(kPanelRows * kKc);
    for (int64_t t = tb; t < te; ++t) {
      const int64_t p = t % n_panels, rb = t / n_panels;
      const int64_t j0 = p * kPanelRows, rows = std::min(kPanelRows, m_dim - j0);
      const int64_t i0 = rb * kRowBlock, n_rows = std::min(kRowBlock, n - i0);
      for (int64_t k0 = 0; k0 < k_dim; k0 += kKc) {
        const int64_t kc = std::min(kKc, k_dim - k0);
        const float* wp;
        int64_t ldw;
        if (direct) {
          wp = reinterpret_cast<const float*>(wr.data + j0 * wr.row_bytes) + k0;
          ldw = w.stride[0];
        } else {
          kernels_->convert_rows(wr, j0, static_cast<int>(rows), k0, kc, panel.data(), kKc);
          wp = panel.data();
          ldw = kKc;
        }
        kernels_->gemm_f32(xp + i0 * ldx + k0, ldx, n_rows, wp, ldw, rows, kc,
                           op + i0 * ldo + j0, ldo, k0 > 0, bias ? bias + j0 : nullptr);
      }
    }
  });
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(bool fast) {
  return std::make_unique<CpuBackend>(fast ? cpu::cpu_kernels() : nullptr);
}

namespace cpu {
std::unique_ptr<Backend> make_cpu_backend_for(const Kernels* kernels) {
  return std::make_unique<CpuBackend>(kernels);
}
}  // namespace cpu

}  // namespace pagellm
