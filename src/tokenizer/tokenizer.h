// Tokenizers: text <-> token ids, exactly as Hugging Face `tokenizers` (tokenizer.json) or
// SentencePiece (tokenizer.model) produce them for the same files.
//
//   auto tok = load_tokenizer("models/SmolLM2");          // a folder, tokenizer.json, .gguf or .model
//   std::vector<int32_t> ids = tok.value()->encode("Hello", /*add_special_tokens=*/true).value();
//   std::string text = tok.value()->decode(ids, /*skip_special_tokens=*/false);
//
// Input text that is not valid UTF-8 (which a Python string cannot hold, so HF never sees it) is
// first repaired: every maximal ill-formed byte subsequence becomes U+FFFD, as Python's
// bytes.decode("utf-8", "replace") would do, and the result is encoded. Every method is safe to
// call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace pagellm {

// How a vocabulary's token strings (id_to_token) spell the bytes they stand for: what a grammar
// engine needs to match tokens against text (runtime/grammar.h).
enum class TokenSpelling {
  kRaw,           // the string is the bytes
  kByteLevel,     // GPT-2's byte-to-character map ('Ġ' is a space): the ByteLevel decoder
  kByteFallback,  // SentencePiece style: U+2581 is a space and <0xNN> tokens are single bytes
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`; with `add_special_tokens`, the post-processor's tokens (BOS...) are added.
  virtual Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens) const = 0;
  // Text of `ids`. Ids outside the vocabulary are skipped, as tokenizers does.
  virtual Result<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // Number of ids (largest id + 1, added tokens included).
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(int32_t id) const = 0;
  // Whether `id` is a special (control) token, skipped by decode(skip_special_tokens=true).
  virtual bool is_special(int32_t id) const = 0;
  // Whether `id` is a byte-fallback token (<0xNN>) that the decoder fuses with its neighbours, so
  // a streaming decoder must wait for the byte run to end.
  virtual bool is_byte_fallback_token(int32_t id) const = 0;
  virtual TokenSpelling token_spelling() const = 0;

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> pad_id() const { return pad_id_; }
  void set_special_ids(std::optional<int32_t> bos, std::optional<int32_t> eos, std::optional<int32_t> pad) {
    bos_id_ = bos;
    eos_id_ = eos;
    pad_id_ = pad;
  }

 private:
  std::optional<int32_t> bos_id_, eos_id_, pad_id_;
};

// A tokenizer.json document. `name` stands for the file in error messages.
Result<std::unique_ptr<Tokenizer>> tokenizer_from_json(std::string_view json_text, const std::string& name);
// A tokenizer.json file.
Result<std::unique_ptr<Tokenizer>> tokenizer_from_json_file(const std::string& path);
// A SentencePiece model file (tokenizer.model), through libsentencepiece.
Result<std::unique_ptr<Tokenizer>> tokenizer_from_sentencepiece_file(const std::string& path);

// Loads what `path` names: a tokenizer.json file, a tokenizer.model file, a .gguf file, or a folder
// holding tokenizer.json (preferred) or tokenizer.model. In a folder, tokenizer_config.json's
// add_bos_token / add_eos_token, when present, override the post-processor as transformers does,
// and bos/eos/pad ids are read from it.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path);

}  // namespace pagellm
