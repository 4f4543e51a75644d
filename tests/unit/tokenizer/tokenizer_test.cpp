// Error handling, invalid input and size limits of the tokenizer (conformance is in
// conformance_test.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "source_dir.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace pagellm {
namespace {

using nlohmann::json;

const std::string kDataDir = test_source_dir() + "/tests/data/tokenizer";

json fixture(const std::string& family) {
  std::ifstream in(kDataDir + "/" + family + "/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::string load_error(const json& j) {
  auto t = tokenizer_from_json(j.dump(), "tokenizer.json");
  return t.ok() ? std::string("loaded") : t.status().to_string();
}

TEST(TokenizerErrors, UnknownComponentsAreNamed) {
  json j = fixture("gpt2");
  j["normalizer"] = {{"type", "Precompiled"}};
  EXPECT_NE(load_error(j).find("normalizer type 'Precompiled' is not supported"), std::string::npos) << load_error(j);
  j = fixture("gpt2");
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  EXPECT_NE(load_error(j).find("pre_tokenizer type 'UnicodeScripts'"), std::string::npos);
  j = fixture("gpt2");
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(load_error(j).find("decoder type 'WordPiece'"), std::string::npos);
  j = fixture("gpt2");
  j["post_processor"] = {{"type", "Bogus"}};
  EXPECT_NE(load_error(j).find("post_processor type 'Bogus'"), std::string::npos);
  j = fixture("gpt2");
  j["model"]["type"] = "Unigram";
  EXPECT_NE(load_error(j).find("model type 'Unigram'"), std::string::npos);
}

TEST(TokenizerErrors, RefusesDropoutAndBadMerges) {
  json j = fixture("gpt2");
  j["model"]["dropout"] = 0.1;
  EXPECT_NE(load_error(j).find("dropout"), std::string::npos);
  j = fixture("gpt2");
  j["model"]["merges"].push_back(json::array({"nope-not-a-token", "x"}));
  EXPECT_NE(load_error(j).find("not in the vocab"), std::string::npos);
  j = fixture("gpt2");
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(load_error(j).find("cannot compile regex"), std::string::npos);
  EXPECT_NE(tokenizer_from_json("{not json", "x.json").status().to_string().find("not valid JSON"), std::string::npos);
  EXPECT_EQ(load_tokenizer("/nonexistent/tokenizer/dir").status().code(), StatusCode::kNotFound);
}

TEST(TokenizerInput, InvalidUtf8IsReplacedLikePython) {
  auto tok = load_tokenizer(kDataDir + "/llama3");
  ASSERT_TRUE(tok.ok());
  // bytes.decode("utf-8", "replace") of b"a\xff\xe2\x82b\xf0\x9f\x98" is "a\ufffd\ufffdb\ufffd".
  const std::string bad = "a\xFF\xE2\x82" "b\xF0\x9F\x98";
  EXPECT_EQ(tok::utf8_lossy(bad), "a\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  EXPECT_EQ(*(*tok)->encode(bad, false), *(*tok)->encode(tok::utf8_lossy(bad), false));
  // NUL bytes are ordinary characters.
  const std::string with_nul("a\0b", 3);
  auto ids = (*tok)->encode(with_nul, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*(*tok)->decode(*ids, false), with_nul);
}

TEST(TokenizerInput, LargeInputsFinishInLinearishTime) {
  for (const char* family : {"gpt2", "spm_bpe"}) {
    auto tok = load_tokenizer(kDataDir + "/" + family);
    ASSERT_TRUE(tok.ok());
    // One 2 MB "word" (a single pre-token for the SentencePiece pipeline), then 4 MB of spaces
    // and of mixed text: all must finish in time linear-ish in the size (seconds in a release build; the bound
    // leaves room for sanitizer builds).
    const std::string one_word(2 << 20, 'a');
    const std::string spaces(4 << 20, ' ');
    std::string mixed;
    while (mixed.size() < (4u << 20)) mixed += "The 123 quick\tbrown \xE7\x8B\x90\xE7\x8B\xB8 jumps!\n  ";
    for (const std::string* text : std::initializer_list<const std::string*>{&one_word, &spaces, &mixed}) {
      const auto t0 = std::chrono::steady_clock::now();
      auto ids = (*tok)->encode(*text, false);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(ids.ok()) << ids.status().to_string();
      EXPECT_GT(ids->size(), 0u);
      EXPECT_LT(s, 120.0) << family << ": " << text->size() << " bytes took " << s << " s";
      // Byte-level BPE is lossless; the SentencePiece-style decoder strips the leading space.
      if (std::string(family) == "gpt2") {
        EXPECT_TRUE(*(*tok)->decode(*ids, false) == *text) << family;
      }
    }
  }
}

TEST(Regex, WhitespaceClassesFollowUnicodeWhiteSpace) {
  auto re = tok::Regex::compile("\\s+", "test");
  ASSERT_TRUE(re.ok());
  size_t n = 0;
  ASSERT_TRUE(re->find_all("a\xC2\x85" "b", [&](size_t a, size_t b) { n += b - a; }).ok());  // U+0085
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(tok::rewrite_whitespace_classes("[^\\s\\p{L}]"), std::string("[^") + "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}" + "\\p{L}]");
}

}  // namespace
}  // namespace pagellm
