// `--load-format dummy`: a model of any config.json's shape with no weights on disk. The model asks
// for each tensor by name and shape; this source says every tensor exists (the LM head only when
// the config does not tie it to the embeddings) and hands back data-less views, which the model
// loader fills with random values directly in device memory (Backend::fill_random).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/weights.h"

namespace pagellm {
namespace {

class DummyWeightSource final : public WeightSource {
 public:
  DummyWeightSource(std::string origin, bool tied) : origin_(std::move(origin)), tied_(tied) {
    stub_.name = "(dummy)";
    stub_.dtype = DType::kBF16;
    stub_.data = nullptr;
    stub_.nbytes = 0;
    stub_.file = origin_;
  }
  const std::vector<TensorInfo>& tensors() const override { return none_; }
  const TensorInfo* find(const std::string& name) const override {
    if (name == "lm_head.weight" && tied_) return nullptr;
    return &stub_;
  }
  Result<Tensor> get(const std::string& name, std::vector<int64_t> shape) const override {
    if (shape.empty() || shape.size() > 4)
      return invalid_argument("dummy weights need the expected shape of '" + name + "'");
    if (!find(name)) return not_found("tensor '" + name + "' not found in " + description());
    Tensor t;
    t.data = nullptr;
    t.dtype = DType::kBF16;
    t.ndim = static_cast<int>(shape.size());
    for (int i = 0; i < t.ndim; ++i) t.shape[i] = shape[i];
    t.set_contiguous_strides();
    return t;
  }
  bool is_dummy() const override { return true; }
  std::string description() const override { return "dummy weights for " + origin_; }

 private:
  std::string origin_;
  bool tied_;
  TensorInfo stub_;
  std::vector<TensorInfo> none_;
};

}  // namespace

Result<LoadedCheckpoint> open_dummy_checkpoint(const std::string& config_path) {
  namespace fs = std::filesystem;
  std::string path = config_path;
  if (fs::is_directory(path)) path = (fs::path(path) / "config.json").string();
  std::ifstream f(path);
  if (!f) return not_found(path + ": cannot read the config for dummy weights");
  std::stringstream ss;
  ss << f.rdbuf();
  LoadedCheckpoint c;
  PAGELLM_ASSIGN_OR_RETURN(c.config, parse_hf_config(ss.str(), path));
  c.weights = std::make_unique<DummyWeightSource>(path, c.config.tie_word_embeddings);
  return c;
}

}  // namespace pagellm
