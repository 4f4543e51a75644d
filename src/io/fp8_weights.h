// FP8 checkpoints (config `quantization_config` with quant_method "fp8", or compressed-tensors'
// float-quantized scheme) as F8B32 weights: each e4m3 "<module>.weight" [out, in] and its scale
// ("<module>.weight_scale_inv" as DeepSeek-V3 and transformers' fine-grained FP8 name it, or
// "<module>.weight_scale") become one F8B32 tensor of 32-value blocks, each block with the scale
// that covers it: the tensor's (a scale of one value), its row's ([out] or [out, 1]) or its
// block's ([ceil(out / b0), ceil(in / b1)] for the config's block size [b0, b1]). The values are
// the checkpoint's exactly: d * e4m3 in f32 is its own dequantization. Static activation scales
// ("<module>.input_scale") are checked and left out (weight-only dequantization does not use
// them). Every other tensor passes through.
#pragma once

#include <memory>

#include "core/status.h"
#include "io/quant_config.h"
#include "io/weights.h"

namespace pagellm {

// Converts every FP8 weight of `fp8` now (held in memory). An FP8 weight without a scale or with a
// NaN value, a scale of the wrong shape or type, or one that is not finite and positive (NaN,
// zero, negative) is an error naming the tensor; so is a scale with no FP8 weight beside it.
Result<std::unique_ptr<WeightSource>> fp8_block_weights(std::unique_ptr<WeightSource> fp8,
                                                        const QuantConfig& q);

}  // namespace pagellm
