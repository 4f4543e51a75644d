// HeaderSource: the tensors of a parsed safetensors header as a WeightSource, for the fuzz targets
// that feed whole files to the checkpoint readers (fuzz_packed_int4, fuzz_fp8_weights).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "io/weights.h"

namespace pagellm::fuzz {

class HeaderSource final : public WeightSource {
 public:
  explicit HeaderSource(std::vector<TensorInfo> t) : tensors_(std::move(t)) {
    for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
  }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const override {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
  }
  std::string description() const override { return "fuzz.safetensors"; }

 private:
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace pagellm::fuzz
