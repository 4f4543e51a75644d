// Feeds arbitrary bytes to the safetensors parser as a whole file. Whatever it accepts must be
// safe to read: every accepted tensor's bytes are touched, so ASan catches a bound the parser
// failed to check.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pagellm::Result<pagellm::SafetensorsHeader> h =
      pagellm::parse_safetensors(data, static_cast<int64_t>(size), "fuzz.safetensors");
  if (!h.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const pagellm::TensorInfo& t : h->tensors) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    if (t.nbytes > 0) sink = sink ^ p[0] ^ p[t.nbytes - 1];
  }
  (void)sink;
  return 0;
}
