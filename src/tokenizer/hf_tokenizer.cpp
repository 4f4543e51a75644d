// The tokenizer.json pipeline: added tokens, normalizer, pre-tokenizer, BPE model, post-processor
// and decoder, in the order and with the per-segment semantics of Hugging Face `tokenizers`.
#include <algorithm>
#include <array>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/components.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/unicode.h"

namespace pagellm {

using nlohmann::json;
using namespace tok;

namespace {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool single_word = false;
  // What decode() and id_to_token() give: tokenizers hands out the normalized form of a token that
  // is matched after normalization.
  std::string surface;
};

// Leftmost-longest multi-pattern matcher over bytes (what tokenizers builds with aho-corasick's
// LeftmostLongest): scanning left to right, the first position where any pattern matches wins,
// with the longest pattern there; scanning resumes after it. A byte trie gives the same answer and
// costs O(n * longest token) in the worst case, with a first-byte filter for the common path.
class TokenMatcher {
 public:
  void add(const std::string& pattern, size_t token_index) {
    if (pattern.empty()) return;
    int32_t node = 0;
    for (unsigned char c : pattern) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        terminal_.push_back(-1);
        it = edges_.emplace(key, static_cast<int32_t>(terminal_.size() - 1)).first;
      }
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(token_index);  // first pattern wins
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  }
  bool empty() const { return terminal_.size() <= 1; }

  struct Match {
    size_t begin, end, token_index;
  };
  std::vector<Match> find_all(std::string_view s) const {
    std::vector<Match> out;
    if (empty()) return out;
    size_t i = 0;
    while (i < s.size()) {
      if (!first_byte_[static_cast<unsigned char>(s[i])]) {
        ++i;
        continue;
      }
      int32_t node = 0;
      int32_t best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[j]));
        if (it == edges_.end()) break;
        node = it->second;
        if (terminal_[node] >= 0) {
          best = terminal_[node];
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        out.push_back({i, best_end, static_cast<size_t>(best)});
        i = best_end;
      } else {
        ++i;
      }
    }
    return out;
  }

 private:
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_{-1};  // node -> token index, -1 when no pattern ends there
  std::array<bool, 256> first_byte_{};
};

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  return is_word_char(next_code_point(s, &pos));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t pos = 0;
  return is_word_char(next_code_point(s, &pos));
}

// Start of the whitespace run that ends `s` (s.size() when none).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!is_whitespace(next_code_point(s, &pos))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that starts `s`.
size_t leading_space_len(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t p = pos;
    if (!is_whitespace(next_code_point(s, &p))) break;
    pos = p;
  }
  return pos;
}

