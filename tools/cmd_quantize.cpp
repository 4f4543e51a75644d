// pagellm quantize: a float Hugging Face checkpoint to an AWQ or FP8 one (io/quantize.h).
#include <cstdio>

#include "io/quantize.h"
#include "tools/args.h"

namespace pagellm::cli {

int run_quantize(int argc, char** argv) {
  Args args(
      "quantize",
      "A float Hugging Face checkpoint to a quantized one that pagellm, vLLM and transformers\n"
      "load. Every decoder projection is rounded (to nearest; awq with zero points);\n"
      "embeddings, norms, the LM head and MoE routers stay as they are.\n"
      "  pagellm quantize --model DIR --out DIR [--format awq|fp8|fp8-block]",
      {{"Input and output",
        {{"model", "DIR", "a Hugging Face model folder with float weights (f32, f16 or bf16)"},
         {"out", "DIR", "the folder to write (model.safetensors, config.json, tokenizer files)"},
         {"format", "awq|fp8|fp8-block",
          "awq: 4-bit, AWQ's GEMM packing; fp8: e4m3, one scale per output row "
          "(compressed-tensors); fp8-block: e4m3, one scale per 128 x 128 block "
          "(DeepSeek-V3's layout)",
          "awq"},
         {"group-size", "N", "awq: inputs sharing a scale and zero point: 32, 64 or 128",
          "128"}}}});
  if (auto rc = parse_command_line(args, argc, argv)) return *rc;
  Status st;
  QuantizeOptions o;
  o.format = args.str("format");
  Result<int64_t> g = args.get_int("group-size");
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
