// Step scratch for the architecture files: [rows, cols] activation tensors of any dtype carved,
// 64-byte aligned, out of one backend allocation. The size is computed from the same list that is
// carved, so a tensor can never run past the buffer (e.g. an f32 slot among bf16 ones).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>

#include "backend/backend.h"

namespace pagellm {

struct ScratchSlot {
  Tensor* out;  // receives the view [rows, cols]
  DType dtype;
  int64_t cols;
};

std::unique_ptr<Buffer> allocate_scratch(Backend& backend, int64_t rows,
                                         std::initializer_list<ScratchSlot> slots);

}  // namespace pagellm
