#include <map>

#include "model/model.h"

#include "io/kv_cache_scales.h"

namespace pagellm {

// Each architecture file defines one of these. They are called explicitly (not from static
// initializers) because a static library drops object files that nothing references.
void register_llama_family();
void register_deepseek_v2();  // DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
void register_mixtral();
// DeepSeek-V3's multi-token-prediction layer (model/deepseek_v2.cpp).
Result<std::unique_ptr<MtpModule>> load_deepseek_mtp(const LoadedCheckpoint& ckpt, Backend& backend,
                                                     Model& target, const LoadOptions& options);

namespace {

std::map<std::string, ModelFactory>& factories() {
  static std::map<std::string, ModelFactory> r;
  return r;
}

std::map<std::string, ModelFactory>& registry() {
  static const bool builtins = [] {
    register_llama_family();
    register_deepseek_v2();
    register_mixtral();
    return true;
  }();
  (void)builtins;
  return factories();
}

}  // namespace

bool register_architecture(const std::string& name, ModelFactory factory) {
  factories()[name] = std::move(factory);
  return true;
}

std::vector<std::string> registered_architectures() {
  std::vector<std::string> names;
  for (const auto& [name, f] : registry()) names.push_back(name);
  return names;
}

Result<std::unique_ptr<Model>> load_model(const LoadedCheckpoint& ckpt, Backend& backend,
                                          const LoadOptions& options) {
  auto it = registry().find(ckpt.config.architecture);
  if (it == registry().end()) {
    std::string list;
    for (const auto& n : registered_architectures()) list += (list.empty() ? "" : ", ") + n;
    return unimplemented(ckpt.config.source + ": architecture '" + ckpt.config.architecture +
                         "' is not supported (supported: " + list + ")");
  }
  PAGELLM_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, it->second(ckpt, backend, options));
  PAGELLM_ASSIGN_OR_RETURN(auto scales,
                           read_kv_cache_scales(*ckpt.weights, ckpt.config.num_hidden_layers));
  m->set_kv_cache_scales(std::move(scales));
  return m;
}

Result<std::unique_ptr<MtpModule>> load_mtp_module(const LoadedCheckpoint& ckpt, Backend& backend,
                                                   Model& target, const LoadOptions& options) {
  const ModelConfig& c = ckpt.config;
  if (c.architecture != "DeepseekV3ForCausalLM" && c.architecture != "DeepseekV2ForCausalLM")
    return unimplemented(c.source + ": architecture '" + c.architecture +
                         "' has no multi-token-prediction layers (DeepSeek-V3's MTP)");
  if (c.num_nextn_predict_layers <= 0)
    return invalid_argument(c.source +
                            ": the checkpoint has no multi-token-prediction layer "
                            "(num_nextn_predict_layers is 0 in its config.json)");
  return load_deepseek_mtp(ckpt, backend, target, options);
}

}  // namespace pagellm
