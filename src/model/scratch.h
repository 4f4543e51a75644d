// Step scratch for the architecture files: [rows, cols] activation tensors of any dtype carved,
// 64-byte aligned, out of one backend allocation. The size is computed from the same list that is
// carved, so a tensor can never run past the buffer (e.g. an f32 slot among bf16 ones).
#pragma once

#include <array>
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

// A step's outputs of a projection with up to three parts of the given widths (q|k|v, gate|up).
// Fused: one GEMM writes [n, sum of widths] and the parts are column slices of it. Separate: each
// part is its own contiguous [n, width] block carved from the same scratch (the CPU backend's
// ops, and Qwen3's per-head RMSNorm, want contiguous rows). scratch: [rows >= n, sum of widths].
struct ProjViews {
  Tensor all;
  std::array<Tensor, 3> part;
};
ProjViews proj_views(const Tensor& scratch, int64_t n, std::initializer_list<int64_t> widths,
                     bool fused);

}  // namespace pagellm
