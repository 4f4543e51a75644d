#include "io/quantize.h"

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

}  // namespace

Status quantize_checkpoint(const std::string& model_dir, const std::string& out_dir,
                           const QuantizeOptions& o, std::string* summary) {
  if (o.format != "awq")
    return unimplemented("quantize: --format " + o.format + " is not written yet (awq is)");
  if (o.group_size != 32 && o.group_size != 64 && o.group_size != 128)
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
    if (!is_quantized_projection(t.name, t.shape.size()) || n % 8 != 0 || k % o.group_size != 0) {
      out.push_back({t.name, t.dtype, t.shape, [&t](char* dst) {
                       std::memcpy(dst, t.data, t.nbytes);
                       return Status::ok_status();
                     }});
      ++kept;
      continue;
    }
    // The three packed tensors of one weight are made together, on the first one's turn (the
    // writer fills tensors in order; the last one frees them).
    auto packs = std::make_shared<AwqTensors>();
    const std::string prefix = t.name.substr(0, t.name.size() - 7);
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
  config["quantization_config"] = {
      {"quant_method", "awq"}, {"bits", 4},         {"group_size", o.group_size},
      {"zero_point", true},    {"version", "gemm"}, {"modules_to_not_convert", nullptr}};
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
    *summary = std::to_string(packed) + " weights packed (AWQ, 4-bit, group " +
               std::to_string(o.group_size) + "), " + std::to_string(kept) +
               " tensors kept as they were, in " + out_dir;
  return Status::ok_status();
}

}  // namespace pagellm
