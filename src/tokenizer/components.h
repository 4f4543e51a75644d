// The stages of a Hugging Face `tokenizers` pipeline (normalizer, pre-tokenizer, decoder,
// post-processor), built from their tokenizer.json descriptions. Each stage reproduces the Rust
// library's behaviour on ids and text; offsets are not tracked (pagellm never returns them).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::tok {

// A piece of text between pre-tokenization steps. `at_origin` says the piece starts at offset 0 of
// the original input, which Metaspace's prepend_scheme "first" looks at.
struct Piece {
  std::string text;
  bool at_origin = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Status normalize(std::string* text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual Status pre_tokenize(std::vector<Piece>* pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF's decode_chain: tokens in, tokens out; decode() joins the result.
  virtual Status decode_chain(std::vector<std::string>* tokens) const = 0;
  // Whether this decoder (or one inside a Sequence) is a ByteFallback decoder.
  virtual bool has_byte_fallback() const { return false; }
  // How the tokens it decodes spell bytes: ByteLevel's map, else SentencePiece's U+2581 and
  // <0xNN> (ByteFallback, Metaspace, or a Replace of U+2581), else raw.
  virtual TokenSpelling spelling() const { return TokenSpelling::kRaw; }
};

// What the post-processor adds around a single sequence.
struct PostTemplate {
  std::vector<int32_t> prefix;  // ids before the sequence
  std::vector<int32_t> suffix;  // ids after it
};

// A null JSON value gives a null pointer (no stage). Unknown types fail naming the component.
Result<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& j);
Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const nlohmann::json& j);
Result<std::unique_ptr<Decoder>> make_decoder(const nlohmann::json& j);
// `token_id` resolves a token string (for RobertaProcessing/BertProcessing, which name tokens).
Result<PostTemplate> make_post_template(const nlohmann::json& j);

// The byte of a byte-fallback token "<0xNN>" as tokenizers' ByteFallback decoder reads it.
std::optional<unsigned char> byte_fallback_value(const std::string& token);

// The byte-level alphabet of GPT-2: byte -> the UTF-8 of the character that stands for it.
const std::string& byte_level_char(unsigned char b);
// The inverse: code point -> byte, or -1 when the character is not in the alphabet.
int byte_level_byte(char32_t c);

}  // namespace pagellm::tok
