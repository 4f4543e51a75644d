#include "tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "tokenizer/hf_tokenizer.h"

namespace pagellm {

using nlohmann::json;

namespace {

// Split patterns of the original tokenizer.json files, keyed by the tokenizer.ggml.pre values that
// llama.cpp's converter writes for them.
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr const char* kDeepSeekV3Patterns[] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
    "\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};
constexpr const char* kDeepSeekLlmPatterns[] = {
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐ"
    "ῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
};
constexpr const char* kDeepSeekCoderPatterns[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}",
};

json split(const char* pattern) {
  return {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
}
json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", use_regex}};
}
template <size_t N>
json splits_then_bytes(const char* const (&patterns)[N]) {
  json seq = json::array();
  for (const char* p : patterns) seq.push_back(split(p));
  seq.push_back(byte_level(false));
  return {{"type", "Sequence"}, {"pretokenizers", seq}};
}

Result<json> byte_level_pre_tokenizer(const std::string& pre) {
  if (pre.empty() || pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "olmo" || pre == "mpt" ||
      pre == "jina-v1-en" || pre == "stablelm2") {
    return byte_level(true);
  }
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "codeshell" ||
      pre == "exaone") {
    json seq = json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)});
    return json{{"type", "Sequence"}, {"pretokenizers", seq}};
  }
  if (pre == "llama-bpe" || pre == "llama3" || pre == "dbrx" || pre == "smaug-bpe") {
    return json{{"type", "Sequence"}, {"pretokenizers", json::array({split(kLlama3Pattern), byte_level(false)})}};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    return json{{"type", "Sequence"}, {"pretokenizers", json::array({split(kQwen2Pattern), byte_level(false)})}};
  }
  if (pre == "deepseek-v3") return splits_then_bytes(kDeepSeekV3Patterns);
  if (pre == "deepseek-llm") return splits_then_bytes(kDeepSeekLlmPatterns);
  if (pre == "deepseek-coder") return splits_then_bytes(kDeepSeekCoderPatterns);
  return unimplemented("tokenizer.ggml.pre = '" + pre + "' is not supported");
}

// transformers' GGUFTokenizerSkeleton: a SentencePiece vocabulary without merges gets them from the
// scores: every split of a token into two vocabulary tokens, ordered by the token's score.
std::vector<std::pair<std::string, std::string>> merges_from_scores(const GgufTokenizerData& d) {
  std::unordered_map<std::string, float> score;
  for (size_t i = 0; i < d.tokens.size(); ++i) score[d.tokens[i]] = d.scores[i];  // a repeated token keeps the last
  struct Cand {
    std::string l, r;
    float s;
  };
  std::vector<Cand> all;
  std::unordered_set<std::string> done;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const std::string& t = d.tokens[i];
    if (!done.insert(t).second) continue;  // Python iterates the dict, one entry per distinct token
    const float piece_score = score[t];
    std::vector<Cand> local;
    // Python slices by character, so split only at character boundaries.
    for (size_t k = 1; k < t.size(); ++k) {
      if ((static_cast<unsigned char>(t[k]) & 0xC0) == 0x80) continue;
      std::string l = t.substr(0, k), r = t.substr(k);
      if (score.count(l) && score.count(r)) local.push_back({std::move(l), std::move(r), piece_score});
    }
    std::stable_sort(local.begin(), local.end(), [&](const Cand& a, const Cand& b) {
      const float al = score[a.l], bl = score[b.l];
      if (al != bl) return al > bl;
      return score[a.r] > score[b.r];
    });
    for (auto& c : local) all.push_back(std::move(c));
  }
  std::stable_sort(all.begin(), all.end(), [](const Cand& a, const Cand& b) { return a.s > b.s; });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(all.size());
  for (auto& c : all) out.emplace_back(std::move(c.l), std::move(c.r));
  return out;
}


// transformers' GGUF_TO_FAST_CONVERTERS: Qwen2Converter for the qwen families, the llama converter's
// plain ByteLevel (GPT-2 regex) for the others.
bool is_qwen_arch(const std::string& arch) {
  return arch == "qwen2" || arch == "qwen2moe" || arch == "qwen3" || arch == "qwen3moe" || arch == "qwen35" ||
         arch == "minimax-m2";
}

json transformers_byte_level_pre_tokenizer(const std::string& arch) {
  if (is_qwen_arch(arch)) {
    return json{{"type", "Sequence"}, {"pretokenizers", json::array({split(kQwen2Pattern), byte_level(false)})}};
  }
  return byte_level(true);
}

}  // namespace

