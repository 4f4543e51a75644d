#include "io/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/file_util.h"
#include "io/packed_int4.h"
#include "io/quant_config.h"
#include "io/safetensors_writer.h"
#include "io/weights.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFp8Block = 128;

// One weight [n, k] as FP8: its codes and scales (per row: [n, 1]; per block: [ceil(n / 128),
// ceil(k / 128)]), each scale the largest magnitude it covers over 448 (1 where all are 0).
struct Fp8Tensors {
  std::vector<uint8_t> q;
  std::vector<float> scales;
};
Fp8Tensors quantize_fp8(const float* w, int64_t n, int64_t k, bool blocks) {
  Fp8Tensors t;
  const int64_t b0 = blocks ? kFp8Block : 1, b1 = blocks ? kFp8Block : k;
  const int64_t rows = (n + b0 - 1) / b0, cols = (k + b1 - 1) / b1;
  t.scales.assign(rows * cols, 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      float& s = t.scales[(r / b0) * cols + c / b1];
      s = std::max(s, std::fabs(w[r * k + c]));
    }
  for (float& s : t.scales) s = s > 0.0f ? s / 448.0f : 1.0f;
  t.q.resize(n * k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      t.q[r * k + c] = f32_to_e4m3(w[r * k + c] / t.scales[(r / b0) * cols + c / b1]);
  return t;
}

// The quantization_config each format's writers put in config.json.
nlohmann::ordered_json quantization_config(const QuantizeOptions& o) {
  if (o.format == "fp8-block")
    return {{"quant_method", "fp8"},
            {"fmt", "e4m3"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {kFp8Block, kFp8Block}}};
  if (o.format == "fp8") {
    nlohmann::ordered_json weights = {{"num_bits", 8},          {"type", "float"},
                                      {"symmetric", true},      {"strategy", "channel"},
                                      {"dynamic", false}};
    nlohmann::ordered_json inputs = {{"num_bits", 8},     {"type", "float"}, {"symmetric", true},
                                     {"strategy", "token"}, {"dynamic", true}};
    return {{"quant_method", "compressed-tensors"},
            {"format", "float-quantized"},
            {"quantization_status", "compressed"},
            {"config_groups",
             {{"group_0",
               {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", inputs}}}}},
            {"ignore", {"lm_head"}}};
  }
  return {{"quant_method", "awq"}, {"bits", 4},         {"group_size", o.group_size},
          {"zero_point", true},    {"version", "gemm"}, {"modules_to_not_convert", nullptr}};
}

}  // namespace

Status quantize_checkpoint(const std::string& model_dir, const std::string& out_dir,
                           const QuantizeOptions& o, std::string* summary) {
  const bool fp8 = o.format == "fp8" || o.format == "fp8-block";
  if (o.format != "awq" && !fp8)
    return invalid_argument("quantize: --format must be awq, fp8 or fp8-block, got '" + o.format +
                            "'");
  if (!fp8 && o.group_size != 32 && o.group_size != 64 && o.group_size != 128)
    return invalid_argument("quantize: --group-size must be 32, 64 or 128, got " +
                            std::to_string(o.group_size));
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    return invalid_argument("quantize: " + model_dir +
                            " is not a Hugging Face model folder (config.json + *.safetensors)");
  PAGELLM_ASSIGN_OR_RETURN(LoadedCheckpoint src, open_safetensors_checkpoint(model_dir));
  if (src.config.quantization)
    return invalid_argument("quantize: " + model_dir + " is quantized already (" +
                            quant_method_name(src.config.quantization->method) + ")");
  if (fs::equivalent(model_dir, out_dir, ec))
    return invalid_argument("quantize: the output folder must differ from the model folder");
  fs::create_directories(out_dir, ec);
  if (ec) return invalid_argument("quantize: cannot create " + out_dir + ": " + ec.message());

  const WeightSource& w = *src.weights;
  std::vector<TensorToWrite> out;
  int64_t packed = 0, kept = 0;
  for (const TensorInfo& t : w.tensors()) {
    if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16 &&
        t.dtype != DType::kI32 && t.dtype != DType::kI64)
      return invalid_argument("quantize: " + t.file + ": tensor '" + t.name + "' is " +
                              std::string(dtype_name(t.dtype)) + ", not a float type");
    const int64_t n = t.shape.empty() ? 1 : t.shape[0];
    const int64_t k = t.shape.size() == 2 ? t.shape[1] : 0;
    const bool fits = fp8 ? k % 32 == 0 : n % 8 == 0 && k % o.group_size == 0;
    if (!is_quantized_projection(t.name, t.shape.size()) || !fits) {
      out.push_back({t.name, t.dtype, t.shape, [&t](char* dst) {
                       std::memcpy(dst, t.data, t.nbytes);
                       return Status::ok_status();
                     }});
      ++kept;
      continue;
    }
    const std::string prefix = t.name.substr(0, t.name.size() - 7);
    if (fp8) {
      // The codes and the scales are made together, on the codes' turn (the writer fills
      // tensors in order); the scales' turn frees them.
      auto made = std::make_shared<Fp8Tensors>();
      const bool blocks = o.format == "fp8-block";
      out.push_back({t.name, DType::kF8E4M3, {n, k}, [&t, made, n, k, blocks](char* dst) {
                       std::vector<float> f(n * k);
                       to_f32(t.dtype, t.data, f.data(), n * k);
                       *made = quantize_fp8(f.data(), n, k, blocks);
                       std::memcpy(dst, made->q.data(), made->q.size());
                       return Status::ok_status();
                     }});
      const std::vector<int64_t> scale_shape =
          blocks ? std::vector<int64_t>{(n + kFp8Block - 1) / kFp8Block,
                                        (k + kFp8Block - 1) / kFp8Block}
                 : std::vector<int64_t>{n, 1};
      out.push_back({prefix + (blocks ? ".weight_scale_inv" : ".weight_scale"), DType::kF32,
                     scale_shape, [made](char* dst) {
                       std::memcpy(dst, made->scales.data(), made->scales.size() * 4);
                       *made = Fp8Tensors();
                       return Status::ok_status();
                     }});
      ++packed;
      continue;
    }
    // The three packed tensors of one weight are made together, on the first one's turn (the
    // writer fills tensors in order; the last one frees them).
    auto packs = std::make_shared<AwqTensors>();
    const int g = o.group_size;
    auto make = [&t, packs, n, k, g]() {
      if (!packs->qweight.empty()) return;
      std::vector<float> f(n * k);
      to_f32(t.dtype, t.data, f.data(), n * k);
      *packs = pack_awq(f.data(), n, k, g);
    };
    out.push_back({prefix + ".qweight", DType::kI32, {k, n / 8}, [make, packs](char* dst) {
                     make();
                     std::memcpy(dst, packs->qweight.data(), packs->qweight.size() * 4);
                     return Status::ok_status();
                   }});
    out.push_back({prefix + ".qzeros", DType::kI32, {k / g, n / 8}, [make, packs](char* dst) {
                     make();
                     std::memcpy(dst, packs->qzeros.data(), packs->qzeros.size() * 4);
                     return Status::ok_status();
                   }});
    out.push_back({prefix + ".scales", DType::kF16, {k / g, n}, [make, packs](char* dst) {
                     make();
                     std::memcpy(dst, packs->scales.data(), packs->scales.size() * 2);
                     *packs = AwqTensors();  // done with this weight
                     return Status::ok_status();
                   }});
    ++packed;
  }
  PAGELLM_RETURN_IF_ERROR(
      write_safetensors(io_detail::join_path(out_dir, "model.safetensors"), out));

  // config.json with the quantization_config AWQ's writers put there.
  PAGELLM_ASSIGN_OR_RETURN(
      std::string text, io_detail::read_text_file(io_detail::join_path(model_dir, "config.json")));
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(text, nullptr, false);
  if (config.is_discarded() || !config.is_object())
    return invalid_argument("quantize: " + model_dir + "/config.json is not a JSON object");
  config["quantization_config"] = quantization_config(o);
  {
    const std::string path = io_detail::join_path(out_dir, "config.json");
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return invalid_argument("quantize: cannot write " + path);
    const std::string s = config.dump(2) + "\n";
    const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
    if (std::fclose(f) != 0 || !ok) return data_loss("quantize: cannot write " + path);
  }
  // Everything else (tokenizer, generation config, chat template, README) as it is.
  for (const fs::directory_entry& e : fs::directory_iterator(model_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name == "model.safetensors.index.json" ||
        e.path().extension() == ".safetensors")
      continue;
    fs::copy_file(e.path(), fs::path(out_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return data_loss("quantize: cannot copy " + e.path().string() + ": " + ec.message());
  }
  if (summary)
    *summary = std::to_string(packed) + " weights packed (" +
               (fp8 ? o.format + ", e4m3"
                    : "AWQ, 4-bit, group " + std::to_string(o.group_size)) +
               "), " + std::to_string(kept) + " tensors kept as they were, in " + out_dir;
  return Status::ok_status();
}

}  // namespace pagellm
