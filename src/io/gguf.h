// GGUF: llama.cpp's single-file checkpoint format (versions 2 and 3, little-endian).
//
// Layout: "GGUF" magic, u32 version, u64 n_tensors, u64 n_kv; n_kv metadata entries (string key,
// u32 value type, value); n_tensors tensor infos (string name, u32 n_dims, u64 dims[n_dims] listed
// fastest-varying first, u32 ggml type, u64 offset relative to the data section); padding up to
// `general.alignment` (default 32); the data section. Strings are a u64 byte length and the bytes
// (no terminator); arrays are a u32 element type, a u64 count and the elements (arrays may nest).
//
// GgufFile validates the whole header when it opens (every read bounds-checked, every count checked
// against the bytes left before anything is allocated from it, tensor extents aligned, inside the
// file and not overlapping, names unique) and keeps metadata values in the mapping, decoding them
// on request, so a 150k-entry vocabulary costs nothing until someone reads it.
//
// GgufWeightSource exposes the tensors under their Hugging Face names with torch's shape order,
// undoing the row permutation llama.cpp's converter applies to q_proj/k_proj of arch "llama".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/mapped_file.h"
#include "io/model_config.h"
#include "io/weights.h"

namespace pagellm {

// Metadata value types (gguf_type in ggml's gguf.h).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
inline constexpr uint32_t kGgufTypeCount = 13;
std::string_view gguf_type_name(GgufType t);

// ggml tensor type ids (enum ggml_type) that pagellm computes with; others are only named.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};
// "q4_K" for a known ggml type id, "" for an unknown one.
std::string_view ggml_type_name(uint32_t type);
// The pagellm DType of a ggml type, or nullopt when pagellm cannot compute with it.
std::optional<DType> dtype_from_ggml(uint32_t type);
// The ggml type id of a pagellm DType (for writers and tests); nullopt for i32/i64.
std::optional<uint32_t> ggml_from_dtype(DType t);

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr int64_t kGgufDefaultAlignment = 32;

// One metadata entry. Values stay in the file; `value_offset` is where the value starts (for an
// array: its first element, after the element type and count).
struct GgufKv {
  std::string key;
  GgufType type = GgufType::kU8;
  GgufType elem_type = GgufType::kU8;  // arrays only
  uint64_t n_elems = 0;                // arrays only
  int64_t value_offset = 0;
};

struct GgufTensor {
  std::string name;             // GGUF name, e.g. "blk.0.attn_q.weight"
  uint32_t ggml_type = 0;
  std::vector<int64_t> dims;    // GGUF order: dims[0] varies fastest (the row length)
  int64_t offset = 0;           // relative to the data section
  int64_t nbytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping
};

class GgufFile {
 public:
  // Maps and validates `path`.
  static Result<GgufFile> open(const std::string& path);
  // Validates a GGUF image held in memory; the memory is not copied and must outlive the result.
  // `name` stands for the file in messages.
  static Result<GgufFile> parse(const uint8_t* data, int64_t size, std::string name);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  int64_t alignment() const { return alignment_; }
  int64_t data_offset() const { return data_offset_; }  // start of the data section in the file
  int64_t file_size() const { return size_; }

  // --- metadata ---
  const std::vector<GgufKv>& metadata() const { return kvs_; }  // file order
  bool has(const std::string& key) const { return kv_index_.count(key) != 0; }
  const GgufKv* find_kv(const std::string& key) const;

  // Each getter fails with kNotFound when the key is absent, kInvalidArgument when its type does
  // not fit and kOutOfRange when an integer does not fit the result type; messages name file and key.
  Result<std::string> get_string(const std::string& key) const;
  Result<uint32_t> get_u32(const std::string& key) const;  // any integer type, range-checked
  Result<int64_t> get_i64(const std::string& key) const;   // any integer type, range-checked
  Result<float> get_f32(const std::string& key) const;     // f32 or f64
  Result<double> get_f64(const std::string& key) const;    // f32 or f64, without rounding to f32
  Result<bool> get_bool(const std::string& key) const;
  Result<std::vector<std::string>> get_string_array(const std::string& key) const;
  Result<std::vector<int32_t>> get_i32_array(const std::string& key) const;  // any integer elems
  Result<std::vector<float>> get_f32_array(const std::string& key) const;    // f32 or f64 elems
  // Number of elements of an array value.
  Result<uint64_t> get_array_size(const std::string& key) const;
  // Short human-readable rendering of a value (at most `max_elems` array elements, long strings
  // cut), for `pagellm inspect`.
  std::string value_to_string(const GgufKv& kv, size_t max_elems = 8) const;

  // --- tensors ---
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // file order
  const GgufTensor* find_tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  Status parse_header();
  Result<const GgufKv*> lookup(const std::string& key) const;
  Status type_error(const GgufKv& kv, const char* expected) const;

  MappedFile file_;  // empty when parsed from caller-owned memory
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  std::string path_;
  uint32_t version_ = 0;
  int64_t alignment_ = kGgufDefaultAlignment;
  int64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// llama.cpp tensor name -> Hugging Face name ("blk.3.ffn_gate.weight" ->
// "model.layers.3.mlp.gate_proj.weight"); nullopt for names outside the Llama/Qwen2/Qwen3 set.
std::optional<std::string> gguf_to_hf_name(std::string_view gguf_name);

// llama.cpp's converter stores q_proj/k_proj of arch "llama" with the rows of each head reordered
// from HF's rotate-half RoPE layout [x0 .. x_{h/2-1} | x_{h/2} .. x_{h-1}] to GGML's interleaved one
// [x0, x_{h/2}, x1, x_{h/2+1}, ...]: stored row h*d + 2i + j holds HF row h*d + j*d/2 + i (d = rows
// per head, i < d/2, j in {0, 1}). This writes the HF order back. Rows are moved whole (`row_bytes`
// each), so quantized rows need no dequantization. Requires n_rows % (2 * n_head) == 0.
void unpermute_qk_rows(const uint8_t* src, uint8_t* dst, int64_t n_rows, int64_t row_bytes,
                       int64_t n_head);

struct GgufWeightOptions {
  bool unpermute_qk = false;  // arch "llama": undo the converter's q/k row permutation
  int64_t n_head = 0;         // attention heads (q_proj)
  int64_t n_head_kv = 0;      // key/value heads (k_proj)
};

// The tensors of a GgufFile under Hugging Face names, shapes as torch shows them. Zero-copy views
// of the mapping, except un-permuted q/k tensors, which are owned copies.
class GgufWeightSource final : public WeightSource {
 public:
  // Fails naming the tensor for a name with no HF counterpart, a ggml type pagellm cannot compute
  // with, or a q/k tensor whose rows do not split into heads.
  static Result<std::unique_ptr<GgufWeightSource>> create(std::shared_ptr<const GgufFile> file,
                                                          const GgufWeightOptions& options);

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const override;
  std::string description() const override;
  const GgufFile& file() const { return *file_; }

 private:
  GgufWeightSource() = default;
  std::shared_ptr<const GgufFile> file_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;  // un-permuted copies
};

// ModelConfig from GGUF metadata (general.architecture in {llama, qwen2, qwen3}). Tensor presence
// decides tied embeddings and optional biases; a llama3-style `rope_freqs.weight` is folded back
// into RopeType::kLlama3 parameters.
Result<ModelConfig> gguf_model_config(const GgufFile& file);

}  // namespace pagellm
