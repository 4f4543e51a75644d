// Writing a safetensors file (the format safetensors.h reads): the header is built from the
// tensors' names, dtypes and shapes before any data is made, so each tensor's bytes are produced
// and written one at a time (a quantized 8B model never sits in memory whole). The file appears
// under its name only once complete (written beside it, then renamed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace pagellm {

struct TensorToWrite {
  std::string name;
  DType dtype;  // f32, f16, bf16, i32, i64 or f8_e4m3
  std::vector<int64_t> shape;
  // Fills the tensor's dtype_bytes(dtype, numel) bytes at dst.
  std::function<Status(char* dst)> fill;
};

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace pagellm
