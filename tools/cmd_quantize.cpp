// pagellm quantize: a float Hugging Face checkpoint to an AWQ or FP8 one (io/quantize.h).
#include <cstdio>

#include "io/quantize.h"
#include "tools/args.h"

namespace pagellm::cli {

int run_quantize(int argc, char** argv) {
  Args args("quantize", {"model", "out", "format", "group-size", "help!"});
  Status st = args.parse(argc, argv);
  if (st.ok() && args.flag("help")) {
    std::printf(
        "usage: pagellm quantize --model DIR --out DIR [--format awq|fp8|fp8-block]\n"
        "                        [--group-size 128]\n"
        "  --model       a Hugging Face model folder with float weights (f32, f16 or bf16)\n"
        "  --out         the folder to write (model.safetensors, config.json, tokenizer files)\n"
        "  --format      awq (default): 4-bit, AWQ's GEMM packing (pagellm, vLLM, transformers)\n"
        "                fp8: e4m3, one scale per output row (compressed-tensors, vLLM, SGLang)\n"
        "                fp8-block: e4m3, one scale per 128 x 128 block (DeepSeek-V3's layout)\n"
        "  --group-size  awq: inputs sharing a scale and zero point: 32, 64 or 128 (default 128)\n"
        "Every decoder projection is rounded (to nearest; awq with zero points); embeddings,\n"
        "norms, the LM head and MoE routers stay as they are.\n");
    return 0;
  }
  QuantizeOptions o;
  o.format = args.get_or("format", "awq");
  Result<int64_t> g = args.get_int("group-size", 128);
  if (st.ok() && !g.ok()) st = g.status();
  if (st.ok() && (!args.has("model") || !args.has("out")))
    st = invalid_argument("quantize: expected --model DIR and --out DIR");
  std::string summary;
  if (st.ok()) {
    o.group_size = static_cast<int>(*g);
    st = quantize_checkpoint(*args.get("model"), *args.get("out"), o, &summary);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "pagellm: %s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("%s\n", summary.c_str());
  return 0;
}

}  // namespace pagellm::cli
