// Glue between io/gguf.h and the GGUF tokenizer description: reads the tokenizer.* keys.
#include "io/gguf.h"
#include "tokenizer/gguf_tokenizer.h"

namespace pagellm {

namespace {

template <typename T>
Status read_optional(const GgufFile& f, const std::string& key, Result<T> (GgufFile::*get)(const std::string&) const,
                     std::optional<T>* out) {
  if (!f.has(key)) return Status();
  auto r = (f.*get)(key);
  if (!r.ok()) return r.status();
  *out = std::move(r).value();
  return Status();
}

}  // namespace

Result<GgufTokenizerData> read_gguf_tokenizer_data(const GgufFile& f) {
  GgufTokenizerData d;
  if (f.has("general.architecture")) {
    PAGELLM_ASSIGN_OR_RETURN(d.architecture, f.get_string("general.architecture"));
  }
  PAGELLM_ASSIGN_OR_RETURN(d.model, f.get_string("tokenizer.ggml.model"));
  if (f.has("tokenizer.ggml.pre")) {
    PAGELLM_ASSIGN_OR_RETURN(d.pre, f.get_string("tokenizer.ggml.pre"));
  }
  PAGELLM_ASSIGN_OR_RETURN(d.tokens, f.get_string_array("tokenizer.ggml.tokens"));
  if (f.has("tokenizer.ggml.merges")) {
    PAGELLM_ASSIGN_OR_RETURN(d.merges, f.get_string_array("tokenizer.ggml.merges"));
  }
  if (f.has("tokenizer.ggml.token_type")) {
    PAGELLM_ASSIGN_OR_RETURN(d.token_types, f.get_i32_array("tokenizer.ggml.token_type"));
  }
  if (f.has("tokenizer.ggml.scores")) {
    PAGELLM_ASSIGN_OR_RETURN(d.scores, f.get_f32_array("tokenizer.ggml.scores"));
  }
  std::optional<uint32_t> id;
  const std::pair<const char*, std::optional<int32_t>*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &d.bos_id},
      {"tokenizer.ggml.eos_token_id", &d.eos_id},
      {"tokenizer.ggml.unknown_token_id", &d.unk_id},
      {"tokenizer.ggml.padding_token_id", &d.pad_id},
  };
  for (const auto& [key, dst] : ids) {
    id.reset();
    PAGELLM_RETURN_IF_ERROR(read_optional<uint32_t>(f, key, &GgufFile::get_u32, &id));
    if (id) {
      if (*id >= d.tokens.size()) {
        return out_of_range(f.path() + ": " + key + " = " + std::to_string(*id) + " is not below the vocabulary size " +
                            std::to_string(d.tokens.size()));
      }
      *dst = static_cast<int32_t>(*id);
    }
  }
  PAGELLM_RETURN_IF_ERROR(read_optional<bool>(f, "tokenizer.ggml.add_bos_token", &GgufFile::get_bool, &d.add_bos));
  PAGELLM_RETURN_IF_ERROR(read_optional<bool>(f, "tokenizer.ggml.add_eos_token", &GgufFile::get_bool, &d.add_eos));
  PAGELLM_RETURN_IF_ERROR(
      read_optional<bool>(f, "tokenizer.ggml.add_space_prefix", &GgufFile::get_bool, &d.add_space_prefix));
  if (f.has("tokenizer.chat_template")) {
    PAGELLM_ASSIGN_OR_RETURN(d.chat_template, f.get_string("tokenizer.chat_template"));
  }
  return d;
}

Result<std::unique_ptr<Tokenizer>> tokenizer_from_gguf_file(const std::string& path, GgufPreTokenizer pre) {
  PAGELLM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(path));
  PAGELLM_ASSIGN_OR_RETURN(GgufTokenizerData d, read_gguf_tokenizer_data(f));
  return tokenizer_from_gguf_data(d, path, pre);
}

}  // namespace pagellm
