// `pagellm quantize`: a float Hugging Face checkpoint in, a quantized one out that other engines
// load as published:
//   awq        4-bit, AWQ's GEMM packing (vLLM, transformers, TGI). Round-to-nearest with a scale
//              and zero point per group: AWQ's formula without its activation-aware scale
//              search, in f32 with the scale rounded to f16 first (AutoAWQ works in f16
//              throughout, so a value on a rounding tie may land one level apart). AutoAWQ's own
//              dequantize_gemm reads the output as written.
//   fp8        FP8 e4m3 with one f32 scale per output row (the row's largest magnitude / 448),
//              as compressed-tensors' float-quantized channel scheme (vLLM, SGLang).
//   fp8-block  FP8 e4m3 with one f32 scale per 128 x 128 block, DeepSeek-V3's layout
//              (quant_method "fp8", weight_scale_inv; vLLM, SGLang, transformers).
#pragma once

#include <string>

#include "core/status.h"

namespace pagellm {

struct QuantizeOptions {
  std::string format = "awq";  // awq, fp8 or fp8-block
  int group_size = 128;        // awq: 32, 64 or 128
};

// Reads the model folder `model_dir` (config.json + float safetensors) and writes `out_dir`:
// model.safetensors with every decoder projection packed (embeddings, norms, the LM head and MoE
// routers stay as they are), config.json with its quantization_config, and the folder's other
// files (tokenizer, generation config, chat template) copied. `summary` gets a line for the user.
Status quantize_checkpoint(const std::string& model_dir, const std::string& out_dir,
                           const QuantizeOptions& options, std::string* summary);

}  // namespace pagellm
