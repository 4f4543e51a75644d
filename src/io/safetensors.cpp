#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/log.h"
#include "io/file_util.h"
#include "io/mapped_file.h"
#include "io/fp8_weights.h"
#include "io/packed_int4.h"

namespace pagellm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kMetadataKey = "__metadata__";

// safetensors dtype names -> ours. F8_E4M3 is read for FP8 checkpoints (io/fp8_weights.h turns
// each such weight and its scale into blocks). Everything else in the format (BOOL, U8, I8, I16,
// U16, U32, U64, F64, F8_E5M2, F6_*, F4) is refused: no model we serve stores weights that way.
std::optional<DType> dtype_from_safetensors(const std::string& s) {
  if (s == "F8_E4M3") return DType::kF8E4M3;
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  return std::nullopt;
}

// A JSON value as a non-negative int64, if it is one (integers only; floats such as 2.0 are not
// valid offsets or dims in the format).
std::optional<int64_t> as_nonneg_int(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

using io_detail::quote_name;

// Byte range [begin, end) of one tensor in the data region, kept while validating overlaps.
struct Span {
  int64_t begin;
  int64_t end;
  size_t index;  // into SafetensorsHeader::tensors
};

Status parse_tensor_entry(const std::string& file, const std::string& name, const json& entry,
                          const uint8_t* data_region, int64_t data_size, TensorInfo& out,
                          Span& span) {
  const std::string where = file + ": tensor " + quote_name(name) + ": ";
  if (!entry.is_object()) return data_loss(where + "entry is not a JSON object");

  auto dt_it = entry.find("dtype");
  if (dt_it == entry.end() || !dt_it->is_string())
    return data_loss(where + "missing string 'dtype'");
  const std::string& dt = dt_it->get_ref<const std::string&>();
  const std::optional<DType> dtype = dtype_from_safetensors(dt);
  if (!dtype) {
    return unimplemented(where + "dtype " + quote_name(dt) +
                         " is not supported (supported: F32, F16, BF16, I32, I64)");
  }

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array())
    return data_loss(where + "missing array 'shape'");
  std::vector<int64_t> shape;
  shape.reserve(shape_it->size());
  int64_t numel = 1;
  bool numel_overflow = false;
  for (const json& d : *shape_it) {
    const std::optional<int64_t> dim = as_nonneg_int(d);
    if (!dim) return data_loss(where + "shape holds a value that is not a non-negative integer");
    shape.push_back(*dim);
    if (__builtin_mul_overflow(numel, *dim, &numel)) numel_overflow = true;
  }
  // A zero dim makes the product 0 whatever overflowed before it.
  if (numel_overflow && std::find(shape.begin(), shape.end(), 0) == shape.end()) {
    return data_loss(where + "shape " + shape_str(shape) + " has too many elements");
  }
  if (numel_overflow) numel = 0;
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(block_bytes(*dtype)), &nbytes)) {
    return data_loss(where + "shape " + shape_str(shape) + " has too many bytes");
  }

  auto off_it = entry.find("data_offsets");
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2) {
    return data_loss(where + "missing 'data_offsets' [begin, end]");
  }
  const std::optional<int64_t> begin = as_nonneg_int((*off_it)[0]);
  const std::optional<int64_t> end = as_nonneg_int((*off_it)[1]);
  if (!begin || !end) return data_loss(where + "data_offsets are not non-negative integers");
  if (*begin > *end) {
    return data_loss(where + "data_offsets [" + std::to_string(*begin) + ", " +
                     std::to_string(*end) + "] are reversed");
  }
  if (*end > data_size) {
    return data_loss(where + "data_offsets [" + std::to_string(*begin) + ", " +
                     std::to_string(*end) + "] run past the data region (" +
                     std::to_string(data_size) + " bytes): file truncated?");
  }
  if (*end - *begin != nbytes) {
    return data_loss(where + "shape " + shape_str(shape) + " x " + dt + " is " +
                     std::to_string(nbytes) + " bytes but data_offsets span " +
                     std::to_string(*end - *begin));
  }

  out.name = name;
  out.dtype = *dtype;
  out.shape = std::move(shape);
  out.data = data_region + *begin;
  out.nbytes = nbytes;
  out.file = file;
  span.begin = *begin;
  span.end = *end;
  return Status::ok_status();
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors(const uint8_t* data, int64_t size,
                                            const std::string& file) {
  if (size < 8) {
    return data_loss(file + ": " + std::to_string(size) +
                     " bytes is too short for a safetensors file");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];  // little-endian
  if (header_len > static_cast<uint64_t>(size - 8)) {
    return data_loss(file + ": header length " + std::to_string(header_len) +
                     " exceeds the file size (" + std::to_string(size) +
                     " bytes): not a safetensors file, or truncated");
  }
  const char* hdr = reinterpret_cast<const char*>(data + 8);
  const int64_t data_offset = 8 + static_cast<int64_t>(header_len);
  const uint8_t* data_region = data + data_offset;
  const int64_t data_size = size - data_offset;

  // Duplicate keys are legal JSON (the last wins) but in a header they mean two tensors of one
  // name: the parse callback sees every top-level key, so they are caught here.
  std::unordered_set<std::string> seen;
  std::optional<std::string> duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen.insert(parsed.get_ref<const std::string&>()).second && !duplicate) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  const json header = json::parse(hdr, hdr + header_len, on_event, /*allow_exceptions=*/false);
  if (header.is_discarded()) return data_loss(file + ": header is not valid JSON");
  if (!header.is_object()) return data_loss(file + ": header is not a JSON object");
  if (duplicate)
    return data_loss(file + ": tensor " + quote_name(*duplicate) +
                     " is listed twice in the header");

  SafetensorsHeader out;
  out.data_offset = data_offset;
  std::vector<Span> spans;
  out.tensors.reserve(header.size());
  spans.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      // Free-form string -> string map (format version, framework); nothing in it changes the math.
      if (!entry.is_object()) return data_loss(file + ": '__metadata__' is not a JSON object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          return data_loss(file + ": '__metadata__' entry " + quote_name(k) + " is not a string");
        }
      }
      continue;
    }
    TensorInfo info;
    Span span{};
    PAGELLM_RETURN_IF_ERROR(
        parse_tensor_entry(file, name, entry, data_region, data_size, info, span));
    span.index = out.tensors.size();
    out.tensors.push_back(std::move(info));
    spans.push_back(span);
  }

  // Overlap check over non-empty tensors in offset order. Gaps are tolerated (some writers align
  // tensors); overlaps would make two weights alias each other's bytes.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Span* prev = nullptr;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (prev && s.begin < prev->end) {
      return data_loss(file + ": tensor " + quote_name(out.tensors[s.index].name) + " (bytes " +
                       std::to_string(s.begin) + ".." + std::to_string(s.end) +
                       ") overlaps tensor " + quote_name(out.tensors[prev->index].name) +
                       " (bytes " + std::to_string(prev->begin) + ".." + std::to_string(prev->end) +
                       ")");
    }
    prev = &s;
  }
  // File order = offset order: deterministic listings for `inspect` and tests.
  std::vector<TensorInfo> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) ordered.push_back(std::move(out.tensors[s.index]));
  out.tensors = std::move(ordered);
  return out;
}

