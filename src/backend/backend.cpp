#include "backend/backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/memory_bandwidth.h"

namespace pagellm {

Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  Tensor t(data(), dtype, shape, device());
  PAGELLM_CHECK_MSG(dtype_bytes(dtype, t.numel()) <= nbytes(), "Buffer::view larger than buffer");
  return t;
}

namespace {

// Host steady-clock timestamps, each taken after the backend has drained its queue.
class HostOpTimer final : public OpTimer {
 public:
  explicit HostOpTimer(Backend& backend) : backend_(backend) {}
  int mark() override {
    backend_.synchronize();
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(marks_.size()) - 1;
  }
  double elapsed_ms(int a, int b) const override {
    PAGELLM_CHECK(a >= 0 && b >= 0 && a < static_cast<int>(marks_.size()) &&
                  b < static_cast<int>(marks_.size()));
    return std::chrono::duration<double, std::milli>(marks_[b] - marks_[a]).count();
  }
  void reset() override { marks_.clear(); }

 private:
  Backend& backend_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

std::unique_ptr<OpTimer> Backend::make_op_timer() { return std::make_unique<HostOpTimer>(*this); }

Backend::HostSampleSlot& Backend::host_sample_slot(uint64_t ticket) {
  HostSampleSlot& slot = host_samples_[ticket % kSampleSlots];
  PAGELLM_CHECK_MSG(ticket != 0 && slot.ticket == ticket,
                    "sampled results asked for after their slot was reused");
  return slot;
}

uint64_t Backend::sample_async(const Tensor& logits, const DeviceSampleInputs& in) {
  const uint64_t ticket = ++host_sample_tickets_;
  HostSampleSlot& slot = host_samples_[ticket % kSampleSlots];
  slot.ticket = ticket;
  slot.results.resize(static_cast<size_t>(std::max(in.n_rows, 0)));  // sample() writes every row
  if (in.n_rows > 0) sample(logits, in, slot.results.data());
  return ticket;
}

void Backend::sample_results(uint64_t ticket, DeviceSampleResult* out) {
  const HostSampleSlot& slot = host_sample_slot(ticket);
  std::copy(slot.results.begin(), slot.results.end(), out);
}

void Backend::take_sampled_tokens(Tensor& tokens, uint64_t ticket) {
  // A synchronous backend's memory is the host's (test doubles that report a device included).
  PAGELLM_CHECK_MSG(tokens.dtype == DType::kI32, "take_sampled_tokens: tokens must be i32");
  const HostSampleSlot& slot = host_sample_slot(ticket);
  int32_t* t = static_cast<int32_t*>(tokens.data);
  for (int64_t i = 0; i < tokens.numel(); ++i)
    t[i] = sampled_token_for(t[i], slot.results.data(), static_cast<int64_t>(slot.results.size()));
}

namespace {

// Entry b of a [B, rows, cols] view, as a 2-D [rows, cols] view with the same row stride.
Tensor batch_entry(const Tensor& t, int64_t b) {
  Tensor e = t;
  e.data = static_cast<char*>(t.data) + dtype_bytes(t.dtype, b * t.stride[0]);
  e.ndim = 2;
  e.shape = {t.shape[1], t.shape[2], 1, 1};
  e.stride = {t.stride[1], 1, 0, 0};
  return e;
}

}  // namespace

void Backend::attention_project(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                const AttentionMeta& meta, const AttentionParams& params,
                                const Tensor& w, Tensor& attn, Tensor& out) {
  PAGELLM_CHECK_MSG(attn.ndim == 3 && out.ndim == 3 && w.ndim == 3,
                    "attention_project: attn and out must be [n, Hq, dim], w [Hq, M, Dv]");
  attention(q, k_cache, v_cache, meta, params, attn);
  Tensor out_heads = out.transpose01();  // [Hq, n, M]: head h is batch entry h
  batched_matmul(attn.transpose01(), w, out_heads);
}

void Backend::batched_matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  PAGELLM_CHECK_MSG(x.ndim == 3 && w.ndim == 3 && out.ndim == 3,
                    "batched_matmul: x, w and out must be 3-D [B, rows, cols]");
  PAGELLM_CHECK_MSG(w.size(0) == x.size(0) && out.size(0) == x.size(0),
                    "batched_matmul: x, w and out disagree on the batch count");
  PAGELLM_CHECK_MSG(!is_quantized(w.dtype), "batched_matmul: w must be f32, f16 or bf16");
  PAGELLM_CHECK_MSG(x.stride[0] >= 0 && w.stride[0] >= 0 && out.stride[0] >= 0,
                    "batched_matmul: negative batch stride");
  for (int64_t b = 0; b < x.size(0); ++b) {
    Tensor ob = batch_entry(out, b);
    matmul(batch_entry(x, b), batch_entry(w, b), Tensor(), ob);
  }
}

void Backend::matmul_add(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& scratch,
                         Tensor& out) {
  PAGELLM_CHECK_MSG(scratch.rows() == out.rows() && scratch.cols() == out.cols(),
                    "matmul_add: scratch is not the shape of out");
  matmul(x, w, bias, scratch);
  add(out, scratch, out);
}

void Backend::rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                              const Tensor& bias, Tensor& h, Tensor& out) {
  PAGELLM_CHECK_MSG(h.rows() == x.rows() && h.cols() == x.cols(),
                    "rms_norm_matmul: h is not the shape of x");
  rms_norm(x, norm_w, eps, h);
  matmul(h, w, bias, out);
}

