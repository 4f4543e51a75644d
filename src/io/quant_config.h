// QuantConfig: how a Hugging Face checkpoint's linear weights are packed, from config.json's
// `quantization_config`. The 4-bit group-quantized formats (AWQ's GEMM layout, GPTQ, and
// compressed-tensors' pack-quantized W4A16) and FP8 e4m3 weights (quant_method "fp8", per
// tensor, per channel or in 128 x 128 blocks as DeepSeek-V3 is published, and compressed-tensors'
// float-quantized) are read; any other method, bit width or layout is refused at parse time with
// an error naming the field, never loaded as something else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace pagellm {

enum class QuantMethod { kAwq, kGptq, kCompressedTensors, kFp8 };

struct QuantConfig {
  QuantMethod method = QuantMethod::kAwq;
  int bits = 4;
  // Input values that share one scale and zero point; -1: one group over each whole row.
  int64_t group_size = 128;
  // An explicit zero point per group (AWQ zero_point; GPTQ and compressed-tensors: not symmetric).
  // Symmetric GPTQ stores the zero point 8 anyway; symmetric compressed-tensors stores none.
  bool zero_point = true;
  // GPTQ act-order: input rows quantized in another order, g_idx giving each row's group.
  bool desc_act = false;
  // GPTQ's original ("gptq", v1) format stores each zero point less one; "gptq_v2" as is.
  bool gptq_zeros_minus_one = true;
  // Module names (or name suffixes / prefixes, as the checkpoint writer lists them) left in their
  // float type: AWQ's modules_to_not_convert, compressed-tensors' ignore.
  std::vector<std::string> unquantized_modules;
  // FP8 (bits 8): the [rows, columns] of a weight scale's block (weight_block_size, or
  // compressed-tensors' block_structure); empty where each tensor's scale is per tensor or per
  // output channel (its shape says which). Static activation scales (input_scale tensors) are
  // read by the GPU's FP8 GEMMs; weight-only dequantization ignores them.
  std::vector<int64_t> fp8_block;
  bool fp8_static_activations = false;
};

// Parses the `quantization_config` object (JSON text of it); `path` is for messages.
Result<QuantConfig> parse_quant_config(const std::string& json_text, const std::string& path);
// The same from the object as config.cpp reads it (io/json_fields.h).
namespace io_detail {
class Fields;
}
Result<QuantConfig> parse_quant_config(const io_detail::Fields& quantization_config);

// "awq", "gptq", "compressed-tensors", "fp8".
const char* quant_method_name(QuantMethod m);

// The weights 4-bit checkpoints quantize: the decoder's 2-D projections ("...layers.N...weight"),
// less norms and the MoE routers that score experts (mlp.gate, block_sparse_moe.gate), which
// AWQ's and GPTQ's writers leave in float like the embeddings and the LM head.
bool is_quantized_projection(const std::string& name, size_t ndim);

}  // namespace pagellm
