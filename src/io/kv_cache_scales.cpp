#include "io/kv_cache_scales.h"

#include <cmath>
#include <string>

namespace pagellm {
namespace {

Result<float> read_scale(const WeightSource& w, const std::string& name) {
  PAGELLM_ASSIGN_OR_RETURN(Tensor t, w.get(name));
  if (t.numel() != 1 || is_quantized(t.dtype))
    return invalid_argument(w.description() + ": '" + name + "' must be one float, got " +
                            t.shape_string() + " " + std::string(dtype_name(t.dtype)));
  float v = 0.0f;
  to_f32(t.dtype, t.data, &v, 1);
  if (!std::isfinite(v) || v <= 0.0f)
    return invalid_argument(w.description() + ": '" + name + "' is " + std::to_string(v) +
                            ": a KV cache scale must be positive and finite");
  return v;
}

}  // namespace

Result<std::vector<std::pair<float, float>>> read_kv_cache_scales(const WeightSource& weights,
                                                                  int64_t n_layers) {
  std::vector<std::pair<float, float>> scales;
  if (weights.is_dummy()) return scales;  // random weights (every name "exists"): no scales
  int64_t found = 0;
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
    const bool kv = weights.find(p + "kv_scale") != nullptr;
    const bool k = weights.find(p + "k_scale") != nullptr,
               v = weights.find(p + "v_scale") != nullptr;
    if (!kv && !k && !v) continue;
    if (!kv && !(k && v))
      return invalid_argument(weights.description() + ": layer " + std::to_string(i) +
                              " has only one of self_attn.k_scale and self_attn.v_scale");
    std::pair<float, float> s;
    if (kv) {
      PAGELLM_ASSIGN_OR_RETURN(s.first, read_scale(weights, p + "kv_scale"));
      s.second = s.first;
    } else {
      PAGELLM_ASSIGN_OR_RETURN(s.first, read_scale(weights, p + "k_scale"));
      PAGELLM_ASSIGN_OR_RETURN(s.second, read_scale(weights, p + "v_scale"));
    }
    scales.resize(static_cast<size_t>(n_layers), {1.0f, 1.0f});
    scales[static_cast<size_t>(i)] = s;
    ++found;
  }
  if (found > 0 && found < n_layers)
    return invalid_argument(weights.description() + ": KV cache scales for " +
                            std::to_string(found) + " of " + std::to_string(n_layers) +
                            " layers (self_attn.k_scale / v_scale): all or none");
  return scales;
}

}  // namespace pagellm
