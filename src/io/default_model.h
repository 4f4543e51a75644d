// Where the default model lives: scripts/fetch-default-model.sh puts SmolLM2-135M-Instruct (Q4_1
// GGUF, tokenizer and chat template in its metadata) into the cache folder, and the CLI uses it when
// no --model is given.
#pragma once

#include <string>

namespace pagellm {

// "${PAGELLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pagellm}" (empty variables count as unset).
std::string cache_dir();
// cache_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf". The file may not exist.
std::string default_model_path();

}  // namespace pagellm
