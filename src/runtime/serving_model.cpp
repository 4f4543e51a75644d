#include "runtime/serving_model.h"

#include <filesystem>

#include "core/log.h"
#include "io/default_model.h"
#include "io/gguf.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

// tokenizer.chat_template and the bos/eos token texts of a GGUF file.
Result<ChatTemplateSource> load_gguf_template(const std::string& path) {
  PAGELLM_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(path));
  ChatTemplateSource src;
  src.origin = path;
  PAGELLM_ASSIGN_OR_RETURN(src.source, gguf.get_string("tokenizer.chat_template"));
  auto tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  auto token_text = [&](const char* key) -> std::string {
    auto id = gguf.get_i64(key);
    if (!id.ok() || !tokens.ok() || *id < 0 || *id >= static_cast<int64_t>(tokens->size())) return "";
    return (*tokens)[static_cast<size_t>(*id)];
  };
  src.bos_token = token_text("tokenizer.ggml.bos_token_id");
  src.eos_token = token_text("tokenizer.ggml.eos_token_id");
  return src;
}

}  // namespace

Result<ChatTemplateSource> load_any_chat_template(const std::string& path) {
  if (fs::path(path).extension() == ".gguf") return load_gguf_template(path);
  return load_chat_template(path);
}

Result<std::unique_ptr<ServingModel>> load_serving_model(const ServingModelOptions& options) {
  auto sm = std::make_unique<ServingModel>();
  sm->path = options.model_path.empty() ? default_model_path() : options.model_path;
  if (options.model_path.empty() && !fs::exists(sm->path)) {
    return not_found("the default model is not installed at " + sm->path +
                     " (run scripts/setup.sh, or give --model DIR)");
  }
  LoadOptions load;
  if (!options.quantization.empty()) {
    if (options.load_format != "dummy")
      return invalid_argument("--quantization " + options.quantization +
                              " is for --load-format dummy: a checkpoint's own quantization is "
                              "read from it");
    if (options.quantization == "awq" || options.quantization == "gptq") {
      load.dummy_quantized = DType::kI4G128;
    } else if (options.quantization == "q4_k") {
      load.dummy_quantized = DType::kQ4_K;
    } else if (options.quantization == "fp8" || options.quantization == "fp8-block") {
      // The CPU's blocks hold either. The GPU keeps block scales per 128 values of a row
      // (F8G128) and per-channel ones per row (F8Row; the dummy's scale is one for all rows).
      load.dummy_quantized = options.device == "cpu"               ? DType::kF8B32
                             : options.quantization == "fp8-block" ? DType::kF8G128
                                                                   : DType::kF8Row;
    } else {
      return invalid_argument("--quantization must be awq, gptq, q4_k, fp8 or fp8-block, got '" +
                              options.quantization + "'");
    }
    if (options.device != "cpu" && load.dummy_quantized == DType::kQ4_K)
      return unimplemented("--quantization q4_k on --device " + options.device +
                           ": the GPU keeps the 4-bit group types (awq, gptq) and Q4_0 4-bit; "
                           "k-quants are dequantized to bf16 there, so the figures would be "
                           "bf16's");
  }
  if (options.load_format == "dummy") {
    PAGELLM_ASSIGN_OR_RETURN(sm->checkpoint, open_dummy_checkpoint(sm->path));
  } else if (options.load_format == "auto") {
    PAGELLM_ASSIGN_OR_RETURN(sm->checkpoint, open_checkpoint(sm->path));
  } else {
    return invalid_argument("--load-format must be auto or dummy, got '" + options.load_format +
                            "'");
  }
  if (options.device == "cuda") {
    PAGELLM_ASSIGN_OR_RETURN(sm->backend, make_cuda_backend(0));
  } else if (options.device == "cpu") {
    sm->backend = make_cpu_backend();
  } else {
    return invalid_argument("--device must be cpu or cuda, got '" + options.device + "'");
  }
  if (options.profile_ops) {
    auto prof = std::make_unique<ProfilingBackend>(std::move(sm->backend));
    sm->profiler = prof.get();
    sm->backend = std::move(prof);
  }
  PAGELLM_ASSIGN_OR_RETURN(sm->model, load_model(sm->checkpoint, *sm->backend, load));
  if (!options.speculative_model.empty()) {
    auto ckpt = options.load_format == "dummy" ? open_dummy_checkpoint(options.speculative_model)
                                               : open_checkpoint(options.speculative_model);
    if (!ckpt.ok())
      return Status(ckpt.status().code(), "--speculative-model: " + ckpt.status().message());
    sm->draft_checkpoint = std::move(*ckpt);
    auto draft = load_model(sm->draft_checkpoint, *sm->backend, load);
    if (!draft.ok())
      return Status(draft.status().code(), "--speculative-model: " + draft.status().message());
    sm->draft_model = std::move(*draft);
  }
  if (options.load_mtp) {
    auto mtp = load_mtp_module(sm->checkpoint, *sm->backend, *sm->model, load);
    if (!mtp.ok())
      return Status(mtp.status().code(), "--speculative-method mtp: " + mtp.status().message());
    sm->mtp = std::move(*mtp);
  }
  if (options.load_tokenizer && options.load_format != "dummy") {
    const std::string tok_path =
        sm->checkpoint.gguf_path.empty() ? sm->path : sm->checkpoint.gguf_path;
    auto tok = load_tokenizer(tok_path);
    if (tok.ok()) {
      sm->tokenizer = std::move(*tok);
    } else {
      PAGELLM_LOG_WARN("no tokenizer (%s): token ids only", tok.status().message().c_str());
    }
    auto src = load_any_chat_template(tok_path);
    if (src.ok()) {
      auto tpl = ChatTemplate::create(*src);
      if (!tpl.ok()) return tpl.status();
      sm->chat_template = std::move(*tpl);
    } else {
      PAGELLM_LOG_INFO("no chat template (%s)", src.status().message().c_str());
    }
  }
  return sm;
}

}  // namespace pagellm
