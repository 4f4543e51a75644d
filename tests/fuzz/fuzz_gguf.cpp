// libFuzzer target for the GGUF reader: parse arbitrary bytes; whatever parses must survive every
// metadata getter, the ModelConfig builder and the weight source, touching every tensor byte range
// so ASan sees any extent that validation let through.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "io/gguf.h"

using namespace pagellm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = GgufFile::parse(data, static_cast<int64_t>(size), "fuzz.gguf");
  if (!parsed.ok()) return 0;
  auto file = std::make_shared<const GgufFile>(std::move(parsed).value());
  for (const GgufKv& kv : file->metadata()) {
    (void)file->value_to_string(kv, 4);
    (void)file->get_string(kv.key);
    (void)file->get_u32(kv.key);
    (void)file->get_i64(kv.key);
    (void)file->get_f32(kv.key);
    (void)file->get_bool(kv.key);
    (void)file->get_string_array(kv.key);
    (void)file->get_i32_array(kv.key);
    (void)file->get_f32_array(kv.key);
  }
  volatile uint8_t sink = 0;
  for (const GgufTensor& t : file->tensors()) {
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
  }
  auto cfg = gguf_model_config(*file);
  GgufWeightOptions opts;
  if (cfg.ok()) {
    opts.unpermute_qk = cfg->model_type == "llama";
    opts.n_head = cfg->num_attention_heads;
    opts.n_head_kv = cfg->num_key_value_heads;
  } else {
    opts = {true, 2, 1};  // still exercise the un-permutation on whatever q/k tensors exist
  }
  auto ws = GgufWeightSource::create(file, opts);
  if (ws.ok()) {
    for (const TensorInfo& t : (*ws)->tensors()) {
      if (t.nbytes > 0) {
        const auto* p = static_cast<const uint8_t*>(t.data);
        sink = sink + p[0] + p[t.nbytes - 1];
      }
      (void)(*ws)->get(t.name);
    }
  }
  return 0;
}
