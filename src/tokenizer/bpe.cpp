#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include "tokenizer/unicode.h"

namespace pagellm::tok {

using nlohmann::json;

BpeModel::BpeModel(BpeModel&& o) noexcept
    : vocab_(std::move(o.vocab_)),
      id_to_token_(std::move(o.id_to_token_)),
      has_id_(std::move(o.has_id_)),
      merges_(std::move(o.merges_)),
      unk_id_(o.unk_id_),
      fuse_unk_(o.fuse_unk_),
      byte_fallback_(o.byte_fallback_),
      ignore_merges_(o.ignore_merges_),
      continuing_subword_prefix_(std::move(o.continuing_subword_prefix_)),
      end_of_word_suffix_(std::move(o.end_of_word_suffix_)) {
  std::copy(std::begin(o.byte_ids_), std::end(o.byte_ids_), byte_ids_);
}

Result<BpeModel> BpeModel::from_json(const json& m) {
  const std::string where = "tokenizer.json: model";
  if (!m.is_object()) return invalid_argument(where + " must be an object");
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") return unimplemented(where + ": model type '" + type + "' is not supported (only BPE)");
  if (m.contains("dropout") && !m["dropout"].is_null()) {
    if (!m["dropout"].is_number() || m["dropout"].get<double>() != 0.0) {
      return unimplemented(where + ": 'dropout' must be null (BPE dropout is a training-time feature)");
    }
  }
  BpeModel b;
  auto str_field = [&](const char* k, std::string* out) -> Status {
    if (!m.contains(k) || m[k].is_null()) return Status();
    if (!m[k].is_string()) return invalid_argument(where + ": '" + k + "' must be a string");
    *out = m[k].get<std::string>();
    return Status();
  };
  auto bool_field = [&](const char* k, bool* out) -> Status {
    if (!m.contains(k) || m[k].is_null()) return Status();
    if (!m[k].is_boolean()) return invalid_argument(where + ": '" + k + "' must be a boolean");
    *out = m[k].get<bool>();
    return Status();
  };
  PAGELLM_RETURN_IF_ERROR(str_field("continuing_subword_prefix", &b.continuing_subword_prefix_));
  PAGELLM_RETURN_IF_ERROR(str_field("end_of_word_suffix", &b.end_of_word_suffix_));
  PAGELLM_RETURN_IF_ERROR(bool_field("fuse_unk", &b.fuse_unk_));
  PAGELLM_RETURN_IF_ERROR(bool_field("byte_fallback", &b.byte_fallback_));
  PAGELLM_RETURN_IF_ERROR(bool_field("ignore_merges", &b.ignore_merges_));

  auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object()) return invalid_argument(where + ": 'vocab' must be an object");
  int64_t max_id = -1;
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it.value().is_number_integer()) return invalid_argument(where + ": vocab id of '" + it.key() + "' is not an integer");
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 30)) return out_of_range(where + ": vocab id " + std::to_string(id) + " out of range");
    max_id = std::max(max_id, id);
    b.vocab_[it.key()] = static_cast<int32_t>(id);
  }
  b.id_to_token_.resize(static_cast<size_t>(max_id + 1));
  b.has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [tok, id] : b.vocab_) {
    b.id_to_token_[id] = tok;
    b.has_id_[id] = true;
  }
  std::string unk;
  PAGELLM_RETURN_IF_ERROR(str_field("unk_token", &unk));
  if (!unk.empty()) {
    auto it = b.vocab_.find(unk);
    // tokenizers only fails when the unk token is actually needed; remember it as absent.
    b.unk_id_ = it == b.vocab_.end() ? -1 : it->second;
  }
  for (int i = 0; i < 256; ++i) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", i);
    auto it = b.vocab_.find(std::string_view(name));
    b.byte_ids_[i] = it == b.vocab_.end() ? -1 : it->second;
  }

  auto mit = m.find("merges");
  if (mit == m.end() || mit->is_null()) return b;
  if (!mit->is_array()) return invalid_argument(where + ": 'merges' must be a list");
  const size_t prefix_len = b.continuing_subword_prefix_.size();
  int32_t rank = 0;
  for (const auto& e : *mit) {
    std::string a, c;
    if (e.is_string()) {  // "a b" (the older format)
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return invalid_argument(where + ": merge '" + s + "' is not two tokens separated by one space");
      }
      a = s.substr(0, sp);
      c = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      c = e[1].get<std::string>();
    } else {
      return invalid_argument(where + ": merge #" + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    auto ia = b.vocab_.find(a);
    auto ic = b.vocab_.find(c);
    if (ia == b.vocab_.end() || ic == b.vocab_.end()) {
      return invalid_argument(where + ": merge '" + a + " " + c + "' uses a token that is not in the vocab");
    }
    // With a continuing-subword prefix the right part loses its prefix when merged.
    std::string merged = a;
    if (prefix_len && c.compare(0, prefix_len, b.continuing_subword_prefix_) == 0) {
      merged += c.substr(prefix_len);
    } else {
      merged += c;
    }
    auto im = b.vocab_.find(merged);
    if (im == b.vocab_.end()) {
      return invalid_argument(where + ": merge '" + a + " " + c + "' makes '" + merged + "', which is not in the vocab");
    }
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ic->second);
    b.merges_[key] = {rank, im->second};  // a repeated pair keeps its last rank, as tokenizers does
    ++rank;
  }
  return b;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, &ids);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    // Like tokenizers' cache, stop inserting when full rather than evicting.
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), ids);
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

