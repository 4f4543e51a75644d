// A tokenizer whose token id i is byte i (GPT-2's ByteLevel spelling), as
// tests/server/byte_model.py makes it: the golden Llama's 256-token vocabulary as text, for the
// engine tests that need one (structured outputs).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "tokenizer/components.h"
#include "tokenizer/tokenizer.h"

namespace pagellm {

inline std::unique_ptr<Tokenizer> byte_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::byte_level_char(static_cast<unsigned char>(b))] = b;
  const nlohmann::json bl = {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", true}};
  const nlohmann::json j = {{"version", "1.0"},
                            {"added_tokens", nlohmann::json::array()},
                            {"normalizer", nullptr},
                            {"pre_tokenizer", bl},
                            {"post_processor", nullptr},
                            {"decoder", bl},
                            {"model",
                             {{"type", "BPE"},
                              {"vocab", vocab},
                              {"merges", nlohmann::json::array()},
                              {"byte_fallback", false},
                              {"fuse_unk", false},
                              {"unk_token", nullptr}}}};
  auto t = tokenizer_from_json(j.dump(), "bytes");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(*t);
}

}  // namespace pagellm
