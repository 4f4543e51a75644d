// The scales of an FP8 KV cache that a checkpoint may carry per attention layer, as vLLM's FP8
// checkpoints name them: model.layers.{i}.self_attn.k_scale and .v_scale, or one .kv_scale for
// both (scalars; a stored key or value is e4m3(x / scale)).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/status.h"
#include "io/weights.h"

namespace pagellm {

// Per layer (k_scale, v_scale); empty when the checkpoint has none. A checkpoint with some but
// not all of them, or one that is not a positive finite scalar, is kInvalidArgument naming it.
Result<std::vector<std::pair<float, float>>> read_kv_cache_scales(const WeightSource& weights,
                                                                  int64_t n_layers);

}  // namespace pagellm