struct MergeCand {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  bool operator<(const MergeCand& o) const {  // std::priority_queue pops the largest: lowest rank, then lowest pos
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>* out) const {
  std::vector<Symbol> syms;
  syms.reserve(w.size());
  int32_t unk_pending = -1;  // a pending (possibly fused) unk symbol
  auto add = [&](int32_t id) { syms.push_back({id, static_cast<int32_t>(syms.size()) - 1, -1, true}); };
  std::string s;
  size_t pos = 0;
  while (pos < w.size()) {
    const size_t begin = pos;
    const bool is_first = begin == 0;
    next_code_point(w, &pos);
    const bool is_last = pos >= w.size();
    s.assign(w.substr(begin, pos - begin));
    if (!is_first && !continuing_subword_prefix_.empty()) s.insert(0, continuing_subword_prefix_);
    if (is_last && !end_of_word_suffix_.empty()) s += end_of_word_suffix_;
    auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      if (unk_pending >= 0) {
        add(unk_pending);
        unk_pending = -1;
      }
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all &= byte_ids_[c] >= 0;
      if (all) {
        // As in tokenizers, a pending unk is not flushed here; it lands after these bytes.
        for (unsigned char c : s) add(byte_ids_[c]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk_pending >= 0 && !fuse_unk_) add(unk_pending);
      unk_pending = unk_id_;
    }
  }
  if (unk_pending >= 0) add(unk_pending);
  for (size_t i = 0; i + 1 < syms.size(); ++i) syms[i].next = static_cast<int32_t>(i + 1);

  auto lookup = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  if (syms.size() > 1 && !merges_.empty()) {
    std::vector<MergeCand> heap_storage;
    heap_storage.reserve(syms.size());
    std::priority_queue<MergeCand> queue(std::less<MergeCand>(), std::move(heap_storage));
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      if (auto m = lookup(syms[i].id, syms[i + 1].id)) queue.push({m->first, static_cast<int32_t>(i), m->second});
    }
    while (!queue.empty()) {
      const MergeCand top = queue.top();
      queue.pop();
      Symbol& cur = syms[top.pos];
      if (!cur.alive || cur.next < 0) continue;
      const int32_t next_pos = cur.next;
      Symbol& right = syms[next_pos];
      // Skip stale entries: the pair at this position changed since it was queued.
      auto m = lookup(cur.id, right.id);
      if (!m || m->second != top.new_id) continue;
      cur.id = top.new_id;
      cur.next = right.next;
      right.alive = false;
      if (right.next >= 0) syms[right.next].prev = top.pos;
      if (cur.prev >= 0) {
        if (auto pm = lookup(syms[cur.prev].id, cur.id)) queue.push({pm->first, cur.prev, pm->second});
      }
      if (cur.next >= 0) {
        if (auto nm = lookup(cur.id, syms[cur.next].id)) queue.push({nm->first, top.pos, nm->second});
      }
    }
  }
  for (const auto& sym : syms) {
    if (sym.alive) out->push_back(sym.id);
  }
}

}  // namespace pagellm::tok
