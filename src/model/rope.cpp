#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace pagellm {
namespace {

constexpr double kPi = 3.14159265358979323846;

// base^(2i/dim) in f32, as torch evaluates `base ** (arange(0, dim, 2).float() / dim)`.
std::vector<float> default_inv_freq(double base, int64_t dim) {
  std::vector<float> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float p = std::pow(static_cast<float>(base), exponent);
    f[i] = 1.0f / p;
  }
  return f;
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const ModelConfig& cfg)
    : rope_(cfg.rope), rotary_dim_(cfg.rotary_dim()), max_position_(cfg.max_position_embeddings) {
  PAGELLM_CHECK(rotary_dim_ > 0 && rotary_dim_ % 2 == 0);
  const int64_t dim = rotary_dim_;
  base_inv_freq_ = default_inv_freq(rope_.theta, dim);
  switch (rope_.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:  // below max_position dynamic equals default
      break;
    case RopeType::kLinear:
      for (float& f : base_inv_freq_) f = f / static_cast<float>(rope_.factor);
      break;
    case RopeType::kLlama3: {
      const double old_ctx = static_cast<double>(rope_.original_max_position_embeddings);
      const double low_wavelen = old_ctx / rope_.low_freq_factor;
      const double high_wavelen = old_ctx / rope_.high_freq_factor;
      for (float& f : base_inv_freq_) {
        const float wavelen = static_cast<float>(2 * kPi) / f;
        if (wavelen > low_wavelen) {
          f = f / static_cast<float>(rope_.factor);
        } else if (wavelen >= high_wavelen) {
          // Smooth interpolation between the scaled and unscaled frequency.
          const float smooth = static_cast<float>(
              (old_ctx / wavelen - rope_.low_freq_factor) /
              (rope_.high_freq_factor - rope_.low_freq_factor));
          f = (1 - smooth) * f / static_cast<float>(rope_.factor) + smooth * f;
        }
      }
      break;
    }
    case RopeType::kYarn: {
      double factor = rope_.factor;
      const double orig = static_cast<double>(rope_.original_max_position_embeddings
                                                  ? rope_.original_max_position_embeddings
                                                  : max_position_);
      if (rope_.attention_factor) {
        attention_scaling_ = static_cast<float>(*rope_.attention_factor);
      } else if (rope_.mscale && rope_.mscale_all_dim && *rope_.mscale && *rope_.mscale_all_dim) {
        attention_scaling_ = static_cast<float>(yarn_get_mscale(factor, *rope_.mscale) /
                                                yarn_get_mscale(factor, *rope_.mscale_all_dim));
      } else {
        attention_scaling_ = static_cast<float>(yarn_get_mscale(factor, 1.0));
      }
      auto correction_dim = [&](double n_rot) {
        return (dim * std::log(orig / (n_rot * 2 * kPi))) / (2 * std::log(rope_.theta));
      };
      double low = correction_dim(rope_.beta_fast), high = correction_dim(rope_.beta_slow);
      if (rope_.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // avoid a zero-width ramp
      for (int64_t i = 0; i < dim / 2; ++i) {
        const float pos_freq = 1.0f / base_inv_freq_[i];  // base^(2i/dim), as HF's pos_freqs
        const float extrap = 1.0f / pos_freq;
        const float interp = 1.0f / (static_cast<float>(factor) * pos_freq);
        float ramp = (static_cast<float>(i) - static_cast<float>(low)) /
                     (static_cast<float>(high) - static_cast<float>(low));
        ramp = std::clamp(ramp, 0.0f, 1.0f);
        const float extrap_factor = 1.0f - ramp;
        base_inv_freq_[i] = interp * (1 - extrap_factor) + extrap * extrap_factor;
      }
      break;
    }
  }
}

std::vector<float> RotaryEmbedding::inv_freq(int64_t seq_len) const {
  if (rope_.type != RopeType::kDynamic || seq_len <= max_position_) return base_inv_freq_;
  // Dynamic NTK: grow the base with the sequence beyond the trained length.
  const double factor = rope_.factor, dim = static_cast<double>(rotary_dim_);
  const double base =
      rope_.theta * std::pow((factor * seq_len / max_position_) - (factor - 1), dim / (dim - 2));
  return default_inv_freq(base, rotary_dim_);
}

void RotaryEmbedding::compute_row(float pos, const std::vector<float>& freqs, float* row) const {
  const int64_t half = rotary_dim_ / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float angle = pos * freqs[j];  // f32 product, as torch's f32 matmul
    row[j] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scaling_;
    row[half + j] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scaling_;
  }
}

const float* RotaryEmbedding::base_row(int32_t pos) const {
  const int64_t have = static_cast<int64_t>(base_rows_.size()) / rotary_dim_;
  if (pos >= have) {
    // Geometric growth: a context that lengthens one token a step recomputes nothing.
    const int64_t want = std::max<int64_t>({int64_t{pos} + 1, 2 * have, 1024});
    base_rows_.resize(want * rotary_dim_);
    for (int64_t p = have; p < want; ++p)
      compute_row(static_cast<float>(p), base_inv_freq_, base_rows_.data() + p * rotary_dim_);
  }
  return base_rows_.data() + int64_t{pos} * rotary_dim_;
}

void RotaryEmbedding::fill_cos_sin(const int32_t* positions, const int32_t* seq_len, int64_t n,
                                   float* out) const {
  std::vector<float> dyn;
  int64_t dyn_len = -1;
  for (int64_t i = 0; i < n; ++i) {
    float* row = out + i * rotary_dim_;
    if (rope_.type == RopeType::kDynamic && seq_len && seq_len[i] > max_position_) {
      if (seq_len[i] != dyn_len) {
        dyn = inv_freq(seq_len[i]);
        dyn_len = seq_len[i];
      }
      compute_row(static_cast<float>(positions[i]), dyn, row);
    } else {
      PAGELLM_CHECK(positions[i] >= 0);
      std::copy_n(base_row(positions[i]), rotary_dim_, row);
    }
  }
}

Tensor RotaryEmbedding::upload_step_table(const std::vector<int32_t>& positions,
                                          const std::vector<int32_t>& cu_seqlens,
                                          Backend& backend, const Tensor& dst) const {
  const int64_t n = static_cast<int64_t>(positions.size());
  host_table_.resize(n * rotary_dim_);
  seq_len_.assign(n, 0);
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    int32_t longest = 0;
    for (int32_t i = cu_seqlens[s]; i < cu_seqlens[s + 1]; ++i)
      longest = std::max(longest, positions[i] + 1);
    for (int32_t i = cu_seqlens[s]; i < cu_seqlens[s + 1]; ++i) seq_len_[i] = longest;
  }
  fill_cos_sin(positions.data(), seq_len_.data(), n, host_table_.data());
  Tensor t = dst.slice_rows(0, n);
  backend.copy_from_host(t.data, host_table_.data(), n * rotary_dim_ * 4);
  return t;
}

}  // namespace pagellm
