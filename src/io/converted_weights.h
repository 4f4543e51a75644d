// ConvertedWeights: a WeightSource over another whose quantized linears were converted at open
// (io/packed_int4.h's 4-bit checkpoints, io/fp8_weights.h's FP8 ones): the converted tensors,
// held in memory, and every other tensor passed through, found by name. Plus the helpers both
// readers' messages use.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/file_util.h"
#include "io/weights.h"

namespace pagellm::io_detail {

inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class ConvertedWeights : public WeightSource {
 public:
  explicit ConvertedWeights(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {}

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const override {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
  }

 protected:
  // "<file>: tensor '<name>'" of the source's tensor `name` (the source's description if absent).
  std::string describe(const std::string& name) const {
    const TensorInfo* t = inner_->find(name);
    return (t ? t->file : inner_->description()) + ": tensor " + quote_name(name);
  }
  // A converted tensor, whose bytes this source keeps; `t.data` points into them.
  void add_converted(TensorInfo t, std::unique_ptr<uint8_t[]> bytes) {
    storage_.push_back(std::move(bytes));
    tensors_.push_back(std::move(t));
  }
  // A source tensor as it is.
  void pass_through(const TensorInfo& t) { tensors_.push_back(t); }
  // Indexes the tensors by name: after the last add_converted / pass_through.
  void index() {
    for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
  }

  std::unique_ptr<WeightSource> inner_;

 private:
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
};

}  // namespace pagellm::io_detail
