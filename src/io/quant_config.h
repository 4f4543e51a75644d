// QuantConfig: how a Hugging Face checkpoint's linear weights are packed, from config.json's
// `quantization_config`. The 4-bit group-quantized formats (AWQ's GEMM layout, GPTQ, and
// compressed-tensors' pack-quantized W4A16) are read; any other method, bit width or layout is
// refused at parse time with an error naming the field, never loaded as something else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace pagellm {

enum class QuantMethod { kAwq, kGptq, kCompressedTensors };

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
};

// Parses the `quantization_config` object (JSON text of it); `path` is for messages.
Result<QuantConfig> parse_quant_config(const std::string& json_text, const std::string& path);
// The same from the object as config.cpp reads it (io/json_fields.h).
namespace io_detail {
class Fields;
}
Result<QuantConfig> parse_quant_config(const io_detail::Fields& quantization_config);

// "awq", "gptq", "compressed-tensors".
const char* quant_method_name(QuantMethod m);

// The weights 4-bit checkpoints quantize: the decoder's 2-D projections ("...layers.N...weight"),
// less norms and the MoE routers that score experts (mlp.gate, block_sparse_moe.gate), which
// AWQ's and GPTQ's writers leave in float like the embeddings and the LM head.
bool is_quantized_projection(const std::string& name, size_t ndim);

}  // namespace pagellm
