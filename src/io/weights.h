// WeightSource: the tensors of a checkpoint by their Hugging Face names, whatever the file format
// (safetensors shards or GGUF). Data stays memory-mapped; the CPU backend computes from it
// directly, device backends upload it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/model_config.h"

namespace pagellm {

struct TensorInfo {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  DType dtype;
  std::vector<int64_t> shape;  // row-major, as torch shows it: [out_features, in_features]
  const void* data;            // mmap'd, valid while the WeightSource lives
  int64_t nbytes;
  std::string file;            // for messages
};

// The number of values of a tensor of `shape` (1 for a scalar's []).
inline int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // nullptr when absent.
  virtual const TensorInfo* find(const std::string& name) const = 0;
  // A view of the tensor (CPU memory). Fails with kNotFound naming the tensor and the source, or
  // kInvalidArgument when its shape differs from `expected_shape` (empty: any shape).
  virtual Result<Tensor> get(const std::string& name, std::vector<int64_t> expected_shape = {}) const;
  // True when tensors have no data (data == nullptr): `--load-format dummy`, whose weights the
  // model fills with fill_random on its backend.
  virtual bool is_dummy() const { return false; }
  virtual std::string description() const = 0;  // "model.safetensors (3 shards)" etc.
};

// Opens a model folder: *.safetensors (single or sharded with model.safetensors.index.json) plus
// config.json; or a .gguf file (or a folder holding exactly one). Returns config and weights.
struct LoadedCheckpoint {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::string gguf_path;  // non-empty when loaded from GGUF (its metadata also has a tokenizer)
};
Result<LoadedCheckpoint> open_checkpoint(const std::string& path);

}  // namespace pagellm

namespace pagellm {
// Format-specific openers used by open_checkpoint (io/safetensors.cpp, io/gguf.cpp).
Result<LoadedCheckpoint> open_safetensors_checkpoint(const std::string& model_dir);
Result<LoadedCheckpoint> open_gguf_checkpoint(const std::string& gguf_path);
// A model of the shape a config.json describes (a file, or a folder holding one) with no
// weights: every tensor the model asks for exists, with data == nullptr (see is_dummy()).
Result<LoadedCheckpoint> open_dummy_checkpoint(const std::string& config_path);
}  // namespace pagellm
