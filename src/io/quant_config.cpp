// quantization_config -> QuantConfig. The three writers name the same facts differently:
//   AWQ (AutoAWQ / transformers):  {"quant_method": "awq", "bits": 4, "group_size": 128,
//                                   "zero_point": true, "version": "gemm",
//                                   "modules_to_not_convert": [...]}
//   GPTQ (AutoGPTQ / GPTQModel):   {"quant_method": "gptq", "bits": 4, "group_size": 128,
//                                   "sym": true, "desc_act": false, "checkpoint_format": "gptq"}
//   compressed-tensors:            {"quant_method": "compressed-tensors", "format":
//   "pack-quantized",
//                                   "config_groups": {"group_0": {"targets": ["Linear"],
//                                     "weights": {"num_bits": 4, "type": "int", "symmetric": true,
//                                                 "strategy": "group", "group_size": 128},
//                                     "input_activations": null}}, "ignore": ["lm_head"]}
//   FP8 (DeepSeek-V3, transformers' fine-grained FP8, FBGEMM-style per channel):
//                                  {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
//                                   "dynamic", "weight_block_size": [128, 128]}
//   compressed-tensors FP8:        "format": "float-quantized", weights {"num_bits": 8, "type":
//                                   "float", "strategy": "tensor" | "channel" | "block",
//                                   "block_structure": [128, 128]}, input_activations dynamic or
//                                   static
#include "io/quant_config.h"

#include "io/json_fields.h"

