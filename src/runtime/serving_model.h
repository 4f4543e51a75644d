// Everything a command needs to serve one model: the checkpoint, the backend, the model on it,
// the tokenizer and the chat template. `generate`, `chat`, `serve` and `bench` all load through
// here, so a model path means the same thing everywhere (a folder, a .gguf file, or nothing: the
// default model that scripts/setup.sh installs).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "core/status.h"
#include "io/weights.h"
#include "model/model.h"
#include "tokenizer/jinja/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

struct ServingModelOptions {
  std::string model_path;      // empty: default_model_path()
  std::string device = "cpu";  // "cpu" or "cuda"
  bool load_tokenizer = true;  // tokenizer + chat template
  // "auto": the checkpoint at model_path; "dummy": random weights of the shape model_path's
  // config.json describes (a file or a folder), made on the device, for benchmarks.
  std::string load_format = "auto";
  // With load_format "dummy": random 4-bit projections, "awq" / "gptq" (their group-128 blocks)
  // or "q4_k"; empty: bf16. On the CPU only for now.
  std::string quantization;
  // Wrap the backend in a ProfilingBackend before the model is loaded, so that every op of a
  // step can be timed (`bench latency --profile`); recording stays off until asked for.
  bool profile_ops = false;
  // Speculative decoding's draft model (--speculative-model): loaded on the same backend, in
  // the same load_format; empty: none.
  std::string speculative_model;
  // Speculative decoding with the checkpoint's multi-token-prediction module
  // (--speculative-method mtp): loaded beside the model.
  bool load_mtp = false;
};

struct ServingModel {
  std::string path;
  LoadedCheckpoint checkpoint;
  std::unique_ptr<Backend> backend;
  ProfilingBackend* profiler = nullptr;  // `backend` itself when profile_ops, else null
  std::unique_ptr<Model> model;
  LoadedCheckpoint draft_checkpoint;           // options.speculative_model's
  std::unique_ptr<Model> draft_model;          // null without options.speculative_model
  std::unique_ptr<MtpModule> mtp;              // null without options.load_mtp
  std::unique_ptr<Tokenizer> tokenizer;        // null when the checkpoint has none
  std::optional<ChatTemplate> chat_template;   // absent when the checkpoint has none
};

Result<std::unique_ptr<ServingModel>> load_serving_model(const ServingModelOptions& options);

// The chat template of a model folder (chat_template.jinja / tokenizer_config.json) or of a GGUF
// file (tokenizer.chat_template, with the bos/eos token texts from its vocabulary).
Result<ChatTemplateSource> load_any_chat_template(const std::string& path);

}  // namespace pagellm
