// libFuzzer target for the tokenizer. The first input byte picks the mode:
//   0: the rest is a tokenizer.json document: load it, and if it loads, encode/decode a few texts
//   1..: the rest is text (any bytes: invalid UTF-8, NULs) encoded by one of several built-in
//        pipelines; the ids are decoded, streamed through the detokenizer, and checked to agree.
// Checks: no crash, sanitizer report or uncaught exception; decode output is valid UTF-8;
// streamed deltas concatenate to decode().
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/components.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using nlohmann::json;
using pagellm::Tokenizer;

// A byte-level vocabulary (the 256 alphabet characters) with a few merges, so merging runs.
json byte_level_model(bool byte_fallback) {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    if (byte_fallback) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      vocab[name] = id++;
    }
  }
  const char* pieces[] = {"a", "b", "c", "e", "h", "l", "o", "t", " ", "\xC4\xA0", "\xE2\x96\x81"};
  for (const char* p : pieces) vocab[p] = id++;
  for (int b = 0; b < 256 && !byte_fallback; ++b) {
    const std::string c = pagellm::tok::byte_level_char(static_cast<unsigned char>(b));
    if (!vocab.contains(c)) vocab[c] = id++;
  }
  json merges = json::array();
  const char* pairs[][2] = {{"t", "h"}, {"th", "e"}, {"\xC4\xA0", "the"}, {"h", "e"}, {"l", "l"}, {"he", "ll"},
                            {"hell", "o"}, {"\xE2\x96\x81", "a"}, {"a", "b"}, {"ab", "c"}};
  for (const auto& p : pairs) {
    const std::string merged = std::string(p[0]) + p[1];
    if (!vocab.contains(p[0]) || !vocab.contains(p[1])) continue;
    if (!vocab.contains(merged)) vocab[merged] = id++;
    merges.push_back(json::array({p[0], p[1]}));
  }
  vocab["<unk>"] = id++;
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", "<unk>"}, {"fuse_unk", true},
          {"byte_fallback", byte_fallback}, {"dropout", nullptr}};
}

json added_tokens(const json& model) {
  const int base = static_cast<int>(model["vocab"].size());
  return json::array({
      {{"id", base}, {"content", "<|im_start|>"}, {"special", true}, {"normalized", false}},
      {{"id", base + 1}, {"content", "</s>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}},
      {{"id", base + 2}, {"content", "hello"}, {"special", false}, {"single_word", true}, {"normalized", true}},
  });
}

std::vector<std::unique_ptr<Tokenizer>> make_pipelines() {
  // Pipelines around the model: normalizer, pre_tokenizer, decoder, post_processor (ID0 is the
  // first added token's id, filled in below).
  const char* kStages[] = {
      R"({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true},
          "decoder": {"type": "ByteLevel"},
          "post_processor": {"type": "RobertaProcessing", "cls": ["<|im_start|>", ID0], "sep": ["</s>", ID1]}})",
      R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "Split", "behavior": "Isolated", "pattern": {"Regex":
              "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+$|\\s+"}},
            {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
          "decoder": {"type": "ByteLevel"}})",
      R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
          "pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "first", "split": true},
          "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
          "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [ID0]}}}})",
      R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}, {"type": "Strip"}]},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Punctuation"},
            {"type": "Whitespace"}]},
          "decoder": {"type": "Metaspace"}})",
  };
  std::vector<json> docs;
  for (size_t i = 0; i < sizeof(kStages) / sizeof(kStages[0]); ++i) {
    const bool byte_fallback = i >= 2;
    json m = byte_level_model(byte_fallback);
    const size_t id0 = m["vocab"].size();
    std::string stages = kStages[i];
    for (auto [key, id] : {std::pair{"ID0", id0}, std::pair{"ID1", id0 + 1}}) {
      for (size_t p; (p = stages.find(key)) != std::string::npos;) stages.replace(p, 3, std::to_string(id));
    }
    json d = json::parse(stages);
    d["model"] = m;
    d["added_tokens"] = added_tokens(m);
    docs.push_back(std::move(d));
  }
  std::vector<std::unique_ptr<Tokenizer>> out;
  for (const auto& d : docs) {
    auto t = pagellm::tokenizer_from_json(d.dump(), "fuzz pipeline");
    if (!t.ok()) {
      std::fprintf(stderr, "built-in pipeline failed: %s\n", t.status().to_string().c_str());
      std::abort();
    }
    out.push_back(std::move(t).value());
  }
  return out;
}

void check(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.encode(text, true);
  if (!ids.ok()) return;  // a clean error (e.g. a regex resource limit) is fine
  for (bool skip : {false, true}) {
    auto full = tok.decode(*ids, skip);
    if (!full.ok()) continue;
    if (!pagellm::tok::is_valid_utf8(*full)) std::abort();
    pagellm::IncrementalDetokenizer detok(tok, skip);
    std::string streamed;
    for (int32_t id : *ids) {
      auto d = detok.add(id);
      if (!d.ok() || !pagellm::tok::is_valid_utf8(*d)) std::abort();
      streamed += *d;
    }
    auto tail = detok.finish();
    if (!tail.ok()) std::abort();
    streamed += *tail;
    if (streamed != *full) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto pipelines = make_pipelines();
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] == 0) {
    auto tok = pagellm::tokenizer_from_json(rest, "fuzz input");
    if (tok.ok()) {
      check(**tok, "Hello world! 123 <|im_start|> \xE2\x82\xAC\xFF");
      std::vector<int32_t> ids;
      for (int32_t i = -2; i < 300; ++i) ids.push_back(i);
      (void)(*tok)->decode(ids, false);
    }
    return 0;
  }
  check(*pipelines[data[0] % pipelines.size()], rest);
  return 0;
}
