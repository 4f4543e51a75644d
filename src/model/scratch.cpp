#include "model/scratch.h"

namespace pagellm {

std::unique_ptr<Buffer> allocate_scratch(Backend& backend, int64_t rows,
                                         std::initializer_list<ScratchSlot> slots) {
  auto aligned = [&](const ScratchSlot& s) { return (dtype_bytes(s.dtype, rows * s.cols) + 63) / 64 * 64; };
  int64_t total = 0;
  for (const ScratchSlot& s : slots) total += aligned(s);
  auto buf = backend.allocate(total);
  PAGELLM_CHECK_MSG(buf != nullptr, "out of memory for step scratch");
  char* p = static_cast<char*>(buf->data());
  for (const ScratchSlot& s : slots) {
    *s.out = Tensor(p, s.dtype, {rows, s.cols}, backend.device());
    p += aligned(s);
  }
  return buf;
}

}  // namespace pagellm
