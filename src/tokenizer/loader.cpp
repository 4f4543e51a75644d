// Loading a tokenizer from what a model folder holds, and the SentencePiece (tokenizer.model) path.
#include <dirent.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>

#include "tokenizer/components.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace pagellm {

using nlohmann::json;

namespace {

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return data_loss(path + ": read error");
  return ss.str();
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  Status load(const std::string& path) {
    const auto st = sp_.Load(path);
    if (!st.ok()) return invalid_argument(path + ": cannot load SentencePiece model: " + st.ToString());
    n_ = sp_.GetPieceSize();
    return Status();
  }
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(tok::utf8_lossy(text), &ids);
    if (!st.ok()) return invalid_argument("sentencepiece: " + st.ToString());
    std::vector<int32_t> out;
    if (add_special_tokens && bos_id()) out.push_back(*bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::vector<int> keep;
    for (int32_t id : ids) {
      if (id < 0 || id >= n_) continue;
      if (skip_special_tokens && sp_.IsControl(id)) continue;
      keep.push_back(id);
    }
    std::string out;
    const auto st = sp_.Decode(keep, &out);
    if (!st.ok()) return invalid_argument("sentencepiece: " + st.ToString());
    return out;
  }
  int32_t vocab_size() const override { return n_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(std::string(token));
    if (id == sp_.unk_id() && sp_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }
  std::optional<std::string> id_to_token(int32_t id) const override {
    if (id < 0 || id >= n_) return std::nullopt;
    return sp_.IdToPiece(id);
  }
  bool is_special(int32_t id) const override { return id >= 0 && id < n_ && sp_.IsControl(id); }
  bool is_byte_fallback_token(int32_t id) const override { return id >= 0 && id < n_ && sp_.IsByte(id); }
  // Pieces spell spaces as U+2581 and bytes as <0xNN> pieces.
  TokenSpelling token_spelling() const override { return TokenSpelling::kByteFallback; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  int32_t n_ = 0;
};

// A special token of tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> tokenizer_from_json_file(const std::string& path) {
  PAGELLM_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return tokenizer_from_json(text, path);
}

Result<std::unique_ptr<Tokenizer>> tokenizer_from_sentencepiece_file(const std::string& path) {
  auto tok = std::make_unique<SentencePieceTokenizer>();
  PAGELLM_RETURN_IF_ERROR(tok->load(path));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path) {
  if (is_file(path)) {
    if (ends_with(path, ".gguf")) return tokenizer_from_gguf_file(path);
    if (ends_with(path, ".model")) return tokenizer_from_sentencepiece_file(path);
    return tokenizer_from_json_file(path);
  }
  if (!is_dir(path)) return not_found(path + ": no such file or folder");

  json cfg = json::object();
  const std::string cfg_path = join(path, "tokenizer_config.json");
  if (is_file(cfg_path)) {
    PAGELLM_ASSIGN_OR_RETURN(std::string text, read_file(cfg_path));
    cfg = json::parse(text, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) return invalid_argument(cfg_path + ": not a JSON object");
  }

  std::unique_ptr<Tokenizer> tok;
  const std::string json_path = join(path, "tokenizer.json");
  const std::string sp_path = join(path, "tokenizer.model");
  if (is_file(json_path)) {
    PAGELLM_ASSIGN_OR_RETURN(std::string text, read_file(json_path));
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) return invalid_argument(json_path + ": not valid JSON");
    PAGELLM_ASSIGN_OR_RETURN(tok, tokenizer_from_json_value(j, json_path, std::nullopt));
    auto id_of = [&](const char* key) -> std::optional<int32_t> {
      auto t = config_token(cfg, key);
      return t ? tok->token_to_id(*t) : std::nullopt;
    };
    const auto bos = id_of("bos_token"), eos = id_of("eos_token"), pad = id_of("pad_token");
    const bool has_bos_flag = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean();
    const bool has_eos_flag = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean();
    if (has_bos_flag || has_eos_flag) {
      PostOverride post;
      post.add_bos = has_bos_flag && cfg["add_bos_token"].get<bool>();
      post.add_eos = has_eos_flag && cfg["add_eos_token"].get<bool>();
      post.bos = bos;
      post.eos = eos;
      PAGELLM_ASSIGN_OR_RETURN(tok, tokenizer_from_json_value(j, json_path, post));
    }
    tok->set_special_ids(bos, eos, pad);
    return tok;
  }
  if (is_file(sp_path)) {
    PAGELLM_ASSIGN_OR_RETURN(tok, tokenizer_from_sentencepiece_file(sp_path));
    auto id_of = [&](const char* key) -> std::optional<int32_t> {
      auto t = config_token(cfg, key);
      return t ? tok->token_to_id(*t) : std::nullopt;
    };
    tok->set_special_ids(id_of("bos_token"), id_of("eos_token"), id_of("pad_token"));
    return tok;
  }
  // A folder holding one .gguf file.
  std::vector<std::string> ggufs;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (ends_with(name, ".gguf") && is_file(join(path, name))) ggufs.push_back(join(path, name));
    }
    ::closedir(dir);
  }
  if (ggufs.size() == 1) return tokenizer_from_gguf_file(ggufs[0]);
  if (ggufs.size() > 1) return invalid_argument(path + ": several .gguf files; name one");
  return not_found(path + ": no tokenizer.json, tokenizer.model or .gguf file");
}

}  // namespace pagellm
