// The BPE model of Hugging Face `tokenizers`: merges applied by rank with a heap over a linked list
// of symbols (O(n log n) per word), byte_fallback to <0xNN> tokens, unk with fuse_unk,
// continuing_subword_prefix / end_of_word_suffix and ignore_merges. Words seen before are served
// from a bounded, thread-safe cache.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace pagellm::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // From the "model" object of tokenizer.json.
  static Result<BpeModel> from_json(const nlohmann::json& model);

  BpeModel(BpeModel&& o) noexcept;
  BpeModel& operator=(BpeModel&&) = delete;

  // Appends the ids of one pre-token to `out`.
  void tokenize(std::string_view word, std::vector<int32_t>* out) const;

  const Vocab& vocab() const { return vocab_; }
  // Token string by id; empty when the id is not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  BpeModel() = default;
  void merge_word(std::string_view word, std::vector<int32_t>* out) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  // (left id, right id) packed into 64 bits -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  int32_t byte_ids_[256];  // <0xNN> ids, -1 when absent

  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace pagellm::tok