Result<json> gguf_tokenizer_json(const GgufTokenizerData& d, GgufPreTokenizer pre_choice) {
  const size_t n = d.tokens.size();
  if (n == 0) return invalid_argument("tokenizer.ggml.tokens is empty");
  if (!d.token_types.empty() && d.token_types.size() != n) {
    return invalid_argument("tokenizer.ggml.token_type has " + std::to_string(d.token_types.size()) +
                            " entries for " + std::to_string(n) + " tokens");
  }
  if (!d.scores.empty() && d.scores.size() != n) {
    return invalid_argument("tokenizer.ggml.scores has " + std::to_string(d.scores.size()) + " entries for " +
                            std::to_string(n) + " tokens");
  }
  const bool byte_level_model = d.model == "gpt2";
  if (!byte_level_model && d.model != "llama") {
    return unimplemented("tokenizer.ggml.model = '" + d.model + "' is not supported (gpt2 or llama)");
  }
  json vocab = json::object();
  for (size_t i = 0; i < n; ++i) {
    // A repeated token string keeps its last id, as the dict comprehension in transformers does.
    vocab[d.tokens[i]] = static_cast<int64_t>(i);
  }
  json merges = json::array();
  if (!d.merges.empty()) {
    for (const auto& m : d.merges) {
      const size_t sp = m.find(' ');
      if (sp == std::string::npos) return invalid_argument("tokenizer.ggml.merges: '" + m + "' has no space");
      // Python's str.split(" ") may give more than two parts; tokenizers would reject such a merge.
      merges.push_back(json::array({m.substr(0, sp), m.substr(sp + 1)}));
    }
  } else if (!byte_level_model) {
    if (d.scores.empty()) return invalid_argument("tokenizer.ggml: a llama vocabulary needs merges or scores");
    for (auto& [l, r] : merges_from_scores(d)) merges.push_back(json::array({l, r}));
  }
  json model = {{"type", "BPE"},          {"dropout", nullptr},  {"fuse_unk", true}, {"byte_fallback", true},
                {"ignore_merges", false}, {"vocab", vocab},      {"merges", merges}};
  model["unk_token"] = d.unk_id ? json(d.tokens[*d.unk_id]) : json(nullptr);

  json added = json::array();
  for (size_t i = 0; i < d.token_types.size(); ++i) {
    if (d.token_types[i] != static_cast<int32_t>(GgufTokenType::kControl)) continue;
    added.push_back({{"id", i}, {"content", d.tokens[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }

  json j = {{"version", "1.0"}, {"model", model}, {"added_tokens", added}, {"post_processor", nullptr}};
  const json replace_meta = {{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}};
  json decoders = json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}, replace_meta});
  if (byte_level_model) {
    json pre;
    bool qwen;
    if (pre_choice == GgufPreTokenizer::kTransformers) {
      pre = transformers_byte_level_pre_tokenizer(d.architecture);
      qwen = is_qwen_arch(d.architecture);
    } else {
      PAGELLM_ASSIGN_OR_RETURN(pre, byte_level_pre_tokenizer(d.pre));
      qwen = d.pre == "qwen2" || d.pre == "deepseek-r1-qwen";
      // Llama-3's tokenizer.json takes a pre-token that is a whole vocabulary entry as is.
      if (d.pre == "llama-bpe" || d.pre == "llama3") j["model"]["ignore_merges"] = true;
    }
    // Qwen2's tokenizer (and transformers' Qwen2Converter) NFC-normalizes first.
    j["normalizer"] = qwen ? json{{"type", "NFC"}} : json(nullptr);
    j["pre_tokenizer"] = pre;
    decoders.push_back({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}});
  } else {
    // transformers' LlamaConverter in legacy mode: spaces become U+2581, with one prepended.
    const bool add_prefix_space = d.add_space_prefix.value_or(true);
    json norm = json::array();
    if (add_prefix_space) norm.push_back({{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}});
    norm.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}});
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", norm}};
    j["pre_tokenizer"] = nullptr;
    if (add_prefix_space) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  return j;
}

Result<std::unique_ptr<Tokenizer>> tokenizer_from_gguf_data(const GgufTokenizerData& d, const std::string& name,
                                                           GgufPreTokenizer pre) {
  auto j = gguf_tokenizer_json(d, pre);
  if (!j.ok()) return Status(j.status().code(), name + ": " + j.status().message());
  // llama.cpp's defaults when the flags are absent: BOS for SentencePiece vocabularies only.
  PostOverride post;
  post.add_bos = d.add_bos.value_or(d.model == "llama");
  post.add_eos = d.add_eos.value_or(false);
  post.bos = d.bos_id;
  post.eos = d.eos_id;
  PAGELLM_ASSIGN_OR_RETURN(auto tok, tokenizer_from_json_value(j.value(), name, post));
  tok->set_special_ids(d.bos_id, d.eos_id, d.pad_id);
  return tok;
}

}  // namespace pagellm
