// Rotary position embedding tables for every RoPE variant pagellm supports (default, linear,
// dynamic NTK, llama3, yarn), computed exactly as Hugging Face transformers computes them: inverse
// frequencies in f32, angles as f32(position) * inv_freq in f32, then cos/sin scaled by the
// variant's attention factor. The model fills a per-token [n, rotary_dim] table (cos half, sin
// half) each step; the backend's rope op applies it.
//
// Dynamic NTK, as in transformers, scales for the length of the current forward call, so its
// result depends on how a prompt is chunked: only an unchunked prefill reproduces transformers'
// single forward pass exactly. Every other variant is position-only and chunk-invariant.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"

namespace pagellm {

class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(const ModelConfig& cfg);

  int64_t rotary_dim() const { return rotary_dim_; }
  // The factor cos/sin are multiplied by (yarn's mscale; 1 otherwise).
  float attention_scaling() const { return attention_scaling_; }

  // Fills out[i * rotary_dim ..] for token i at positions[i]. `seq_len[i]` is the length the
  // dynamic-NTK variant scales for (HF: max position in the forward call + 1); ignored otherwise.
  // Not thread-safe: rows of the base frequencies are computed once and kept (base_row).
  void fill_cos_sin(const int32_t* positions, const int32_t* seq_len, int64_t n, float* out) const;

  // Inverse frequencies for a sequence length (dynamic NTK depends on it), [rotary_dim / 2].
  std::vector<float> inv_freq(int64_t seq_len) const;

  // One step's table: the cos/sin rows of n tokens at `positions` (sequence s owning tokens
  // [cu_seqlens[s], cu_seqlens[s+1]); dynamic NTK scales for each sequence's longest position in
  // the step, as transformers does per forward call), computed on the host and uploaded into
  // rows [0, n) of `dst` (f32 [capacity, rotary_dim] on the backend), which is returned sliced.
  Tensor upload_step_table(const std::vector<int32_t>& positions,
                           const std::vector<int32_t>& cu_seqlens, Backend& backend,
                           const Tensor& dst) const;

 private:
  RopeConfig rope_;
  int64_t rotary_dim_ = 0;
  int64_t max_position_ = 0;
  float attention_scaling_ = 1.0f;
  std::vector<float> base_inv_freq_;  // for every variant but dynamic beyond max_position
  // cos | sin of position `pos` under `freqs`, times attention_scaling_, into row[rotary_dim].
  void compute_row(float pos, const std::vector<float>& freqs, float* row) const;
  // The row of position pos under the base frequencies, from base_rows_ (grown to cover it).
  const float* base_row(int32_t pos) const;

  // Rows of positions [0, size / rotary_dim) under the base frequencies, computed once: a step's
  // table is then copied, not recomputed (the sines and cosines of 512 decoding sequences were
  // two thirds of the engine's host time per step).
  mutable std::vector<float> base_rows_;
  mutable std::vector<float> host_table_;  // upload_step_table's staging
  mutable std::vector<int32_t> seq_len_;
};

}  // namespace pagellm
