// Internal: building the tokenizer.json pipeline from a parsed document (used by the loaders and
// by the GGUF tokenizer, which describes its pipeline as a tokenizer.json document).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace pagellm {

// transformers replaces the post-processor with "[bos] $A [eos]" when add_bos_token/add_eos_token
// are given explicitly (tokenizer_config.json, or GGUF metadata).
struct PostOverride {
  bool add_bos = false;
  bool add_eos = false;
  std::optional<int32_t> bos, eos;
};

Result<std::unique_ptr<Tokenizer>> tokenizer_from_json_value(const nlohmann::json& j, const std::string& name,
                                                              const std::optional<PostOverride>& post_override);

}  // namespace pagellm
