// Conformance with Hugging Face tokenizers: for every fixture family (tests/data/tokenizer/<family>,
// made by tests/tokenizer/make_expected.py), the ids and decoded text of every corpus line, and the
// decoded text of pseudo-random id sequences, must equal what HF produced.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/default_model.h"
#include "source_dir.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {
namespace {

using nlohmann::json;

const std::string kDataDir = test_source_dir() + "/tests/data/tokenizer";

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string show(const std::vector<int32_t>& v) { return json(v).dump(); }

void check_family(const Tokenizer& tok, const std::string& family) {
  const auto corpus = read_jsonl(kDataDir + "/corpus.jsonl");
  const auto expected = read_jsonl(kDataDir + "/" + family + "/expected.jsonl");
  ASSERT_GT(corpus.size(), 50u) << "corpus missing";
  size_t n_encoded = 0, n_decoded = 0, n_fail = 0;
  for (const auto& rec : expected) {
    if (n_fail > 10) break;
    if (rec.contains("line")) {
      const std::string text = corpus.at(rec["line"].get<size_t>()).get<std::string>();
      const auto want = rec["ids"].get<std::vector<int32_t>>();
      const auto want_plain = rec["ids_no_special"].get<std::vector<int32_t>>();
      auto got = tok.encode(text, true);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      auto got_plain = tok.encode(text, false);
      ASSERT_TRUE(got_plain.ok()) << got_plain.status().to_string();
      if (*got != want || *got_plain != want_plain) ++n_fail;
      EXPECT_EQ(show(*got), show(want)) << family << " line " << rec["line"] << ": " << json(text).dump();
      EXPECT_EQ(show(*got_plain), show(want_plain)) << family << " line " << rec["line"] << " (no special)";
      auto text_out = tok.decode(want, false);
      ASSERT_TRUE(text_out.ok());
      EXPECT_EQ(*text_out, rec["text"].get<std::string>()) << family << " decode line " << rec["line"];
      auto text_skip = tok.decode(want, true);
      ASSERT_TRUE(text_skip.ok());
      EXPECT_EQ(*text_skip, rec["text_skip_special"].get<std::string>()) << family << " decode(skip) line " << rec["line"];
      ++n_encoded;
    } else {
      const auto ids = rec["decode_ids"].get<std::vector<int32_t>>();
      auto a = tok.decode(ids, false);
      auto b = tok.decode(ids, true);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(*a, rec["text"].get<std::string>()) << family << " decode " << show(ids);
      EXPECT_EQ(*b, rec["text_skip_special"].get<std::string>()) << family << " decode(skip) " << show(ids);
      ++n_decoded;
    }
  }
  // A comparison of nothing proves nothing.
  EXPECT_EQ(n_encoded, corpus.size()) << family << ": expected.jsonl does not cover the corpus";
  EXPECT_GT(n_decoded, 0u) << family;
}

class HfFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFamily, MatchesHuggingFace) {
  auto tok = load_tokenizer(kDataDir + "/" + GetParam());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  check_family(**tok, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, HfFamily,
                         ::testing::Values("gpt2", "llama3", "qwen2", "deepseek_v3", "deepseek_llm", "spm_bpe",
                                           "spm_bpe_legacy", "nfkc_lower_digits", "added_flags"));

TEST(GgufFamily, DefaultModelMatchesTransformers) {
  const std::string path = default_model_path();
  if (!file_exists(path)) GTEST_SKIP() << "default model absent (scripts/fetch-default-model.sh): " << path;
  auto tok = load_tokenizer(path);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  check_family(**tok, "gguf");
}

}  // namespace
}  // namespace pagellm

namespace pagellm {
namespace {

// A SentencePiece-style GGUF vocabulary (no merges; they come from the scores) against
// transformers' GGUF converter on the same metadata.
TEST(GgufFamily, LlamaVocabularyMatchesTransformers) {
  std::ifstream in(kDataDir + "/gguf_llama/gguf_data.json");
  const json meta = json::parse(in);
  GgufTokenizerData d;
  d.architecture = "llama";
  d.model = meta["model"].get<std::string>();
  d.tokens = meta["tokens"].get<std::vector<std::string>>();
  d.scores = meta["scores"].get<std::vector<float>>();
  d.token_types = meta["token_type"].get<std::vector<int32_t>>();
  d.unk_id = meta["unk_token_id"].get<int32_t>();
  d.bos_id = meta["bos_token_id"].get<int32_t>();
  d.eos_id = meta["eos_token_id"].get<int32_t>();
  d.add_bos = false;  // transformers' converter alone adds no post-processor
  auto tok = tokenizer_from_gguf_data(d, "gguf_data.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  check_family(**tok, "gguf_llama");
}

// tokenizer.ggml.pre with GgufPreTokenizer::kOriginal rebuilds the original tokenizer.json pipeline:
// a GGUF made from each fixture's vocabulary and merges must encode like the fixture.
class GgufOriginalPre : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(GgufOriginalPre, MatchesTheOriginalTokenizer) {
  const auto& [family, pre] = GetParam();
  std::ifstream in(kDataDir + "/" + family + "/tokenizer.json");
  const json j = json::parse(in);
  GgufTokenizerData d;
  d.architecture = "llama";
  d.model = "gpt2";
  d.pre = pre;
  std::map<int32_t, std::string> by_id;
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) by_id[it.value()] = it.key();
  std::set<int32_t> special, other_added;
  for (const auto& t : j["added_tokens"]) {
    by_id[t["id"].get<int32_t>()] = t["content"].get<std::string>();
    (t["special"].get<bool>() ? special : other_added).insert(t["id"].get<int32_t>());
  }
  for (const auto& [id, t] : by_id) {
    ASSERT_EQ(static_cast<size_t>(id), d.tokens.size()) << "ids must be dense";
    d.tokens.push_back(t);
    d.token_types.push_back(special.count(id) ? 3 : 1);
  }
  for (const auto& m : j["model"]["merges"]) d.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  d.add_bos = false;
  auto tok = tokenizer_from_gguf_data(d, family, GgufPreTokenizer::kOriginal);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const auto corpus = read_jsonl(kDataDir + "/corpus.jsonl");
  size_t n = 0;
  for (const auto& rec : read_jsonl(kDataDir + "/" + family + "/expected.jsonl")) {
    if (!rec.contains("line")) continue;
    const auto want = rec["ids_no_special"].get<std::vector<int32_t>>();
    // Non-special added tokens would be USER_DEFINED entries, which transformers does not add.
    if (std::any_of(want.begin(), want.end(), [&](int32_t id) { return other_added.count(id) > 0; })) continue;
    const std::string text = corpus.at(rec["line"].get<size_t>()).get<std::string>();
    auto got = (*tok)->encode(text, false);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(show(*got), show(want)) << family << " line " << rec["line"] << ": " << json(text).dump();
    ++n;
  }
  EXPECT_GT(n, 70u);
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, GgufOriginalPre,
                         ::testing::Values(std::pair<std::string, std::string>{"gpt2", "gpt2"},
                                           std::pair<std::string, std::string>{"llama3", "llama-bpe"},
                                           std::pair<std::string, std::string>{"qwen2", "qwen2"},
                                           std::pair<std::string, std::string>{"deepseek_v3", "deepseek-v3"}));

}  // namespace
}  // namespace pagellm