class SafetensorsWeights final : public WeightSource {
 public:
  SafetensorsWeights(std::vector<MappedFile> files, std::vector<TensorInfo> tensors,
                     std::string description)
      : files_(std::move(files)),
        tensors_(std::move(tensors)),
        description_(std::move(description)) {
    by_name_.reserve(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
  }

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const override {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
  }
  std::string description() const override { return description_; }

 private:
  std::vector<MappedFile> files_;  // keeps the mappings the tensors point into alive
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::string description_;
};

Result<std::unique_ptr<WeightSource>> open_safetensors_file(const std::string& path) {
  PAGELLM_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  PAGELLM_ASSIGN_OR_RETURN(SafetensorsHeader h, parse_safetensors(f.data(), f.size(), path));
  std::vector<MappedFile> files;
  files.push_back(std::move(f));  // moving a MappedFile keeps its mapping address
  return std::unique_ptr<WeightSource>(
      std::make_unique<SafetensorsWeights>(std::move(files), std::move(h.tensors), path));
}

namespace {

Result<std::unique_ptr<WeightSource>> open_sharded(const std::string& model_dir) {
  const std::string index_path = io_detail::join_path(model_dir, kIndexFile);
  PAGELLM_ASSIGN_OR_RETURN(std::string text, io_detail::read_text_file(index_path));
  const json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded()) return data_loss(index_path + ": not valid JSON");
  if (!index.is_object()) return data_loss(index_path + ": not a JSON object");
  auto wm_it = index.find("weight_map");
  if (wm_it == index.end() || !wm_it->is_object()) {
    return data_loss(index_path + ": missing object 'weight_map'");
  }
  if (wm_it->empty()) return data_loss(index_path + ": 'weight_map' is empty");

