#include "backend/profiling_backend.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <utility>

#include "core/check.h"

namespace pagellm {
namespace op_cost {
namespace {

std::string key(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

long long ll(int64_t v) { return static_cast<long long>(v); }

// Bytes of a tensor's elements at its storage size (blocks for quantized dtypes).
double bytes_of(const Tensor& t) { return t.defined() ? static_cast<double>(dtype_bytes(t.dtype, t.numel())) : 0.0; }

// Whether `inner` starts inside the first row of `outer` with the same row strides: a column
// view of the same rows (MLA keeps V as the trailing columns of the latent K row).
bool column_view_of(const Tensor& inner, const Tensor& outer) {
  if (!inner.defined() || !outer.defined() || inner.ndim != outer.ndim) return false;
  const char* a = static_cast<const char*>(inner.data);
  const char* b = static_cast<const char*>(outer.data);
  if (a < b || a >= b + dtype_bytes(outer.dtype, outer.cols())) return false;
  for (int i = 0; i + 1 < outer.ndim; ++i)
    if (inner.stride[i] != outer.stride[i] || inner.shape[i] != outer.shape[i]) return false;
  return true;
}

OpSample make_sample(const char* op, std::string shape, double bytes, double flops = 0) {
  OpSample s;
  s.op = op;
  s.shape = std::move(shape);
  s.bytes = bytes;
  s.flops = flops;
  return s;
}

}  // namespace

OpSample embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const int64_t n = ids.numel(), d = table.cols();
  // Only the looked-up rows of the table are read.
  const double rows = static_cast<double>(dtype_bytes(table.dtype, n * d));
  return make_sample("embedding", key("n=%lld d=%lld %s", ll(n), ll(d), std::string(dtype_name(table.dtype)).c_str()),
                rows + bytes_of(ids) + bytes_of(out));
}

OpSample rms_norm(const Tensor& x, const Tensor& w, const Tensor& out) {
  return make_sample("rms_norm", key("n=%lld d=%lld", ll(x.rows()), ll(x.cols())),
                bytes_of(x) + bytes_of(w) + bytes_of(out));
}

OpSample add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& out) {
  // The residual is read and written back; x read; out written.
  return make_sample("add_rms_norm", key("n=%lld d=%lld", ll(x.rows()), ll(x.cols())),
                bytes_of(x) + 2 * bytes_of(residual) + bytes_of(w) + bytes_of(out));
}

OpSample matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  const int64_t n = x.rows(), k = x.cols(), m = w.rows();
  std::string shape = key("n=%lld k=%lld m=%lld %s%s", ll(n), ll(k), ll(m),
                          std::string(dtype_name(w.dtype)).c_str(), bias.defined() ? " +bias" : "");
  return make_sample("matmul", std::move(shape), bytes_of(w) + bytes_of(x) + bytes_of(out) + bytes_of(bias),
                2.0 * static_cast<double>(n) * static_cast<double>(m) * static_cast<double>(k));
}

OpSample matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  OpSample s = matmul(x, w, bias, out);
  s.op = "matmul_add";
  s.bytes += bytes_of(out);  // out is read as well as written
  return s;
}

OpSample rms_norm_matmul(const char* op, const Tensor& x, const Tensor& norm_w, const Tensor& w,
                         const Tensor& bias, const Tensor& out) {
  const int64_t n = x.rows(), k = x.cols(), m = w.rows();
  std::string shape = key("n=%lld k=%lld m=%lld %s%s", ll(n), ll(k), ll(m),
                          std::string(dtype_name(w.dtype)).c_str(), bias.defined() ? " +bias" : "");
  return make_sample(
      op, std::move(shape),
      bytes_of(w) + bytes_of(x) + bytes_of(norm_w) + bytes_of(out) + bytes_of(bias),
      2.0 * static_cast<double>(n) * static_cast<double>(m) * static_cast<double>(k));
}

