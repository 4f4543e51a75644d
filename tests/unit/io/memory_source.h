// MemorySource: tensors held in memory as a WeightSource, for the readers' unit tests (packed
// 4-bit and FP8 checkpoints) to build consistent and broken checkpoints without files.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/weights.h"

namespace pagellm {

// Tensors held in memory, as a WeightSource.
class MemorySource final : public WeightSource {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape,
           std::vector<uint8_t> bytes) {
    bytes_[name] = std::move(bytes);
    TensorInfo t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data = bytes_[name].data();
    t.nbytes = static_cast<int64_t>(bytes_[name].size());
    t.file = "mem.safetensors";
    infos_.push_back(t);
  }
  template <typename T>
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape,
           const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    add(name, dtype, std::move(shape), std::move(b));
  }
  void remove(const std::string& name) {
    std::erase_if(infos_, [&](const TensorInfo& t) { return t.name == name; });
  }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  const TensorInfo* find(const std::string& name) const override {
    for (const TensorInfo& t : infos_)
      if (t.name == name) return &t;
    return nullptr;
  }
  std::string description() const override { return "mem.safetensors"; }

 private:
  std::map<std::string, std::vector<uint8_t>> bytes_;  // node-based: data pointers stay put
  std::vector<TensorInfo> infos_;
};

}  // namespace pagellm
