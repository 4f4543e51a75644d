// A tokenizer described by GGUF metadata (llama.cpp's tokenizer.ggml.* keys), turned into the
// tokenizer.json pipeline that transformers' GGUF converter builds from the same keys.
//
// The one choice that differs between references is the pre-tokenizer of byte-level vocabularies:
// transformers picks it by architecture (GPT-2's regex for llama-architecture files, Qwen2's for
// qwen2/qwen3), ignoring tokenizer.ggml.pre, while llama.cpp picks it by tokenizer.ggml.pre as the
// original tokenizer.json had it (e.g. "smollm" isolates every digit). They agree on almost all
// text (for SmolLM2 they differ only on non-ASCII numerals such as "½" after a space).
// GgufPreTokenizer::kTransformers (the default) is tested id-for-id against transformers;
// kOriginal follows tokenizer.ggml.pre.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

class GgufFile;

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class GgufTokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class GgufPreTokenizer { kTransformers, kOriginal };

// What a GGUF file says about its tokenizer; plain data, filled by read_gguf_tokenizer_data().
struct GgufTokenizerData {
  std::string architecture;  // general.architecture ("llama", "qwen2", ...)
  std::string model;  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
  std::string pre;    // tokenizer.ggml.pre: "smollm", "llama-bpe", "qwen2", "deepseek-llm", ... ("" if absent)
  std::vector<std::string> tokens;
  std::vector<std::string> merges;  // "a b" each; may be empty for "llama"
  std::vector<int32_t> token_types;  // GgufTokenType values; may be empty
  std::vector<float> scores;         // may be empty
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string chat_template;  // tokenizer.chat_template ("" if absent)
};

// The tokenizer.json document equivalent to `data`. Fails for a model or pre value it does not know.
Result<nlohmann::json> gguf_tokenizer_json(const GgufTokenizerData& data,
                                           GgufPreTokenizer pre = GgufPreTokenizer::kTransformers);
// The tokenizer itself; `name` stands for the file in messages.
Result<std::unique_ptr<Tokenizer>> tokenizer_from_gguf_data(const GgufTokenizerData& data, const std::string& name,
                                                           GgufPreTokenizer pre = GgufPreTokenizer::kTransformers);

// Reads the tokenizer.* keys of an opened GGUF file (gguf_reader.cpp: the only file here that
// depends on io/).
Result<GgufTokenizerData> read_gguf_tokenizer_data(const GgufFile& file);
// Opens `path` and builds its tokenizer.
Result<std::unique_ptr<Tokenizer>> tokenizer_from_gguf_file(const std::string& path,
                                                           GgufPreTokenizer pre = GgufPreTokenizer::kTransformers);

}  // namespace pagellm
