// ForwardingBackend: a test double that forwards every op to an inner backend (the CPU backend),
// for tests that change one behaviour of a backend and keep the rest: device sampling by its
// contract (engine_device_sampling_test), graph recording by re-running the recorded ops
// (decode_graphs_test). Subclasses override what they change.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"

namespace pagellm {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}

  std::string name() const override { return "forwarding(" + in_.name() + ")"; }
  Device device() const override { return device_ ? *device_ : in_.device(); }
  // Reports `d` as the device (the engine then treats it as a GPU: a profile step at start-up).
  void report_device(Device d) { device_ = d; }
  DType activation_dtype() const override { return in_.activation_dtype(); }
  std::unique_ptr<Buffer> allocate(int64_t n) override { return in_.allocate(n); }
  int64_t free_memory() const override { return in_.free_memory(); }
  void copy_from_host(void* d, const void* s, int64_t n) override { in_.copy_from_host(d, s, n); }
  void copy_to_host(void* d, const void* s, int64_t n) override { in_.copy_to_host(d, s, n); }
  void copy(void* d, const void* s, int64_t n) override { in_.copy(d, s, n); }
  void synchronize() override { in_.synchronize(); }
  void preload_kernels(int64_t max_tokens) override { in_.preload_kernels(max_tokens); }
  bool background_work() override { return in_.background_work(); }
  Result<Tensor> upload_weight(const Tensor& h, DType t, std::unique_ptr<Buffer>& s) override {
    return in_.upload_weight(h, t, s);
  }
  void embedding(const Tensor& a, const Tensor& b, Tensor& o) override { in_.embedding(a, b, o); }
  void rms_norm(const Tensor& x, const Tensor& w, float e, Tensor& o) override {
    in_.rms_norm(x, w, e, o);
  }
  void add_rms_norm(const Tensor& x, Tensor& r, const Tensor& w, float e, Tensor& o) override {
    in_.add_rms_norm(x, r, w, e, o);
  }
  void matmul(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& o) override {
    in_.matmul(x, w, b, o);
  }
  void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& cs, bool il,
                     const Tensor& sm, Tensor& kc, Tensor& vc, float ks, float vs) override {
    in_.rope_store_kv(q, k, v, cs, il, sm, kc, vc, ks, vs);
  }
  bool supports_fp8_kv_cache() const override { return in_.supports_fp8_kv_cache(); }
  void round_to_fp8_cache(Tensor& x, float scale) override { in_.round_to_fp8_cache(x, scale); }
  void rope(Tensor& x, const Tensor& cs, bool il) override { in_.rope(x, cs, il); }
  void attention(const Tensor& q, const Tensor& kc, const Tensor& vc, const AttentionMeta& m,
                 const AttentionParams& p, Tensor& o) override {
    in_.attention(q, kc, vc, m, p, o);
  }
  void silu_mul(const Tensor& g, const Tensor& u, Tensor& o) override { in_.silu_mul(g, u, o); }
  void add(const Tensor& a, const Tensor& b, Tensor& o) override { in_.add(a, b, o); }
  void gather_rows(const Tensor& x, const Tensor& r, Tensor& o) override {
    in_.gather_rows(x, r, o);
  }
  void to_f32(const Tensor& x, Tensor& o) override { in_.to_f32(x, o); }
  void fill_random(Tensor& t, uint64_t s, float lo, float hi) override {
    in_.fill_random(t, s, lo, hi);
  }

 protected:
  Backend& in_;

 private:
  std::optional<Device> device_;
};

}  // namespace pagellm
