// Property test of the streaming detokenizer on several tokenizer families: for random id
// sequences (uniform ids, byte-fallback runs, real encodings), every delta is valid UTF-8 and the
// deltas add up to decode(all ids), with and without skipping special tokens.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "source_dir.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace pagellm {
namespace {

const std::string kDataDir = test_source_dir() + "/tests/data/tokenizer";

std::vector<std::string> corpus() {
  std::vector<std::string> out;
  std::ifstream in(kDataDir + "/corpus.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  return out;
}

class DetokenizerProperty : public ::testing::TestWithParam<std::string> {};

TEST_P(DetokenizerProperty, DeltasConcatenateToDecode) {
  auto loaded = load_tokenizer(kDataDir + "/" + GetParam());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const Tokenizer& tok = **loaded;
  const uint32_t seed = 20240517;
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<int32_t> byte_ids;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto id = tok.token_to_id(name)) byte_ids.push_back(*id);
  }
  std::vector<std::vector<int32_t>> cases;
  for (const auto& text : corpus()) {
    auto ids = tok.encode(text, true);
    ASSERT_TRUE(ids.ok());
    cases.push_back(*ids);
  }
  std::uniform_int_distribution<int32_t> any_id(0, tok.vocab_size() - 1);
  for (int i = 0; i < 300; ++i) {
    std::vector<int32_t> ids(rng() % 40);
    for (auto& id : ids) {
      if (!byte_ids.empty() && rng() % 3 == 0) {
        id = byte_ids[rng() % byte_ids.size()];
      } else {
        id = any_id(rng);
      }
    }
    cases.push_back(std::move(ids));
  }
  size_t n_checked = 0;
  for (const auto& ids : cases) {
    for (bool skip : {false, true}) {
      IncrementalDetokenizer detok(tok, skip);
      std::string streamed;
      for (int32_t id : ids) {
        auto d = detok.add(id);
        ASSERT_TRUE(d.ok()) << d.status().to_string();
        ASSERT_TRUE(tok::is_valid_utf8(*d));
        streamed += *d;
      }
      auto tail = detok.finish();
      ASSERT_TRUE(tail.ok()) << tail.status().to_string();
      streamed += *tail;
      auto full = tok.decode(ids, skip);
      ASSERT_TRUE(full.ok());
      ASSERT_EQ(streamed, *full) << GetParam() << " ids " << nlohmann::json(ids).dump() << " skip=" << skip;
      ++n_checked;
    }
  }
  EXPECT_GT(n_checked, 600u);
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, DetokenizerProperty,
                         ::testing::Values("gpt2", "llama3", "qwen2", "spm_bpe", "spm_bpe_legacy", "nfkc_lower_digits",
                                           "added_flags", "deepseek_v3"));

TEST(Detokenizer, HoldsBackHalfCharacters) {
  auto loaded = load_tokenizer(kDataDir + "/spm_bpe");
  ASSERT_TRUE(loaded.ok());
  const Tokenizer& tok = **loaded;
  // "€" is E2 82 AC: nothing may come out until the third byte arrives.
  IncrementalDetokenizer detok(tok, false);
  const char* bytes[] = {"<0xE2>", "<0x82>", "<0xAC>"};
  for (int i = 0; i < 2; ++i) EXPECT_EQ(*detok.add(*tok.token_to_id(bytes[i])), "");
  EXPECT_EQ(*detok.add(*tok.token_to_id(bytes[2])), "");  // a byte run is open until a non-byte token
  auto hello = tok.encode(" hello", false);
  std::string out;
  for (int32_t id : *hello) out += *detok.add(id);
  out += *detok.finish();
  EXPECT_EQ(out, "\xE2\x82\xAC hello");
}

}  // namespace
}  // namespace pagellm
