// Feeds arbitrary FP8 checkpoints to the FP8 reader (io/fp8_weights.h): the first byte picks the
// config's block size (none: per tensor or per row; 128 x 128; 32 x 32; 7 x 64), the rest is a
// safetensors file. Whatever the reader accepts must be safe to read: every F8B32 tensor it makes
// is dequantized in full (and no value may be NaN: the reader refuses NaN codes and scales that
// are not finite and positive), so ASan catches a bound it failed to check and UBSan an index out
// of range.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "header_source.h"
#include "io/fp8_weights.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  pagellm::QuantConfig q;
  q.method = pagellm::QuantMethod::kFp8;
  q.bits = 8;
  const std::vector<int64_t> kBlocks[] = {{}, {128, 128}, {32, 32}, {7, 64}};
  q.fp8_block = kBlocks[data[0] & 3];
  auto h = pagellm::parse_safetensors(data + 1, static_cast<int64_t>(size - 1), "fuzz.safetensors");
  if (!h.ok()) return 0;
  auto w = pagellm::fp8_block_weights(
      std::make_unique<pagellm::fuzz::HeaderSource>(std::move(h->tensors)), q);
  if (!w.ok()) return 0;
  for (const pagellm::TensorInfo& t : (*w)->tensors()) {
    if (t.dtype != pagellm::DType::kF8B32) continue;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> v(n);
    pagellm::to_f32(t.dtype, t.data, v.data(), n);
    for (float x : v)
      if (std::isnan(x)) std::abort();  // a NaN code or a bad scale got through
  }
  return 0;
}
