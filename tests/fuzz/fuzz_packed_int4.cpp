// Feeds arbitrary packed 4-bit checkpoints to the unpacker (io/packed_int4.h): the first two bytes
// pick the packing (AWQ, GPTQ or compressed-tensors), the group size (32, 64, 128 or -1) and the
// zero-point flags; the rest is a safetensors file. Whatever the unpacker accepts must be safe to
// read: every unpacked tensor's bytes are touched and dequantized (act-order's f32 weights too),
// so ASan catches a bound it failed to check, and UBSan a shift or index out of range.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "io/packed_int4.h"
#include "io/safetensors.h"
#include "header_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  pagellm::QuantConfig q;
  q.method = static_cast<pagellm::QuantMethod>(data[0] % 3);
  constexpr int64_t kGroups[] = {32, 64, 128, -1};
  q.group_size = kGroups[data[1] & 3];
  q.zero_point = (data[1] & 4) != 0;
  q.gptq_zeros_minus_one = (data[1] & 8) != 0;
  auto h = pagellm::parse_safetensors(data + 2, static_cast<int64_t>(size - 2), "fuzz.safetensors");
  if (!h.ok()) return 0;
  auto w = pagellm::unpack_int4_weights(std::make_unique<pagellm::fuzz::HeaderSource>(std::move(h->tensors)), q);
  if (!w.ok()) return 0;
  volatile float sink = 0;
  for (const pagellm::TensorInfo& t : (*w)->tensors()) {
    // I4G blocks, and the f32 weights GPTQ act-order gives (their every value touched).
    if (!pagellm::is_group_int4(t.dtype) && t.dtype != pagellm::DType::kF32) continue;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> v(n);
    pagellm::to_f32(t.dtype, t.data, v.data(), n);
    if (n > 0) sink = sink + v[0] + v[n - 1];
  }
  (void)sink;
  return 0;
}