  // shard file name -> tensors the index places in it (std::map: shards open in name order).
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [name, shard] : wm_it->items()) {
    if (!shard.is_string()) {
      return data_loss(index_path + ": tensor " + quote_name(name) + ": shard is not a string");
    }
    const std::string& s = shard.get_ref<const std::string&>();
    // Shards live next to the index; a path would let an index reach outside the model folder.
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos ||
        s.find('\\') != std::string::npos) {
      return data_loss(index_path + ": tensor " + quote_name(name) + ": shard " + quote_name(s) +
                       " is not a plain file name");
    }
    by_shard[s].push_back(name);
  }

  // Pass 1: open and validate every shard. Pass 2 cross-checks them against each other and the
  // index, so a tensor stored twice is reported as such whichever shard comes first.
  std::vector<MappedFile> files;
  std::vector<SafetensorsHeader> headers;
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = io_detail::join_path(model_dir, shard);
    Result<MappedFile> f = MappedFile::open(shard_path);
    if (!f.ok()) {
      if (f.status().code() == StatusCode::kNotFound) {
        return not_found(index_path + ": shard " + quote_name(shard) + " (holding tensor " +
                         quote_name(names.front()) + ") is missing: " + shard_path);
      }
      return f.status();
    }
    PAGELLM_ASSIGN_OR_RETURN(SafetensorsHeader h,
                             parse_safetensors(f->data(), f->size(), shard_path));
    headers.push_back(std::move(h));
    files.push_back(std::move(*f));  // moving a MappedFile keeps its mapping address
  }

  std::unordered_map<std::string, std::string> owner;  // tensor -> shard file holding it
  for (size_t i = 0; i < headers.size(); ++i) {
    for (const TensorInfo& t : headers[i].tensors) {
      auto [it, inserted] = owner.emplace(t.name, t.file);
      if (!inserted)
        return data_loss(t.file + ": tensor " + quote_name(t.name) + " is also in " + it->second);
    }
  }
  std::vector<TensorInfo> tensors;
  tensors.reserve(owner.size());
  size_t shard_i = 0;
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = io_detail::join_path(model_dir, shard);
    for (const std::string& name : names) {
      auto it = owner.find(name);
      if (it == owner.end() || it->second != shard_path) {
        return data_loss(index_path + ": tensor " + quote_name(name) + " is listed in shard " +
                         quote_name(shard) + " but absent from " + shard_path +
                         (it == owner.end() ? std::string() : " (it is in " + it->second + ")"));
      }
    }
    for (TensorInfo& t : headers[shard_i].tensors) {
      if (!wm_it->contains(t.name)) {
        PAGELLM_LOG_WARN("%s: tensor %s is not listed in %s; using it anyway", shard_path.c_str(),
                         quote_name(t.name).c_str(), kIndexFile);
      }
      tensors.push_back(std::move(t));
    }
    ++shard_i;
  }
  std::string desc = index_path + " (" + std::to_string(files.size()) + " shard" +
                     (files.size() == 1 ? "" : "s") + ")";
  return std::unique_ptr<WeightSource>(
      std::make_unique<SafetensorsWeights>(std::move(files), std::move(tensors), std::move(desc)));
}

}  // namespace

Result<std::unique_ptr<WeightSource>> open_safetensors_weights(const std::string& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    if (!fs::exists(model_dir, ec)) return not_found(model_dir + ": no such directory");
    return invalid_argument(model_dir + ": not a directory");
  }
  const std::string index_path = io_detail::join_path(model_dir, kIndexFile);
  if (fs::exists(index_path, ec)) return open_sharded(model_dir);
  const std::string single = io_detail::join_path(model_dir, kSingleFile);
  if (fs::exists(single, ec)) return open_safetensors_file(single);
  return not_found(model_dir + ": no " + kSingleFile + " or " + kIndexFile);
}

Result<LoadedCheckpoint> open_safetensors_checkpoint(const std::string& model_dir) {
  LoadedCheckpoint ckpt;
  PAGELLM_ASSIGN_OR_RETURN(ckpt.config, load_hf_config(model_dir));
  PAGELLM_ASSIGN_OR_RETURN(ckpt.weights, open_safetensors_weights(model_dir));
  if (ckpt.config.quantization && ckpt.config.quantization->method == QuantMethod::kFp8) {
    PAGELLM_ASSIGN_OR_RETURN(
        ckpt.weights, fp8_block_weights(std::move(ckpt.weights), *ckpt.config.quantization));
  } else {
    // FP8 values mean nothing without the scales an fp8 quantization_config says how to read.
    for (const TensorInfo& t : ckpt.weights->tensors())
      if (t.dtype == DType::kF8E4M3)
        return data_loss(t.file + ": tensor " + io_detail::quote_name(t.name) +
                         " is FP8 (F8_E4M3) but config.json has no fp8 quantization_config");
    if (ckpt.config.quantization) {
      PAGELLM_ASSIGN_OR_RETURN(
          ckpt.weights, unpack_int4_weights(std::move(ckpt.weights), *ckpt.config.quantization));
    }
  }
  ckpt.config.source = ckpt.weights->description();
  return ckpt;
}

}  // namespace pagellm
