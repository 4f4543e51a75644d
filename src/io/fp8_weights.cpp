#include "io/fp8_weights.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "core/thread_pool.h"
#include "io/converted_weights.h"

namespace pagellm {
namespace {

using io_detail::ends_with;
using io_detail::quote_name;
using io_detail::shape_str;

class Fp8BlockWeights final : public io_detail::ConvertedWeights {
 public:
  Fp8BlockWeights(std::unique_ptr<WeightSource> inner, const QuantConfig& q)
      : ConvertedWeights(std::move(inner)), q_(q) {}

  Status convert() {
    std::unordered_set<std::string> consumed;
    for (const TensorInfo& t : inner_->tensors()) {
      if (t.dtype != DType::kF8E4M3) continue;
      if (!ends_with(t.name, ".weight"))
        return data_loss(describe(t.name) + " is FP8 but not a weight ('<module>.weight')");
      const std::string prefix = t.name.substr(0, t.name.size() - 7);
      PAGELLM_RETURN_IF_ERROR(add_blocks(t, prefix, consumed));
    }
    for (const TensorInfo& t : inner_->tensors()) {
      if (t.dtype == DType::kF8E4M3 || consumed.count(t.name)) continue;
      for (const char* part : {".weight_scale_inv", ".weight_scale", ".input_scale"})
        if (ends_with(t.name, part))
          return data_loss(describe(t.name) + " belongs to no FP8 weight: the checkpoint is inconsistent");
      pass_through(t);
    }
    index();
    return Status::ok_status();
  }

  std::string description() const override { return inner_->description() + " (fp8 e4m3)"; }

 private:
  // A scale tensor's values as f32, each finite and positive.
  Result<std::vector<float>> scale_values(const TensorInfo& s) const {
    const int64_t n = shape_numel(s.shape);
    std::vector<float> out(n);
    if (s.dtype == DType::kF32 || s.dtype == DType::kBF16 || s.dtype == DType::kF16) {
      // An aligned copy first: safetensors may place a tensor at any byte.
      std::vector<uint8_t> raw(s.nbytes);
      std::memcpy(raw.data(), s.data, s.nbytes);
      if (s.nbytes != dtype_bytes(s.dtype, n))
        return data_loss(describe(s.name) + " holds " + std::to_string(s.nbytes) + " bytes for " +
                         std::to_string(n) + " values");
      to_f32(s.dtype, raw.data(), out.data(), n);
    } else {
      return data_loss(describe(s.name) + " is " + std::string(dtype_name(s.dtype)) +
                       ", expected a float scale");
    }
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(out[i]) || out[i] <= 0.0f)
        return data_loss(describe(s.name) + " holds the scale " + std::to_string(out[i]) + " at " +
                         std::to_string(i) + ": scales must be finite and positive");
    return out;
  }

