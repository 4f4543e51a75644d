// Structured outputs: what a request constrains its text to (a JSON schema, any JSON object, a
// regular expression, a choice of strings, an EBNF grammar), compiled once per distinct spec into
// a token-level automaton by xgrammar's C++ core (cmake/xgrammar.cmake), and a per-sequence
// matcher that gives the bitmask of tokens allowed next and advances with each accepted token.
//
//   GrammarCompiler compiler = ...;                        // one per engine (tokenizer, vocab)
//   auto g = compiler.compile({GrammarKind::kJsonSchema, schema_text});   // cached by spec
//   GrammarMatcher m(*g);                                  // one per sequence
//   m.fill_mask(words);  ... sample with the mask ...  m.accept(token);  m.terminated();
//
// The grammar ends on one of the model's EOS tokens: once the text is complete the mask allows
// only those (or, for grammars that can go on, those and the continuations).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

enum class GrammarKind {
  kJsonObject,  // any JSON object (OpenAI response_format json_object)
  kJsonSchema,  // text: a JSON schema (response_format json_schema, guided_json)
  kRegex,       // text: a regular expression the whole output matches (guided_regex)
  kChoice,      // choices: the output is exactly one of them (guided_choice)
  kEbnf,        // text: an EBNF grammar (xgrammar's / GBNF dialect) with a rule `root`
};

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text = "";
  std::vector<std::string> choices = {};
  // JSON: whitespace between tokens as the model likes (true, vLLM's default; at most 20
  // characters in a row) or none at all.
  bool any_whitespace = true;

  // Identifies the compiled grammar (the cache key).
  std::string key() const;
};

// A compiled grammar, shared by every sequence that uses it (immutable, thread-safe to share).
class CompiledGrammar;

struct GrammarCompileStats {
  int64_t compiled = 0;        // compile() calls that built a grammar
  int64_t cache_hits = 0;      // compile() calls answered from the cache
  double compile_seconds = 0;  // summed over the calls that built one
};

class GrammarCompiler {
 public:
  // `vocab_size`: the logits' width (the model's, which may exceed the tokenizer's);
  // `stop_token_ids`: the model's EOS ids, which end a complete output.
  static Result<std::unique_ptr<GrammarCompiler>> create(const Tokenizer& tokenizer,
                                                         int32_t vocab_size,
                                                         std::vector<int32_t> stop_token_ids);
  ~GrammarCompiler();

  // The compiled grammar of `spec`, built on the first call and cached (least recently used first
  // out past kMaxCached). A spec that does not compile (an invalid schema, an unsupported keyword,
  // a regex or grammar that does not parse) is kInvalidArgument with the reason. Thread-safe;
  // concurrent calls for the same new spec build it once.
  Result<std::shared_ptr<const CompiledGrammar>> compile(const GrammarSpec& spec);
  // The grammar of `spec` if it is built and cached (a cache hit, as compile() counts it), else
  // null: a caller that must not wait (an HTTP I/O thread) then compiles it on a thread of its own.
  std::shared_ptr<const CompiledGrammar> find(const GrammarSpec& spec);

  GrammarCompileStats stats() const;
  int32_t vocab_size() const { return vocab_size_; }

  static constexpr size_t kMaxCached = 256;

 private:
  struct Impl;
  GrammarCompiler(std::unique_ptr<Impl> impl, int32_t vocab_size);
  std::unique_ptr<Impl> impl_;
  int32_t vocab_size_;
};

// One sequence's position in a grammar. Not thread-safe (one sequence, one thread at a time).
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;

  // Words of the bitmask over the vocabulary (bit t % 32 of word t / 32 is token t).
  int32_t mask_words() const;
  // Writes the tokens allowed next into `words` (mask_words() of them).
  void fill_mask(std::span<uint32_t> words);
  // Advances by `token`; false (and no change) if the grammar does not allow it.
  bool accept(int32_t token);
  // Whether the output is complete and ended (a stop token was accepted): nothing may follow.
  bool terminated() const;
  // Takes back the last `n` accepted tokens.
  void rollback(int32_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagellm
