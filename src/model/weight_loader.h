// WeightLoader: moves a checkpoint's tensors onto a backend for a model, by Hugging Face name and
// expected shape. Matrices keep their stored type on the CPU (zero-copy from the mapped file); on
// devices they take LoadOptions::weight_dtype, or stay quantized where the backend keeps their
// type (Backend::quantized_storage); vectors (norms, biases) become f32. With dummy weights
// (--load-format dummy) the tensors are allocated on the backend and filled with random values
// there, seeded by the tensor's name so every run builds the same model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"

namespace pagellm {

class WeightLoader {
 public:
  WeightLoader(Backend& backend, const WeightSource& source, const LoadOptions& options);

  // A [rows, cols] (or any-rank) weight matrix. keep_quantized false: a device stores it in
  // LoadOptions::weight_dtype even where it could keep its quantized type (the routed experts,
  // whose device kernels read bf16).
  Result<Tensor> matrix(const std::string& name, std::vector<int64_t> shape,
                        bool keep_quantized = true);
  // A matrix that must be of a float type wherever it lives (MLA's kv_b_proj: absorbed into other
  // weights and viewed per head): a quantized stored type becomes f32 on the CPU and
  // LoadOptions::weight_dtype on devices.
  Result<Tensor> float_matrix(const std::string& name, std::vector<int64_t> shape);
  // A 1-D weight; `dummy_value` is what dummy weights hold (1 for norm scales, 0 for biases).
  Result<Tensor> vector(const std::string& name, int64_t n, float dummy_value);
  bool has(const std::string& name) const { return source_.find(name) != nullptr; }

  // One checkpoint tensor's rows reordered: the row ranges [first, second) of the matrix of
  // `shape` (or the vector of n values), concatenated in the given order into a new weight.
  // DeepSeek's kv_a_proj_with_mqa is [c_kv | k_pe] by rows while the latent cache row is
  // [k_pe | c_kv]: reordered, one GEMM writes the row.
  using RowRanges = std::vector<std::pair<int64_t, int64_t>>;
  Result<Tensor> reordered_matrix(const std::string& name, std::vector<int64_t> shape,
                                  const RowRanges& ranges);
  Result<Tensor> reordered_vector(const std::string& name, int64_t n, float dummy_value,
                                  const RowRanges& ranges);

  // Matrices (or vectors) with the same column count stacked by rows into one weight
  // [sum of rows, cols], each part's rows reordered first where it names ranges: q|k|v or
  // gate|up, so a device runs one GEMM where the checkpoint has several (DeepSeek's query
  // projection and kv_a on every backend). Each part is loaded (or made, for dummy weights)
  // exactly as matrix() / vector() would load it alone, so the stack holds the same values.
  // Quantized parts a device keeps quantized are stacked on the host and uploaded as one weight
  // (dummy ones made as one); on the CPU they are refused (see stays_quantized).
  struct Part {
    std::string name;
    int64_t rows;
    RowRanges ranges = {};  // the part's rows in this order; empty: as stored
  };
  Result<Tensor> stacked_matrix(const std::vector<Part>& parts, int64_t cols,
                                bool keep_quantized = true);
  Result<Tensor> stacked_vector(const std::vector<Part>& parts, float dummy_value);
  // Whether `name` keeps a quantized stored type on the CPU (which keeps every block type): such
  // weights cannot be stacked with others there.
  bool stays_quantized(const std::string& name) const;
  // On a device: the quantized type it keeps the stack of `parts` in (all parts stored in one
  // type it keeps, the stack's shape fitting its layout), or kF32.
  DType device_stack_type(const std::vector<Part>& parts, int64_t cols) const;

  // The same, storing into `out`: for the long load sequences of the architecture files.
  Status matrix_into(const std::string& name, std::vector<int64_t> shape, Tensor& out);
  Status norm_into(const std::string& name, int64_t n, Tensor& out);  // dummy value 1
  Status bias_into(const std::string& name, int64_t n, Tensor& out);  // dummy value 0
  // An attention block's q, k and v projections, "<prefix>q_proj.<kind>" etc. with q_rows, kv_rows
  // and kv_rows rows: stacked into `fused` when `fuse` is set (one GEMM on devices), else loaded
  // into q, k and v. kind "weight": matrices of `cols` columns; "bias": vectors (cols unused).
  Status qkv_into(const std::string& prefix, const std::string& kind, int64_t q_rows,
                  int64_t kv_rows, int64_t cols, bool fuse, Tensor& fused, Tensor& q, Tensor& k,
                  Tensor& v);
  // model.embed_tokens, model.norm and the LM head, which is the embedding table when the
  // checkpoint has no lm_head.weight and the config ties them (else an error naming the tensor).
  Status embeddings_and_head(const ModelConfig& cfg, Tensor& embed, Tensor& final_norm,
                             Tensor& lm_head);

  int64_t bytes() const { return bytes_; }
  // The buffers backing uploaded weights; the model keeps them alive.
  std::vector<std::unique_ptr<Buffer>>& storage() { return storage_; }

 private:
  Result<Tensor> dummy(const std::string& name, std::vector<int64_t> shape, DType dtype, float lo,
                       float hi);
  // Whether a dummy matrix takes LoadOptions::dummy_quantized (on devices: where the backend
  // keeps that type for the shape).
  bool dummy_quantized(const std::string& name, const std::vector<int64_t>& shape) const;
  // On a device: the quantized type matrix() keeps the [rows, cols] weight `name` in, or kF32
  // when it stores it in LoadOptions::weight_dtype.
  DType device_quantized(const std::string& name, int64_t rows, int64_t cols) const;
  // " (after 1.2 GiB of weights)": how far loading got, for an out-of-memory error.
  std::string loaded_so_far() const;
  // Copies `loaded` (pieces of the last n_owned tensors loaded) into one stacked buffer and frees
  // those tensors; `what` names the result in an out-of-memory error.
  Result<Tensor> stack_loaded(const std::vector<Tensor>& loaded, int64_t cols, size_t n_owned,
                              const std::string& what);
  Result<Tensor> reorder_loaded(const std::string& name, const Tensor& t, int64_t cols,
                                const RowRanges& ranges);
  // The parts' host tensors (their ranges in order) copied into one host buffer and uploaded as
  // `kept`; dummy weights: one random tensor of the stack's shape.
  Result<Tensor> stacked_on_host(const std::vector<Part>& parts, int64_t cols, DType kept);
  // "the stack of 16 weights 'first' .. 'last'".
  static std::string stack_name(const std::vector<Part>& parts);
  // The row ranges of a loaded tensor of `cols` columns as views, in order (all of it for none).
  static std::vector<Tensor> pieces_of(const Tensor& t, int64_t cols, const RowRanges& ranges);

  Backend& backend_;
  const WeightSource& source_;
  LoadOptions options_;
  std::vector<std::unique_ptr<Buffer>> storage_;
  int64_t bytes_ = 0;
};

}  // namespace pagellm
