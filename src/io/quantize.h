// `pagellm quantize`: a float Hugging Face checkpoint in, a 4-bit one out that other engines load
// as published (vLLM, transformers, TGI: AWQ's GEMM packing). Round-to-nearest with a scale and
// zero point per group: AWQ's formula without its activation-aware scale search, in f32 with the
// scale rounded to f16 first (AutoAWQ works in f16 throughout, so a value on a rounding tie may
// land one level apart). AutoAWQ's own dequantize_gemm reads the output as written.
#pragma once

#include <string>

#include "core/status.h"

namespace pagellm {

struct QuantizeOptions {
  std::string format = "awq";  // the only one written so far
  int group_size = 128;        // 32, 64 or 128
};

// Reads the model folder `model_dir` (config.json + float safetensors) and writes `out_dir`:
// model.safetensors with every decoder projection packed (embeddings, norms, the LM head and MoE
// routers stay as they are), config.json with its quantization_config, and the folder's other
// files (tokenizer, generation config, chat template) copied. `summary` gets a line for the user.
Status quantize_checkpoint(const std::string& model_dir, const std::string& out_dir,
                           const QuantizeOptions& options, std::string* summary);

}  // namespace pagellm