namespace pagellm {
namespace {

using io_detail::Fields;
using io_detail::json;

Status unsupported(const Fields& f, const std::string& key, const std::string& what) {
  return f.error(StatusCode::kUnimplemented, key, what);
}

Status check_bits_and_group(const Fields& r, const char* bits_key, int64_t bits, int64_t group) {
  if (bits != 4)
    return unsupported(
        r, bits_key,
        "is " + std::to_string(bits) + ": only 4-bit weights are supported in this format");
  if (group != -1 && (group <= 0 || group % 32 != 0))
    return unsupported(
        r, "group_size",
        "is " + std::to_string(group) + ": groups must be -1 or a positive multiple of 32");
  return Status::ok_status();
}

Status parse_awq(const Fields& r, QuantConfig& q) {
  q.method = QuantMethod::kAwq;
  int64_t bits = 4;
  PAGELLM_RETURN_IF_ERROR(r.read_int("bits", bits));
  if (!r.get("bits")) PAGELLM_RETURN_IF_ERROR(r.read_int("w_bit", bits));  // AutoAWQ's own name
  PAGELLM_RETURN_IF_ERROR(r.read_int("group_size", q.group_size));
  if (!r.get("group_size")) PAGELLM_RETURN_IF_ERROR(r.read_int("q_group_size", q.group_size));
  PAGELLM_RETURN_IF_ERROR(check_bits_and_group(r, "bits", bits, q.group_size));
  PAGELLM_RETURN_IF_ERROR(r.read_bool("zero_point", q.zero_point));
  if (!q.zero_point)
    return unsupported(r, "zero_point", "is false: AWQ without zero points is not supported");
  std::string version = "gemm";
  PAGELLM_RETURN_IF_ERROR(r.read_string("version", version));
  for (char& c : version) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (version != "gemm")
    return unsupported(r, "version",
                       "is '" + version +
                           "': only AWQ's GEMM packing is supported (not gemv, "
                           "marlin, exllama or ipex)");
  return r.read_strings("modules_to_not_convert", q.unquantized_modules);
}

Status parse_gptq(const Fields& r, QuantConfig& q) {
  q.method = QuantMethod::kGptq;
  int64_t bits = 4;
  PAGELLM_RETURN_IF_ERROR(r.read_int("bits", bits));
  PAGELLM_RETURN_IF_ERROR(r.read_int("group_size", q.group_size));
  PAGELLM_RETURN_IF_ERROR(check_bits_and_group(r, "bits", bits, q.group_size));
  bool sym = true;
  PAGELLM_RETURN_IF_ERROR(r.read_bool("sym", sym));
  q.zero_point = !sym;
  PAGELLM_RETURN_IF_ERROR(r.read_bool("desc_act", q.desc_act));
  std::string format = "gptq";
  PAGELLM_RETURN_IF_ERROR(r.read_string("checkpoint_format", format));
  if (format == "gptq_v2") {
    q.gptq_zeros_minus_one = false;
  } else if (format != "gptq") {
    return unsupported(r, "checkpoint_format",
                       "is '" + format + "': only 'gptq' and 'gptq_v2' are supported");
  }
  return r.read_strings("modules_to_not_convert", q.unquantized_modules);
}

// An FP8 weight block size: two positive ints, the columns a multiple of 32 (the loader keeps
// 32-value blocks, each of one scale).
Status read_fp8_block(const Fields& r, const std::string& key, QuantConfig& q) {
  const json* b = r.get(key);
  if (!b || b->is_null()) return Status::ok_status();
  if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
      !(*b)[1].is_number_integer() || (*b)[0].get<int64_t>() <= 0 || (*b)[1].get<int64_t>() <= 0)
    return r.error(StatusCode::kInvalidArgument, key, "must be two positive integers [rows, columns]");
  q.fp8_block = {(*b)[0].get<int64_t>(), (*b)[1].get<int64_t>()};
  if (q.fp8_block[1] % 32 != 0)
    return unsupported(r, key, "has " + std::to_string(q.fp8_block[1]) +
                                   " columns: FP8 blocks must be a multiple of 32 columns wide");
  return Status::ok_status();
}

Status parse_fp8(const Fields& r, QuantConfig& q) {
  q.method = QuantMethod::kFp8;
  q.bits = 8;
  q.zero_point = false;
  std::string fmt = "e4m3", scheme = "dynamic";
  PAGELLM_RETURN_IF_ERROR(r.read_string("fmt", fmt));
  if (fmt != "e4m3")
    return unsupported(r, "fmt", "is '" + fmt + "': only e4m3 FP8 weights are supported");
  PAGELLM_RETURN_IF_ERROR(r.read_string("activation_scheme", scheme));
  if (scheme != "dynamic" && scheme != "static")
    return unsupported(r, "activation_scheme", "is '" + scheme + "': dynamic or static");
  q.fp8_static_activations = scheme == "static";
  PAGELLM_RETURN_IF_ERROR(read_fp8_block(r, "weight_block_size", q));
  PAGELLM_RETURN_IF_ERROR(r.read_strings("modules_to_not_convert", q.unquantized_modules));
  if (q.unquantized_modules.empty())
    PAGELLM_RETURN_IF_ERROR(r.read_strings("ignored_layers", q.unquantized_modules));
  return Status::ok_status();
}

// compressed-tensors' float-quantized FP8 scheme (`s`: its config group).
Status parse_compressed_fp8(const Fields& r, const Fields& s, const Fields& wr, QuantConfig& q) {
  q.method = QuantMethod::kFp8;
  q.bits = 8;
  q.zero_point = false;
  int64_t bits = 0;
  std::string type, strategy;
  PAGELLM_RETURN_IF_ERROR(wr.read_int("num_bits", bits));
  PAGELLM_RETURN_IF_ERROR(wr.read_string("type", type));
  if (bits != 8 || type != "float")
    return unsupported(wr, "type", "must be 8-bit float in a float-quantized scheme");
  PAGELLM_RETURN_IF_ERROR(wr.read_string("strategy", strategy));
  if (strategy == "block") {
    PAGELLM_RETURN_IF_ERROR(read_fp8_block(wr, "block_structure", q));
    if (q.fp8_block.empty()) return wr.missing("block_structure");
  } else if (strategy != "tensor" && strategy != "channel") {
    return unsupported(wr, "strategy",
                       "is '" + strategy + "': FP8 weights per tensor, channel or block");
  }
  if (const json* in = s.get("input_activations"); in && in->is_object()) {
    const Fields ir(*in, s.path(), s.name("input_activations."));
    bool dynamic = true;
    PAGELLM_RETURN_IF_ERROR(ir.read_bool("dynamic", dynamic));
    q.fp8_static_activations = !dynamic;
  }
  return r.read_strings("ignore", q.unquantized_modules);
}

Status parse_compressed_tensors(const Fields& r, QuantConfig& q) {
  q.method = QuantMethod::kCompressedTensors;
  std::string format;
  PAGELLM_RETURN_IF_ERROR(r.read_string("format", format));
  if (format != "pack-quantized" && format != "float-quantized")
    return unsupported(r, "format",
                       "is '" + format +
                           "': of compressed-tensors, 'pack-quantized' (W4A16) and "
                           "'float-quantized' (FP8) are supported");
  const json* groups = r.get("config_groups");
  if (!groups || !groups->is_object() || groups->empty())
    return r.error(StatusCode::kInvalidArgument, "config_groups",
                   "must be an object with one scheme");
  if (groups->size() != 1)
    return unsupported(r, "config_groups",
                       "has " + std::to_string(groups->size()) +
                           " schemes: only one scheme for every layer is "
                           "supported");
  const std::string name = groups->begin().key();
  const json& scheme = groups->begin().value();
  if (!scheme.is_object())
    return r.error(StatusCode::kInvalidArgument, "config_groups." + name, "must be an object");
  const Fields s(scheme, r.path(), r.name("config_groups." + name + "."));
  if (format == "float-quantized") {
    const json* w = s.get("weights");
    if (!w || !w->is_object())
      return s.error(StatusCode::kInvalidArgument, "weights", "must be an object");
    return parse_compressed_fp8(r, s, Fields(*w, s.path(), s.name("weights.")), q);
  }
  if (s.get("input_activations") || s.get("output_activations"))
    return unsupported(s, "input_activations",
                       "is set: only weight-only (W4A16) schemes are supported");
  std::vector<std::string> targets;
  PAGELLM_RETURN_IF_ERROR(s.read_strings("targets", targets));
  if (targets != std::vector<std::string>{"Linear"})
    return unsupported(s, "targets", "must be [\"Linear\"]");
  const json* w = s.get("weights");
  if (!w || !w->is_object())
    return s.error(StatusCode::kInvalidArgument, "weights", "must be an object");
  const Fields wr(*w, s.path(), s.name("weights."));
  int64_t bits = 0;
  PAGELLM_RETURN_IF_ERROR(wr.read_int("num_bits", bits));
  std::string type = "int", strategy;
  PAGELLM_RETURN_IF_ERROR(wr.read_string("type", type));
  if (type != "int")
    return unsupported(wr, "type", "is '" + type + "': only int weights are supported here");
  PAGELLM_RETURN_IF_ERROR(wr.read_string("strategy", strategy));
  if (strategy == "group") {
    q.group_size = 0;
    PAGELLM_RETURN_IF_ERROR(wr.read_int("group_size", q.group_size));
  } else if (strategy == "channel") {
    q.group_size = -1;
  } else {
    return unsupported(wr, "strategy",
                       "is '" + strategy + "': only 'group' and 'channel' are supported");
  }
  PAGELLM_RETURN_IF_ERROR(check_bits_and_group(wr, "num_bits", bits, q.group_size));
  bool symmetric = true, dynamic = false;
  PAGELLM_RETURN_IF_ERROR(wr.read_bool("symmetric", symmetric));
  PAGELLM_RETURN_IF_ERROR(wr.read_bool("dynamic", dynamic));
  if (dynamic) return unsupported(wr, "dynamic", "is true: weights must have stored scales");
  if (wr.get("actorder"))
    return unsupported(wr, "actorder", "is set: activation ordering is not supported yet");
  q.zero_point = !symmetric;
  return r.read_strings("ignore", q.unquantized_modules);
}

}  // namespace

