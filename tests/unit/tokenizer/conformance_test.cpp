// Conformance with Hugging Face tokenizers: for every fixture family (tests/data/tokenizer/<family>,
// made by tests/tokenizer/make_expected.py), the ids and decoded text of every corpus line, and the
// decoded text of pseudo-random id sequences, must equal what HF produced.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/default_model.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {
namespace {

using nlohmann::json;

const std::string kDataDir = std::string(PAGELLM_SOURCE_DIR) + "/tests/data/tokenizer";

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
