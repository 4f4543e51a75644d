// Structured outputs: grammars compiled from each kind of spec walk exactly the token sequences
// of their language (for a byte-level and a SentencePiece vocabulary), bad specs are clear
// errors, compiled grammars are cached, and the engine's constrained sequences follow their
// grammar at temperature 1 and end when it does.
#include "runtime/grammar.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "backend/backend.h"
#include "byte_tokenizer.h"
#include "engine_test_util.h"
#include "io/weights.h"
#include "runtime/engine.h"
#include "source_dir.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {
namespace {

constexpr int32_t kEos = 2;  // the golden Llama's

// Walks `text`'s tokens through a matcher of `g`: each must be allowed by the mask before it is
// accepted; then the stop token must be allowed and end the grammar. Returns false at the first
// token the grammar refuses.
bool walks(const Tokenizer& tok, std::shared_ptr<const CompiledGrammar> g, const std::string& text,
           int32_t eos) {
  auto ids = tok.encode(text, false);
  EXPECT_TRUE(ids.ok());
  GrammarMatcher m(std::move(g));
  std::vector<uint32_t> mask(m.mask_words());
  auto allowed = [&](int32_t t) { return (mask[t / 32] >> (t % 32) & 1u) != 0; };
  for (int32_t t : *ids) {
    m.fill_mask(mask);
    if (!allowed(t)) return false;
    EXPECT_TRUE(m.accept(t));
  }
  m.fill_mask(mask);
  if (!allowed(eos)) return false;
  EXPECT_TRUE(m.accept(eos));
  EXPECT_TRUE(m.terminated());
  return true;
}

class GrammarTest : public testing::Test {
 protected:
  void SetUp() override {
    tok_ = byte_tokenizer();
    auto c = GrammarCompiler::create(*tok_, 256, {kEos});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    compiler_ = std::move(*c);
  }
  std::shared_ptr<const CompiledGrammar> compile(GrammarSpec spec) {
    auto g = compiler_->compile(spec);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? *g : nullptr;
  }
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<GrammarCompiler> compiler_;
};

TEST_F(GrammarTest, JsonSchemaAcceptsItsLanguageOnly) {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
      "required": ["name", "n"], "additionalProperties": false})";
  auto g = compile({GrammarKind::kJsonSchema, schema});
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(walks(*tok_, g, R"({"name": "x", "n": 3})", kEos));
  EXPECT_TRUE(
      walks(*tok_, g, "{\n  \"name\": \"\",\n  \"n\": 0,\n  \"tags\": [\"b\", \"a\"]\n}", kEos));
  EXPECT_FALSE(walks(*tok_, g, R"({"n": 3, "name": "x", "extra": 1})", kEos));
  EXPECT_FALSE(walks(*tok_, g, R"({"name": "x"})", kEos));           // n is required
  EXPECT_FALSE(walks(*tok_, g, R"({"name": "x", "n": -1})", kEos));  // minimum
  EXPECT_FALSE(walks(*tok_, g, R"({"name": "x", "n": 1, "tags": ["c"]})", kEos));
  EXPECT_FALSE(walks(*tok_, g, R"({"name": "123456789", "n": 1})", kEos));  // maxLength
}