OpSample batched_matmul(const Tensor& x, const Tensor& w, const Tensor& out) {
  const int64_t b = x.size(0), n = x.size(1), k = x.size(2), m = w.size(1);
  // An operand repeated across the batch (stride 0) is read once.
  const auto read = [b](const Tensor& t) {
    return t.stride[0] == 0 && b > 0 ? bytes_of(t) / static_cast<double>(b) : bytes_of(t);
  };
  std::string shape = key("b=%lld n=%lld k=%lld m=%lld %s", ll(b), ll(n), ll(k), ll(m),
                          std::string(dtype_name(w.dtype)).c_str());
  return make_sample("batched_matmul", std::move(shape), read(w) + read(x) + bytes_of(out),
                     2.0 * static_cast<double>(b) * static_cast<double>(n) * static_cast<double>(m) *
                         static_cast<double>(k));
}

OpSample rope_store_kv(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos_sin,
                       const Tensor& slot_mapping, const Tensor& k_cache, const Tensor& v_cache) {
  const int64_t n = q.size(0), hq = q.size(1), hkv = k.size(1), d = k.size(2), dv = v.size(2);
  const bool v_in_k = column_view_of(v, k), vc_in_kc = column_view_of(v_cache, k_cache);
  // q and k are rotated in place (read + written); the new keys and values go to the cache.
  const double elem = static_cast<double>(dtype_bytes(k_cache.dtype, 1));
  const double stored =
      static_cast<double>(n * hkv) * elem * static_cast<double>(vc_in_kc ? d : d + dv);
  const double bytes = 2 * bytes_of(q) + 2 * bytes_of(k) + (v_in_k ? 0 : bytes_of(v)) + bytes_of(cos_sin) +
                       bytes_of(slot_mapping) + stored;
  return make_sample("rope_store_kv",
                key("n=%lld hq=%lld hkv=%lld d=%lld dv=%lld rot=%lld", ll(n), ll(hq), ll(hkv), ll(d), ll(dv),
                    ll(cos_sin.cols())),
                bytes);
}

OpSample rope(const Tensor& x, const Tensor& cos_sin) {
  return make_sample("rope",
                key("n=%lld h=%lld d=%lld rot=%lld", ll(x.size(0)), ll(x.ndim >= 3 ? x.size(1) : 1), ll(x.cols()),
                    ll(cos_sin.cols())),
                2 * bytes_of(x) + bytes_of(cos_sin));
}

OpSample attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMeta& meta,
                   const Tensor& out) {
  const int64_t n = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t hkv = k_cache.size(2), dv = v_cache.size(3);
  const bool v_in_k = column_view_of(v_cache, k_cache);
  const double elem = static_cast<double>(dtype_bytes(k_cache.dtype, 1));
  const double kv_bytes = static_cast<double>(meta.total_kv_tokens) * static_cast<double>(hkv) * elem *
                          static_cast<double>(v_in_k ? k_cache.cols() : k_cache.cols() + dv);
  const double flops = 2.0 * static_cast<double>(meta.total_qk_pairs) * static_cast<double>(hq) *
                       static_cast<double>(d + dv);
  // Without the host-side totals (metadata not made by StepBatchBuilder) the KV traffic is
  // unknown: the key says so rather than report a rate that leaves it out silently.
  const std::string kv = meta.total_kv_tokens > 0 ? std::to_string(meta.total_kv_tokens) : std::string("?");
  return make_sample("attention",
                key("seqs=%d q=%lld kv=%s hq=%lld hkv=%lld d=%lld dv=%lld", meta.n_seqs, ll(n), kv.c_str(), ll(hq),
                    ll(hkv), ll(d), ll(dv)),
                bytes_of(q) + bytes_of(out) + kv_bytes, flops);
}

OpSample attention_project(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           const AttentionMeta& meta, const Tensor& w, const Tensor& attn,
                           const Tensor& out) {
  // The attention's traffic and the product's weights and output (attn need not travel: a
  // backend may keep it on chip).
  OpSample s = attention(q, k_cache, v_cache, meta, attn);
  const OpSample p = batched_matmul(attn.transpose01(), w, out.transpose01());
  s.op = "attention_project";
  s.shape += key(" m=%lld %s", ll(w.size(1)), std::string(dtype_name(w.dtype)).c_str());
  s.bytes += bytes_of(w) + bytes_of(out);
  s.flops += p.flops;
  return s;
}

OpSample silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  return make_sample("silu_mul", key("n=%lld f=%lld", ll(gate.rows()), ll(gate.cols())),
                bytes_of(gate) + bytes_of(up) + bytes_of(out));
}