bool is_quantized_projection(const std::string& n, size_t ndim) {
  auto has = [&](const char* part) { return n.find(part) != std::string::npos; };
  return ndim == 2 && has("layers.") && n.size() > 7 &&
         n.compare(n.size() - 7, 7, ".weight") == 0 && !has("norm") && !has("mlp.gate.weight") &&
         !has("block_sparse_moe.gate.weight");
}

const char* quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::kAwq:
      return "awq";
    case QuantMethod::kGptq:
      return "gptq";
    case QuantMethod::kCompressedTensors:
      return "compressed-tensors";
    case QuantMethod::kFp8:
      return "fp8";
  }
  return "?";
}

Result<QuantConfig> parse_quant_config(const std::string& json_text, const std::string& path) {
  const json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return invalid_argument(path + ": field 'quantization_config' must be an object");
  return parse_quant_config(Fields(root, path, "quantization_config."));
}

Result<QuantConfig> parse_quant_config(const io_detail::Fields& r) {
  std::string method;
  PAGELLM_RETURN_IF_ERROR(r.read_string("quant_method", method));
  QuantConfig q;
  if (method == "awq") {
    PAGELLM_RETURN_IF_ERROR(parse_awq(r, q));
  } else if (method == "gptq") {
    PAGELLM_RETURN_IF_ERROR(parse_gptq(r, q));
  } else if (method == "compressed-tensors") {
    PAGELLM_RETURN_IF_ERROR(parse_compressed_tensors(r, q));
  } else if (method == "fp8") {
    PAGELLM_RETURN_IF_ERROR(parse_fp8(r, q));
  } else if (method.empty()) {
    return r.missing("quant_method");
  } else {
    return unsupported(r, "quant_method",
                       "is '" + method +
                           "': supported are awq, gptq, fp8 and compressed-tensors "
                           "(pack-quantized, float-quantized)");
  }
  // desc_act is read, not refused: the loader refuses act-order only where a tensor's g_idx
  // really permutes the rows (writers set the flag on checkpoints in the plain order too).
  return q;
}

}  // namespace pagellm