  Status add_blocks(const TensorInfo& w, const std::string& prefix,
                    std::unordered_set<std::string>& consumed) {
    if (w.shape.size() != 2 || w.shape[0] <= 0 || w.shape[1] <= 0 || w.shape[1] % 32 != 0)
      return data_loss(describe(w.name) + " has shape " + shape_str(w.shape) +
                       ": FP8 weights must be 2-D with rows a multiple of 32 values");
    const int64_t m = w.shape[0], k = w.shape[1];
    if (w.nbytes != m * k) return data_loss(describe(w.name) + " holds the wrong number of bytes");
    const TensorInfo* s = inner_->find(prefix + ".weight_scale_inv");
    if (!s) s = inner_->find(prefix + ".weight_scale");
    if (!s)
      return not_found(describe(w.name) + " has no scale ('" + prefix + ".weight_scale_inv' or '" +
                       prefix + ".weight_scale')");
    PAGELLM_ASSIGN_OR_RETURN(std::vector<float> scales, scale_values(*s));
    // Which scale covers (row, column): per tensor, per row, or per block.
    int64_t b0 = 0, b1 = 0, per_row = 0;  // block: scales[(r / b0) * per_row + c / b1]
    const int64_t n = shape_numel(s->shape);
    if (n == 1) {
      b0 = m, b1 = k, per_row = 1;
    } else if ((s->shape.size() == 1 && s->shape[0] == m) ||
               (s->shape.size() == 2 && s->shape[0] == m && s->shape[1] == 1)) {
      b0 = 1, b1 = k, per_row = 1;
    } else if (!q_.fp8_block.empty() && s->shape.size() == 2 &&
               s->shape[0] == (m + q_.fp8_block[0] - 1) / q_.fp8_block[0] &&
               s->shape[1] == (k + q_.fp8_block[1] - 1) / q_.fp8_block[1]) {
      b0 = q_.fp8_block[0], b1 = q_.fp8_block[1], per_row = s->shape[1];
    } else {
      std::string want = "[], [1], [" + std::to_string(m) + "] or [" + std::to_string(m) + ", 1]";
      if (!q_.fp8_block.empty())
        want += " or [" + std::to_string((m + q_.fp8_block[0] - 1) / q_.fp8_block[0]) + ", " +
                std::to_string((k + q_.fp8_block[1] - 1) / q_.fp8_block[1]) + "] (blocks of " +
                std::to_string(q_.fp8_block[0]) + " x " + std::to_string(q_.fp8_block[1]) + ")";
      return data_loss(describe(s->name) + " has shape " + shape_str(s->shape) + " for the weight " +
                       shape_str(w.shape) + ": expected " + want);
    }
    if (const TensorInfo* in = inner_->find(prefix + ".input_scale")) {
      PAGELLM_RETURN_IF_ERROR(scale_values(*in).status());
      if (shape_numel(in->shape) != 1)
        return data_loss(describe(in->name) + " must hold one value, has shape " + shape_str(in->shape));
      consumed.insert(in->name);
    }
    consumed.insert(s->name);

    // NaN codes (S.1111.111) mean a broken file; refused, the kernels need not decode them. The
    // copy looks for them as it goes, and the first (lowest index) is reported.
    const int64_t blocks = k / 32;
    auto buf = std::make_unique<uint8_t[]>(dtype_bytes(DType::kF8B32, m * k));
    auto* out = reinterpret_cast<BlockF8B32*>(buf.get());
    const auto* codes = static_cast<const uint8_t*>(w.data);
    std::atomic<int64_t> first_nan{m * k};
    ThreadPool::global().parallel_for(m, 16, [&](int64_t rb, int64_t re) {
      for (int64_t i = rb * k; i < re * k; ++i)
        if ((codes[i] & 0x7f) == 0x7f) {
          int64_t seen = first_nan.load();
          while (i < seen && !first_nan.compare_exchange_weak(seen, i)) {
          }
          return;
        }
      for (int64_t r = rb; r < re; ++r)
        for (int64_t j = 0; j < blocks; ++j) {
          BlockF8B32& b = out[r * blocks + j];
          b.d = scales[(r / b0) * per_row + (32 * j) / b1];
          std::memcpy(b.q, codes + r * k + 32 * j, 32);
        }
    });
    if (const int64_t i = first_nan.load(); i < m * k)
      return data_loss(describe(w.name) + " holds a NaN (code " + std::to_string(codes[i]) +
                       ") at " + std::to_string(i));
    TensorInfo t;
    t.name = w.name;
    t.dtype = DType::kF8B32;
    t.shape = w.shape;
    t.data = buf.get();
    t.nbytes = dtype_bytes(DType::kF8B32, m * k);
    t.file = w.file;
    add_converted(std::move(t), std::move(buf));
    return Status::ok_status();
  }

  QuantConfig q_;
};

}  // namespace

Result<std::unique_ptr<WeightSource>> fp8_block_weights(std::unique_ptr<WeightSource> fp8,
                                                        const QuantConfig& q) {
  auto w = std::make_unique<Fp8BlockWeights>(std::move(fp8), q);
  PAGELLM_RETURN_IF_ERROR(w->convert());
  return std::unique_ptr<WeightSource>(std::move(w));
}

}  // namespace pagellm