OpSample add(const Tensor& a, const Tensor& b, const Tensor& out) {
  return make_sample("add", key("n=%lld d=%lld", ll(a.rows()), ll(a.cols())), bytes_of(a) + bytes_of(b) + bytes_of(out));
}

OpSample gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
  // Only the gathered rows of x are read: as many as out has.
  return make_sample("gather_rows", key("m=%lld d=%lld", ll(out.rows()), ll(out.cols())),
                static_cast<double>(dtype_bytes(x.dtype, out.rows() * x.cols())) + bytes_of(rows) + bytes_of(out));
}

OpSample moe_route(const Tensor& logits, const Tensor& ids, const Tensor& weights) {
  return make_sample("moe_route",
                     key("n=%lld e=%lld k=%lld", ll(logits.rows()), ll(logits.cols()), ll(ids.cols())),
                     bytes_of(logits) + bytes_of(ids) + bytes_of(weights));
}

OpSample moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                     const MoeExpertWeights& experts, const Tensor& shared, const Tensor& out) {
  const int64_t n = h.rows(), K = ids.cols(), E = experts.n_experts();
  const int64_t D = experts.hidden(), F = experts.inter();
  double per_expert = 0;
  if (experts.stacked()) {
    per_expert = (bytes_of(experts.gate_up) + bytes_of(experts.down)) / static_cast<double>(std::max<int64_t>(E, 1));
  } else if (E > 0) {
    per_expert = bytes_of(experts.gate[0]) + bytes_of(experts.up[0]) + bytes_of(experts.down_each[0]);
  }
  const double touched = static_cast<double>(std::min(E, n * K));
  const DType wt = experts.stacked() ? experts.gate_up.dtype : (E > 0 ? experts.gate[0].dtype : DType::kF32);
  return make_sample("moe_experts",
                     key("n=%lld e=%lld k=%lld d=%lld f=%lld %s%s", ll(n), ll(E), ll(K), ll(D), ll(F),
                         std::string(dtype_name(wt)).c_str(), shared.defined() ? " +shared" : ""),
                     touched * per_expert + bytes_of(h) + bytes_of(ids) + bytes_of(weights) + bytes_of(shared) +
                         bytes_of(out),
                     6.0 * static_cast<double>(n * K) * static_cast<double>(D) * static_cast<double>(F));
}

OpSample moe_order(const Tensor& ids, const Tensor& order) {
  return make_sample("moe_order", key("n=%lld k=%lld", ll(ids.rows()), ll(ids.cols())),
                     bytes_of(ids) + bytes_of(order));
}

OpSample to_f32(const Tensor& x, const Tensor& out) {
  return make_sample("to_f32", key("n=%lld d=%lld %s", ll(x.rows()), ll(x.cols()), std::string(dtype_name(x.dtype)).c_str()),
                bytes_of(x) + bytes_of(out));
}

OpSample fill_random(const Tensor& t) {
  return make_sample("fill_random", key("numel=%lld %s", ll(t.numel()), std::string(dtype_name(t.dtype)).c_str()),
                bytes_of(t));
}

OpSample sample(const Tensor& logits, const DeviceSampleInputs& in) {
  const int32_t n_rows = in.n_rows;
  const double rows = static_cast<double>(dtype_bytes(logits.dtype, int64_t{n_rows} * logits.cols()));
  const double io =
      static_cast<double>(n_rows) * (sizeof(DeviceSampleRow) + sizeof(DeviceSampleResult)) +
      static_cast<double>(in.n_edits) * sizeof(DeviceSampleEdit) +
      static_cast<double>(in.n_mask_words) * sizeof(uint32_t);
  return make_sample("sample", key("rows=%d vocab=%lld %s", n_rows, ll(logits.cols()),
                              std::string(dtype_name(logits.dtype)).c_str()),
                rows + io);
}

OpSample copy_from_host(int64_t nbytes) {
  return make_sample("copy_from_host", key("bytes=%lld", ll(nbytes)), static_cast<double>(nbytes));
}
OpSample copy_to_host(int64_t nbytes) {
  return make_sample("copy_to_host", key("bytes=%lld", ll(nbytes)), static_cast<double>(nbytes));
}
OpSample copy(int64_t nbytes) { return make_sample("copy", key("bytes=%lld", ll(nbytes)), 2.0 * static_cast<double>(nbytes)); }

}  // namespace op_cost

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {
  PAGELLM_CHECK_MSG(inner_ != nullptr, "ProfilingBackend needs a backend to forward to");
}

void ProfilingBackend::start() {
  if (!timer_) timer_ = inner_->make_op_timer();
  inner_->synchronize();  // earlier work must not land inside the first op's bracket
  timer_->reset();
  pending_.clear();
  done_.clear();
  recording_ = true;
}

void ProfilingBackend::flush() {
  inner_->synchronize();
  for (Pending& p : pending_) {
    p.sample.ms = timer_->elapsed_ms(p.begin, p.end);
    done_.push_back(std::move(p.sample));
  }
  pending_.clear();
  timer_->reset();
}

std::vector<OpSample> ProfilingBackend::stop() {
  PAGELLM_CHECK_MSG(recording_, "ProfilingBackend::stop without start");
  recording_ = false;
  flush();
  return std::move(done_);
}

template <typename Cost, typename Op>
void ProfilingBackend::timed(Cost&& cost, Op&& op) {
  if (!recording_) {
    op();
    return;
  }
  if (pending_.size() >= kFlushOps) flush();
  Pending p;
  p.sample = cost();
  p.begin = timer_->mark();
  op();
  p.end = timer_->mark();
  pending_.push_back(std::move(p));
}

void ProfilingBackend::copy_from_host(void* dst, const void* src, int64_t nbytes) {
  timed([&] { return op_cost::copy_from_host(nbytes); }, [&] { inner_->copy_from_host(dst, src, nbytes); });
}
void ProfilingBackend::copy_to_host(void* dst, const void* src, int64_t nbytes) {
  timed([&] { return op_cost::copy_to_host(nbytes); }, [&] { inner_->copy_to_host(dst, src, nbytes); });
}
void ProfilingBackend::copy(void* dst, const void* src, int64_t nbytes) {
  timed([&] { return op_cost::copy(nbytes); }, [&] { inner_->copy(dst, src, nbytes); });
}

void ProfilingBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  timed([&] { return op_cost::embedding(table, ids, out); }, [&] { inner_->embedding(table, ids, out); });
}
void ProfilingBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  timed([&] { return op_cost::rms_norm(x, w, out); }, [&] { inner_->rms_norm(x, w, eps, out); });
}
void ProfilingBackend::add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps, Tensor& out) {
  timed([&] { return op_cost::add_rms_norm(x, residual, w, out); },
        [&] { inner_->add_rms_norm(x, residual, w, eps, out); });
}
void ProfilingBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  timed([&] { return op_cost::matmul(x, w, bias, out); }, [&] { inner_->matmul(x, w, bias, out); });
}
void ProfilingBackend::matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias,
                                  Tensor& scratch, Tensor& out) {
  timed([&] { return op_cost::matmul_add(x, w, bias, out); },
        [&] { inner_->matmul_add(x, w, bias, scratch, out); });
}
void ProfilingBackend::matmul_swiglu(const Tensor& x, const Tensor& w, const Tensor& bias,
                                     Tensor& gate_up, Tensor& out) {
  timed([&] { return op_cost::rms_norm_matmul("matmul_swiglu", x, Tensor(), w, bias, out); },
        [&] { inner_->matmul_swiglu(x, w, bias, gate_up, out); });
}
void ProfilingBackend::rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps,
                                       const Tensor& w, const Tensor& bias, Tensor& h,
                                       Tensor& out) {
  timed([&] { return op_cost::rms_norm_matmul("rms_norm_matmul", x, norm_w, w, bias, out); },
        [&] { inner_->rms_norm_matmul(x, norm_w, eps, w, bias, h, out); });
}
void ProfilingBackend::rms_norm_swiglu(const Tensor& x, const Tensor& norm_w, float eps,
                                       const Tensor& w, const Tensor& bias, Tensor& h,
                                       Tensor& gate_up, Tensor& out) {
  timed([&] { return op_cost::rms_norm_matmul("rms_norm_swiglu", x, norm_w, w, bias, out); },
        [&] { inner_->rms_norm_swiglu(x, norm_w, eps, w, bias, h, gate_up, out); });
}
void ProfilingBackend::batched_matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  timed([&] { return op_cost::batched_matmul(x, w, out); }, [&] { inner_->batched_matmul(x, w, out); });
}
void ProfilingBackend::rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cos_sin,
                                     bool interleaved, const Tensor& slot_mapping, Tensor& k_cache,
                                     Tensor& v_cache, float k_scale, float v_scale) {
  timed([&] { return op_cost::rope_store_kv(q, k, v, cos_sin, slot_mapping, k_cache, v_cache); },
        [&] {
          inner_->rope_store_kv(q, k, v, cos_sin, interleaved, slot_mapping, k_cache, v_cache,
                                k_scale, v_scale);
        });
}
void ProfilingBackend::rope(Tensor& x, const Tensor& cos_sin, bool interleaved) {
  timed([&] { return op_cost::rope(x, cos_sin); }, [&] { inner_->rope(x, cos_sin, interleaved); });
}
void ProfilingBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                 const AttentionMeta& meta, const AttentionParams& params, Tensor& out) {
  timed([&] { return op_cost::attention(q, k_cache, v_cache, meta, out); },
        [&] { inner_->attention(q, k_cache, v_cache, meta, params, out); });
}
void ProfilingBackend::attention_project(const Tensor& q, const Tensor& k_cache,
                                         const Tensor& v_cache, const AttentionMeta& meta,
                                         const AttentionParams& params, const Tensor& w,
                                         Tensor& attn, Tensor& out) {
  timed([&] { return op_cost::attention_project(q, k_cache, v_cache, meta, w, attn, out); },
        [&] { inner_->attention_project(q, k_cache, v_cache, meta, params, w, attn, out); });
}
void ProfilingBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  timed([&] { return op_cost::silu_mul(gate, up, out); }, [&] { inner_->silu_mul(gate, up, out); });
}
void ProfilingBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  timed([&] { return op_cost::add(a, b, out); }, [&] { inner_->add(a, b, out); });
}
void ProfilingBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  timed([&] { return op_cost::gather_rows(x, rows, out); }, [&] { inner_->gather_rows(x, rows, out); });
}
void ProfilingBackend::to_f32(const Tensor& x, Tensor& out) {
  timed([&] { return op_cost::to_f32(x, out); }, [&] { inner_->to_f32(x, out); });
}
void ProfilingBackend::moe_route(const Tensor& logits, const Tensor& correction_bias, const MoeRouteParams& p,
                                 Tensor& ids, Tensor& weights) {
  timed([&] { return op_cost::moe_route(logits, ids, weights); },
        [&] { inner_->moe_route(logits, correction_bias, p, ids, weights); });
}
void ProfilingBackend::moe_experts(const Tensor& h, const Tensor& ids, const Tensor& weights,
                                   const MoeExpertWeights& experts, const Tensor& shared, Tensor& out) {
  timed([&] { return op_cost::moe_experts(h, ids, weights, experts, shared, out); },
        [&] { inner_->moe_experts(h, ids, weights, experts, shared, out); });
}
void ProfilingBackend::moe_order(const Tensor& ids, int64_t n_experts, Tensor& order) {
  timed([&] { return op_cost::moe_order(ids, order); },
        [&] { inner_->moe_order(ids, n_experts, order); });
}
void ProfilingBackend::moe_experts_ordered(const Tensor& h, const Tensor& ids,
                                           const Tensor& weights, const Tensor& order,
                                           const MoeExpertWeights& experts, const Tensor& shared,
                                           Tensor& out) {
  timed([&] { return op_cost::moe_experts(h, ids, weights, experts, shared, out); },
        [&] { inner_->moe_experts_ordered(h, ids, weights, order, experts, shared, out); });
}
void ProfilingBackend::fill_random(Tensor& t, uint64_t seed, float lo, float hi) {
  timed([&] { return op_cost::fill_random(t); }, [&] { inner_->fill_random(t, seed, lo, hi); });
}
void ProfilingBackend::sample(const Tensor& logits, const DeviceSampleInputs& in,
                              DeviceSampleResult* out) {
  timed([&] { return op_cost::sample(logits, in); }, [&] { inner_->sample(logits, in, out); });
}

uint64_t ProfilingBackend::sample_async(const Tensor& logits, const DeviceSampleInputs& in) {
  uint64_t ticket = 0;
  timed([&] { return op_cost::sample(logits, in); },
        [&] { ticket = inner_->sample_async(logits, in); });
  return ticket;
}

}  // namespace pagellm