TEST_F(GrammarTest, EveryKind) {
  auto obj = compile({GrammarKind::kJsonObject, ""});
  EXPECT_TRUE(walks(*tok_, obj, R"({"any": [1, {"x": null}]})", kEos));
  EXPECT_FALSE(walks(*tok_, obj, "[1]", kEos));
  auto re = compile({GrammarKind::kRegex, R"(\d{3}-[a-z]+)"});
  EXPECT_TRUE(walks(*tok_, re, "123-abc", kEos));
  EXPECT_FALSE(walks(*tok_, re, "12-abc", kEos));
  GrammarSpec choice{GrammarKind::kChoice};
  choice.choices = {"yes", "no", "say \"maybe\"\n"};
  auto ch = compile(choice);
  for (const std::string& c : choice.choices) EXPECT_TRUE(walks(*tok_, ch, c, kEos)) << c;
  EXPECT_FALSE(walks(*tok_, ch, "yess", kEos));
  auto ebnf = compile({GrammarKind::kEbnf, R"G(root ::= "(" num ("," num)* ")"
num ::= [0-9]+)G"});
  EXPECT_TRUE(walks(*tok_, ebnf, "(1,22,333)", kEos));
  EXPECT_FALSE(walks(*tok_, ebnf, "(1,)", kEos));
}

TEST_F(GrammarTest, BadSpecsAreInvalidArgument) {
  GrammarSpec empty_choice{GrammarKind::kChoice};
  for (const GrammarSpec& s :
       {GrammarSpec{GrammarKind::kJsonSchema, "{not json"},
        GrammarSpec{GrammarKind::kJsonSchema, R"({"type": "no-such-type"})"},
        GrammarSpec{GrammarKind::kRegex, "(unclosed"}, GrammarSpec{GrammarKind::kEbnf, "root ::= "},
        GrammarSpec{GrammarKind::kEbnf, "start ::= \"a\""}, empty_choice}) {
    auto g = compiler_->compile(s);
    EXPECT_FALSE(g.ok()) << s.text;
    if (!g.ok()) {
      EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << s.text;
      EXPECT_FALSE(g.status().message().empty());
    }
  }
}

TEST_F(GrammarTest, CompiledOncePerSpec) {
  const GrammarSpec s{GrammarKind::kRegex, "[ab]+"};
  auto a = compile(s), b = compile(s);
  EXPECT_EQ(a.get(), b.get());
  const GrammarCompileStats st = compiler_->stats();
  EXPECT_EQ(st.compiled, 1);
  EXPECT_EQ(st.cache_hits, 1);
  EXPECT_GT(st.compile_seconds, 0);
  GrammarSpec compact = s;
  compact.kind = GrammarKind::kJsonObject;
  EXPECT_NE(compile(compact).get(), a.get());
}

TEST(GrammarSpelling, SentencePieceVocabulary) {
  // U+2581 spaces and <0xNN> byte pieces: "a b" must walk through the space piece.
  auto tok = load_tokenizer(test_source_dir() + "/tests/data/tokenizer/spm_bpe");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->token_spelling(), TokenSpelling::kByteFallback);
  const int32_t eos = (*tok)->eos_id().value_or(2);
  auto c = GrammarCompiler::create(**tok, (*tok)->vocab_size(), {eos});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto g = (*c)->compile({GrammarKind::kRegex, " ?hello world [0-9]+"});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  // Encoding adds SentencePiece's leading space (a piece of its own here), which the regex allows.
  auto ids = (*tok)->encode("hello world 42", false);
  ASSERT_TRUE(ids.ok());
  GrammarMatcher m(*g);
  std::vector<uint32_t> mask(m.mask_words());
  bool all = true;
  auto text = (*tok)->decode(*ids, false);
  ASSERT_TRUE(text.ok());
  std::string trace;
  for (int32_t t : *ids) {
    m.fill_mask(mask);
    all = all && (mask[t / 32] >> (t % 32) & 1u);
    trace += (*tok)->id_to_token(t).value_or("?") + "|";
    if (all) {
      EXPECT_TRUE(m.accept(t));
    }
  }
  EXPECT_TRUE(all) << *text << " as " << trace;
  EXPECT_EQ(byte_tokenizer()->token_spelling(), TokenSpelling::kByteLevel);
}

TEST(GrammarEngine, ConstrainedSequencesFollowTheirGrammarAndEndWithIt) {
  auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/llama");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto backend = make_cpu_backend();
  auto model = load_model(*ckpt, *backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto tok = byte_tokenizer();
  EngineConfig cfg;
  cfg.kv_cache_memory = 8 << 20;
  cfg.scheduler.paranoid = true;
  auto engine = Engine::create(**model, *backend, tok.get(), cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  ASSERT_NE((*engine)->grammars(), nullptr);
  const std::string schema = R"({"type": "object", "properties": {
      "ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
      "required": ["ok", "color"], "additionalProperties": false})";
  // Compact JSON (no whitespace), so that the output fits the golden Llama's 64-token context.
  GrammarSpec spec{GrammarKind::kJsonSchema, schema};
  spec.any_whitespace = false;
  auto g = (*engine)->grammars()->compile(spec);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  // Sampled at temperature 1, n = 2, beside unconstrained requests in the same steps.
  constexpr int kRequests = 12;
  std::vector<Collected> out(kRequests);
  Waiter w;
  std::mt19937 rng(5);
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r;
    r.prompt = random_prompt(rng, 3 + i % 4);
    r.params.temperature = 1.0f;
    r.params.seed = 100 + i;
    r.params.max_tokens = 64 - 8;
    r.params.n = i % 3 == 0 ? 2 : 1;
    r.detokenize = false;
    if (i % 4 != 3) r.grammar = *g;
    ASSERT_TRUE((*engine)->submit(std::move(r), w.callback(&out[i])).ok());
  }
  w.wait(kRequests);
  int n_constrained = 0;
  for (int i = 0; i < kRequests; ++i) {
    if (i % 4 == 3) continue;
    for (const auto& [seq, ids] : out[i].tokens) {
      std::vector<int32_t> text_ids = ids;
      ASSERT_FALSE(text_ids.empty());
      if (text_ids.back() == kEos) text_ids.pop_back();
      auto text = tok->decode(text_ids, false);
      ASSERT_TRUE(text.ok());
      const auto j = nlohmann::json::parse(*text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << "request " << i << ": " << *text;
      EXPECT_TRUE(j.at("ok").is_boolean()) << *text;
      EXPECT_TRUE(j.at("color") == "red" || j.at("color") == "green" || j.at("color") == "blue");
      EXPECT_EQ(j.size(), 2u);
      EXPECT_EQ(out[i].finish[seq], FinishReason::kStop) << *text;
      ++n_constrained;
    }
  }
  EXPECT_EQ(n_constrained, 12);
  EXPECT_EQ((*engine)->stats().scheduler.kv_usage, 0.0);
}

}  // namespace
}  // namespace pagellm