struct Segment {
  std::string text;
  int32_t id = -1;  // an added token's id, or -1 for text still to tokenize
  bool at_origin = false;
};

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(BpeModel model, std::unique_ptr<Normalizer> normalizer, std::unique_ptr<PreTokenizer> pre,
              std::unique_ptr<Decoder> decoder, PostTemplate post, std::vector<AddedToken> added)
      : model_(std::move(model)),
        normalizer_(std::move(normalizer)),
        pre_(std::move(pre)),
        decoder_(std::move(decoder)),
        post_(std::move(post)),
        added_(std::move(added)) {
    max_id_ = model_.max_id();
    for (size_t i = 0; i < added_.size(); ++i) {
      const AddedToken& t = added_[i];
      added_by_content_.emplace(t.content, t.id);
      added_by_id_.emplace(t.id, i);
      if (t.special) special_contents_.insert(t.content);
      max_id_ = std::max(max_id_, t.id);
    }
    decoder_byte_fallback_ = decoder_ && decoder_->has_byte_fallback();
  }

  Status build_matchers() {
    // tokenizers lists special tokens before the others; among equal matches the first one wins.
    std::vector<size_t> order;
    for (size_t i = 0; i < added_.size(); ++i) {
      if (added_[i].special) order.push_back(i);
    }
    for (size_t i = 0; i < added_.size(); ++i) {
      if (!added_[i].special) order.push_back(i);
    }
    for (size_t i : order) {
      const AddedToken& t = added_[i];
      if (!t.normalized) {
        raw_matcher_.add(t.content, i);
      } else {
        std::string pattern = t.content;
        if (normalizer_) PAGELLM_RETURN_IF_ERROR(normalizer_->normalize(&pattern));
        normalized_matcher_.add(pattern, i);
        added_[i].surface = pattern;
      }
    }
    special_contents_.clear();
    for (const auto& t : added_) {
      if (t.special) special_contents_.insert(t.surface);
    }
    return Status();
  }

  void set_post(PostTemplate post) { post_ = std::move(post); }

  Result<std::vector<int32_t>> encode(std::string_view input, bool add_special_tokens) const override {
    const std::string text = utf8_lossy(input);
    std::vector<int32_t> ids;
    if (add_special_tokens) ids = post_.prefix;
    ids.reserve(ids.size() + text.size() / 3 + 8);

    std::vector<Segment> first;
    split_added(text, raw_matcher_, /*at_origin=*/true, &first);
    std::vector<Piece> pieces;
    for (auto& seg : first) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      if (normalizer_) PAGELLM_RETURN_IF_ERROR(normalizer_->normalize(&seg.text));
      if (seg.text.empty()) continue;
      std::vector<Segment> second;
      split_added(seg.text, normalized_matcher_, seg.at_origin, &second);
      for (auto& sub : second) {
        if (sub.id >= 0) {
          ids.push_back(sub.id);
          continue;
        }
        pieces.clear();
        pieces.push_back({std::move(sub.text), sub.at_origin});
        if (pre_) PAGELLM_RETURN_IF_ERROR(pre_->pre_tokenize(&pieces));
        for (const auto& p : pieces) model_.tokenize(p.text, &ids);
      }
    }
    if (add_special_tokens) ids.insert(ids.end(), post_.suffix.begin(), post_.suffix.end());
    return ids;
  }

  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      const std::string* tok = token_ptr(id);
      if (!tok) continue;
      if (skip_special_tokens && special_contents_.count(*tok)) continue;
      tokens.push_back(*tok);
    }
    if (!decoder_) {
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (i) out += ' ';
        out += tokens[i];
      }
      return out;
    }
    PAGELLM_RETURN_IF_ERROR(decoder_->decode_chain(&tokens));
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }

  int32_t vocab_size() const override { return max_id_ + 1; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) return it->second;
    if (auto it = model_.vocab().find(token); it != model_.vocab().end()) return it->second;
    return std::nullopt;
  }
  std::optional<std::string> id_to_token(int32_t id) const override {
    const std::string* t = token_ptr(id);
    if (!t) return std::nullopt;
    return *t;
  }
  bool is_special(int32_t id) const override {
    const std::string* t = token_ptr(id);
    return t && special_contents_.count(*t);
  }
  bool is_byte_fallback_token(int32_t id) const override {
    if (!decoder_byte_fallback_) return false;
    const std::string* t = token_ptr(id);
    return t && byte_fallback_value(*t).has_value();
  }
  TokenSpelling token_spelling() const override {
    return decoder_ ? decoder_->spelling() : TokenSpelling::kRaw;
  }

 private:
  const std::string* token_ptr(int32_t id) const {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return &added_[it->second].surface;
    return model_.id_to_token(id);
  }

  // tokenizers' AddedVocabulary::find_matches + split_with_indices over `s`.
  void split_added(const std::string& s, const TokenMatcher& matcher, bool at_origin, std::vector<Segment>* out) const {
    size_t start_offset = 0;
    for (const auto& m : matcher.find_all(s)) {
      const AddedToken& t = added_[m.token_index];
      size_t start = m.begin, stop = m.end;
      if (t.single_word) {
        const bool start_space = start == 0 || !ends_with_word(std::string_view(s).substr(0, start));
        const bool stop_space = stop == s.size() || !starts_with_word(std::string_view(s).substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        // Never reach back into what an earlier match already took.
        start = std::max(trailing_space_start(std::string_view(s).substr(0, start)), start_offset);
      }
      if (t.rstrip) stop += leading_space_len(std::string_view(s).substr(stop));
      if (start_offset < start) {
        out->push_back({s.substr(start_offset, start - start_offset), -1, at_origin && start_offset == 0});
      }
      out->push_back({std::string(), t.id, false});
      start_offset = stop;
    }
    if (start_offset < s.size()) {
      out->push_back({s.substr(start_offset), -1, at_origin && start_offset == 0});
    }
  }

  BpeModel model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<Decoder> decoder_;
  PostTemplate post_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unordered_set<std::string> special_contents_;
  TokenMatcher raw_matcher_, normalized_matcher_;
  int32_t max_id_ = -1;
  bool decoder_byte_fallback_ = false;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> tokenizer_from_json_value(const json& j, const std::string& name,
                                                              const std::optional<PostOverride>& post_override) {
  if (!j.is_object()) return invalid_argument(name + ": not a JSON object");
  auto err = [&](const Status& s) { return Status(s.code(), name + ": " + s.message()); };
  if (!j.contains("model")) return invalid_argument(name + ": missing 'model'");
  auto model = BpeModel::from_json(j["model"]);
  if (!model.ok()) return err(model.status());
  auto normalizer = make_normalizer(j.value("normalizer", json()));
  if (!normalizer.ok()) return err(normalizer.status());
  auto pre = make_pre_tokenizer(j.value("pre_tokenizer", json()));
  if (!pre.ok()) return err(pre.status());
  auto decoder = make_decoder(j.value("decoder", json()));
  if (!decoder.ok()) return err(decoder.status());
  auto post = make_post_template(j.value("post_processor", json()));
  if (!post.ok()) return err(post.status());

  std::vector<AddedToken> added;
  if (auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return invalid_argument(name + ": 'added_tokens' must be a list");
    std::unordered_set<std::string> seen;
    for (const auto& e : *it) {
      if (!e.is_object() || !e.contains("content") || !e["content"].is_string() || !e.contains("id") ||
          !e["id"].is_number_integer()) {
        return invalid_argument(name + ": an added token needs a string 'content' and an integer 'id'");
      }
      AddedToken t;
      t.content = e["content"].get<std::string>();
      const int64_t id = e["id"].get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 30)) return out_of_range(name + ": added token id " + std::to_string(id) + " out of range");
      t.id = static_cast<int32_t>(id);
      try {
        t.special = e.value("special", false);
        t.lstrip = e.value("lstrip", false);
        t.rstrip = e.value("rstrip", false);
        t.normalized = e.value("normalized", !t.special);
        t.single_word = e.value("single_word", false);
      } catch (const json::exception&) {
        return invalid_argument(name + ": added token '" + t.content + "' has a flag that is not a boolean");
      }
      if (t.content.empty() || !seen.insert(t.content).second) continue;
      t.surface = t.content;
      added.push_back(std::move(t));
    }
  }
  auto tok = std::make_unique<HfTokenizer>(std::move(model).value(), std::move(normalizer).value(), std::move(pre).value(),
                                           std::move(decoder).value(), std::move(post).value(), std::move(added));
  if (Status s = tok->build_matchers(); !s.ok()) return err(s);
  if (post_override) {
    PostTemplate p;
    if (post_override->add_bos) {
      if (!post_override->bos) return invalid_argument(name + ": add_bos_token is set but there is no bos token");
      p.prefix.push_back(*post_override->bos);
    }
    if (post_override->add_eos) {
      if (!post_override->eos) return invalid_argument(name + ": add_eos_token is set but there is no eos token");
      p.suffix.push_back(*post_override->eos);
    }
    tok->set_post(std::move(p));
  }
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Result<std::unique_ptr<Tokenizer>> tokenizer_from_json(std::string_view json_text, const std::string& name) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(name + ": not valid JSON");
  return tokenizer_from_json_value(j, name, std::nullopt);
}

}  // namespace pagellm
