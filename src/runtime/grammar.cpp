#include "runtime/grammar.h"

#include <xgrammar/xgrammar.h>

#include <chrono>
#include <future>
#include <list>
#include <map>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace pagellm {

class CompiledGrammar {
 public:
  explicit CompiledGrammar(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

namespace {

xgrammar::VocabType vocab_type(TokenSpelling s) {
  switch (s) {
    case TokenSpelling::kByteLevel:
      return xgrammar::VocabType::BYTE_LEVEL;
    case TokenSpelling::kByteFallback:
      return xgrammar::VocabType::BYTE_FALLBACK;
    case TokenSpelling::kRaw:
      break;
  }
  return xgrammar::VocabType::RAW;
}

// The next-token bitmask of `m` into `n_words` int32 words at `words` (xgrammar takes a DLTensor).
void fill_bitmask(xgrammar::GrammarMatcher& m, void* words, int64_t n_words) {
  int64_t shape[1] = {n_words};
  DLTensor t{};
  t.data = words;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  m.FillNextTokenBitmask(&t);
}

// xgrammar's error text without its "[hh:mm:ss] /path/file.cc:123: " prefix (a build path means
// nothing to a client) and trailing newline.
std::string reason(std::string what) {
  if (!what.empty() && what[0] == '[') {
    const size_t src = what.find("] ");
    const size_t colon = src == std::string::npos ? src : what.find(": ", src + 2);
    if (colon != std::string::npos) what.erase(0, colon + 2);
  }
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return what;
}

// root ::= "a" | "b" ...: the choices as EBNF string literals (JSON's escapes are xgrammar's).
std::string choice_grammar(const std::vector<std::string>& choices) {
  std::string g = "root ::=";
  for (size_t i = 0; i < choices.size(); ++i)
    g += (i ? " | " : " ") +
         nlohmann::json(choices[i]).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return g;
}

}  // namespace

std::string GrammarSpec::key() const {
  nlohmann::json j = {{"kind", static_cast<int>(kind)},
                      {"text", text},
                      {"choices", choices},
                      {"any_whitespace", any_whitespace}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// JSON: at most this many whitespace characters in a row. Pretty-printed JSON needs a newline and
// its indentation (20 covers 9 levels of two-space indents); without a bound a model can fill
// max_tokens with whitespace, a known failure of JSON modes.
constexpr int kMaxWhitespace = 20;

struct GrammarCompiler::Impl {
  explicit Impl(xgrammar::TokenizerInfo info)
      : compiler(info, /*max_threads=*/2, /*cache_enabled=*/false) {}

  xgrammar::GrammarCompiler compiler;
  std::mutex mu;
  using Entry = std::shared_future<Result<std::shared_ptr<const CompiledGrammar>>>;
  std::map<std::string, Entry> cache;
  std::list<std::string> lru;  // most recently used first
  GrammarCompileStats stats;

  // A grammar whose language is empty (a regex like [^\s\S]) would leave a request nothing to
  // sample: refused here instead.
  static Result<std::shared_ptr<const CompiledGrammar>> nonempty(
      Result<std::shared_ptr<const CompiledGrammar>> g) {
    if (!g.ok()) return g;
    xgrammar::GrammarMatcher m((*g)->grammar);
    const int32_t vocab = (*g)->grammar.GetTokenizerInfo().GetVocabSize();
    std::vector<int32_t> words(xgrammar::GetBitmaskSize(vocab));
    fill_bitmask(m, words.data(), static_cast<int64_t>(words.size()));
    for (int32_t w : words)
      if (w != 0) return g;
    return invalid_argument("the grammar matches no text (no token can start it)");
  }

  Result<std::shared_ptr<const CompiledGrammar>> build(const GrammarSpec& spec) {
    return nonempty(build_any(spec));
  }

  Result<std::shared_ptr<const CompiledGrammar>> build_any(const GrammarSpec& spec) {
    try {
      switch (spec.kind) {
        case GrammarKind::kJsonObject:
          // Any JSON object: the schema {"type": "object"} (the builtin grammar allows any value).
          return std::make_shared<const CompiledGrammar>(compiler.CompileJSONSchema(
              R"({"type": "object"})", spec.any_whitespace, std::nullopt, std::nullopt,
              /*strict_mode=*/true, kMaxWhitespace));
        case GrammarKind::kJsonSchema:
          return std::make_shared<const CompiledGrammar>(
              compiler.CompileJSONSchema(spec.text, spec.any_whitespace, std::nullopt, std::nullopt,
                                         /*strict_mode=*/true, kMaxWhitespace));
        case GrammarKind::kRegex:
          return std::make_shared<const CompiledGrammar>(compiler.CompileRegex(spec.text));
        case GrammarKind::kChoice:
          if (spec.choices.empty()) return invalid_argument("guided_choice: no choices given");
          return std::make_shared<const CompiledGrammar>(
              compiler.CompileGrammar(choice_grammar(spec.choices), "root"));
        case GrammarKind::kEbnf:
          return std::make_shared<const CompiledGrammar>(
              compiler.CompileGrammar(spec.text, "root"));
      }
    } catch (const std::exception& e) {
      return invalid_argument(reason(e.what()));
    }
    return invalid_argument("unknown grammar kind");
  }
};

GrammarCompiler::GrammarCompiler(std::unique_ptr<Impl> impl, int32_t vocab_size)
    : impl_(std::move(impl)), vocab_size_(vocab_size) {}

GrammarCompiler::~GrammarCompiler() = default;

Result<std::unique_ptr<GrammarCompiler>> GrammarCompiler::create(
    const Tokenizer& tokenizer, int32_t vocab_size, std::vector<int32_t> stop_token_ids) {
  if (vocab_size < tokenizer.vocab_size())
    return invalid_argument("grammar: the model's vocabulary (" + std::to_string(vocab_size) +
                            ") is smaller than the tokenizer's (" +
                            std::to_string(tokenizer.vocab_size()) + ")");
  std::vector<std::string> vocab(static_cast<size_t>(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    // Special tokens are never text: an empty entry is one xgrammar never allows (stop tokens
    // are allowed where the output may end, by their ids).
    if (tokenizer.is_special(id)) continue;
    vocab[id] = tokenizer.id_to_token(id).value_or("");
  }
  try {
    xgrammar::TokenizerInfo info(vocab, vocab_type(tokenizer.token_spelling()), vocab_size,
                                 std::move(stop_token_ids), /*add_prefix_space=*/false);
    return std::unique_ptr<GrammarCompiler>(
        new GrammarCompiler(std::make_unique<Impl>(std::move(info)), vocab_size));
  } catch (const std::exception& e) {
    return internal_error(std::string("grammar: the tokenizer's vocabulary: ") + e.what());
  }
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::compile(const GrammarSpec& spec) {
  const std::string key = spec.key();
  std::promise<Result<std::shared_ptr<const CompiledGrammar>>> promise;
  Impl::Entry entry;
  bool build_here = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) {
      impl_->lru.remove(key);
      impl_->lru.push_front(key);
      ++impl_->stats.cache_hits;
      entry = it->second;
    } else {
      entry = promise.get_future().share();
      impl_->cache.emplace(key, entry);
      impl_->lru.push_front(key);
      while (impl_->lru.size() > kMaxCached) {
        impl_->cache.erase(impl_->lru.back());
        impl_->lru.pop_back();
      }
      build_here = true;
    }
  }
  if (!build_here) return entry.get();  // built, or being built by another call
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::shared_ptr<const CompiledGrammar>> r = impl_->build(spec);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ++impl_->stats.compiled;
    impl_->stats.compile_seconds += dt;
    if (!r.ok() && impl_->cache.erase(key) > 0) impl_->lru.remove(key);  // errors are not kept
  }
  promise.set_value(r);
  return r;
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::find(const GrammarSpec& spec) {
  const std::string key = spec.key();
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->cache.find(key);
  // Being built (its future not ready) counts as not there: the caller would wait.
  if (it == impl_->cache.end() ||
      it->second.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return nullptr;
  const Result<std::shared_ptr<const CompiledGrammar>>& r = it->second.get();
  if (!r.ok()) return nullptr;
  impl_->lru.remove(key);
  impl_->lru.push_front(key);
  ++impl_->stats.cache_hits;
  return *r;
}

GrammarCompileStats GrammarCompiler::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

struct GrammarMatcher::Impl {
  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : grammar(std::move(g)), matcher(grammar->grammar) {}
  std::shared_ptr<const CompiledGrammar> grammar;  // the matcher refers to it
  xgrammar::GrammarMatcher matcher;
  int32_t vocab_size = 0;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {
  impl_->vocab_size = impl_->grammar->grammar.GetTokenizerInfo().GetVocabSize();
}

GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;

int32_t GrammarMatcher::mask_words() const {
  return xgrammar::GetBitmaskSize(impl_->vocab_size);
}

void GrammarMatcher::fill_mask(std::span<uint32_t> words) {
  PAGELLM_CHECK(static_cast<int64_t>(words.size()) >= mask_words());
  fill_bitmask(impl_->matcher, words.data(), mask_words());
}

bool GrammarMatcher::accept(int32_t token) {
  return impl_->matcher.AcceptToken(token);
}

bool GrammarMatcher::terminated() const {
  return impl_->matcher.IsTerminated();
}

void GrammarMatcher::rollback(int32_t n) {
  impl_->matcher.Rollback(n);
}

}  // namespace pagellm