void Backend::matmul_swiglu(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& gate_up,
                            Tensor& out) {
  const int64_t f = out.cols();
  PAGELLM_CHECK_MSG(w.ndim == 2 && w.size(0) == 2 * f, "matmul_swiglu: w is not [2F, K]");
  PAGELLM_CHECK_MSG(gate_up.rows() == x.rows() && gate_up.cols() == 2 * f,
                    "matmul_swiglu: gate_up is not [n, 2F]");
  matmul(x, w, bias, gate_up);
  silu_mul(gate_up.slice_cols(0, f), gate_up.slice_cols(f, 2 * f), out);
}

void Backend::rms_norm_swiglu(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                              const Tensor& bias, Tensor& h, Tensor& gate_up, Tensor& out) {
  PAGELLM_CHECK_MSG(h.rows() == x.rows() && h.cols() == x.cols(),
                    "rms_norm_swiglu: h is not the shape of x");
  rms_norm(x, norm_w, eps, h);
  matmul_swiglu(h, w, bias, gate_up, out);
}

void Backend::projection_chain(const std::vector<ProjectionLink>& links) {
  for (const ProjectionLink& k : links) {
    switch (k.kind) {
      case ProjectionLink::Kind::kMatmulAdd:
        matmul_add(*k.x, *k.w, *k.bias, *k.scratch, *k.out);
        break;
      case ProjectionLink::Kind::kNormMatmul:
        rms_norm_matmul(*k.x, *k.norm_w, k.eps, *k.w, *k.bias, *k.scratch, *k.out);
        break;
      case ProjectionLink::Kind::kNormSwiGlu:
        rms_norm_swiglu(*k.x, *k.norm_w, k.eps, *k.w, *k.bias, *k.scratch, *k.gate_up, *k.out);
        break;
    }
  }
}

std::string memory_size(int64_t nbytes) {
  char s[32];
  const double b = static_cast<double>(nbytes);
  if (nbytes >= (int64_t{1} << 30))
    std::snprintf(s, sizeof s, "%.2f GiB", b / (1 << 30));
  else if (nbytes >= (1 << 20))
    std::snprintf(s, sizeof s, "%.1f MiB", b / (1 << 20));
  else if (nbytes >= (1 << 10))
    std::snprintf(s, sizeof s, "%.1f KiB", b / (1 << 10));
  else
    std::snprintf(s, sizeof s, "%lld bytes", static_cast<long long>(nbytes));
  return s;
}

Result<std::unique_ptr<Buffer>> Backend::allocate_or_error(int64_t nbytes,
                                                           const std::string& what) {
  std::unique_ptr<Buffer> buf = allocate(nbytes);
  if (buf == nullptr) {
    return resource_exhausted(name() + " is out of memory for " + what + ": " +
                              memory_size(nbytes) + " wanted, " + memory_size(free_memory()) +
                              " free");
  }
  return buf;
}

std::unique_ptr<Buffer> Backend::must_allocate(int64_t nbytes, const std::string& what) {
  Result<std::unique_ptr<Buffer>> buf = allocate_or_error(nbytes, what);
  if (!buf.ok()) {
    std::fprintf(stderr, "%s\n", buf.status().message().c_str());
    PAGELLM_CHECK_MSG(false, "out of memory for an allocation a step cannot do without");
  }
  return std::move(buf).value();
}

double measure_memory_bandwidth_gbs(Backend& backend) {
  if (backend.device() == Device::kCpu) return measure_read_bandwidth_gbs();
  // 1 GiB each way, well past any cache; best of several copies.
  constexpr int64_t kBytes = int64_t{1} << 30;
  auto src = backend.must_allocate(kBytes, "the bandwidth measurement's source"),
       dst = backend.must_allocate(kBytes, "the bandwidth measurement's destination");
  backend.copy(dst->data(), src->data(), kBytes);  // warm-up
  backend.synchronize();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    backend.copy(dst->data(), src->data(), kBytes);
    backend.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * kBytes / s / 1e9);
  }
  return best;
}

#ifndef PAGELLM_HAVE_CUDA
Result<std::unique_ptr<Backend>> make_cuda_backend(int) {
  return unimplemented("this build of pagellm has no CUDA backend (configure with --preset cuda)");
}
#endif

}  // namespace pagellm
