#include "model/scratch.h"

namespace pagellm {

std::unique_ptr<Buffer> allocate_scratch(Backend& backend, int64_t rows,
                                         std::initializer_list<ScratchSlot> slots) {
  auto aligned = [&](const ScratchSlot& s) { return (dtype_bytes(s.dtype, rows * s.cols) + 63) / 64 * 64; };
  int64_t total = 0;
  for (const ScratchSlot& s : slots) total += aligned(s);
  auto buf = backend.must_allocate(total, "a step's scratch");
  char* p = static_cast<char*>(buf->data());
  for (const ScratchSlot& s : slots) {
    *s.out = Tensor(p, s.dtype, {rows, s.cols}, backend.device());
    p += aligned(s);
  }
  return buf;
}

ProjViews proj_views(const Tensor& scratch, int64_t n, std::initializer_list<int64_t> widths,
                     bool fused) {
  ProjViews p;
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  PAGELLM_CHECK(widths.size() <= p.part.size() && scratch.cols() == total && n <= scratch.rows());
  p.all = scratch.slice_rows(0, n);
  int64_t off = 0, i = 0;
  for (int64_t w : widths) {
    p.part[i++] =
        fused ? p.all.slice_cols(off, off + w)
              : Tensor(static_cast<char*>(scratch.data) + dtype_bytes(scratch.dtype, n * off),
                       scratch.dtype, {n, w}, scratch.device);
    off += w;
  }
  return p;
}

}  // namespace pagellm
