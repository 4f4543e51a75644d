#include "model/weight_loader.h"

#include <cmath>
#include <cstring>
#include <functional>

#include "io/quant_config.h"

namespace pagellm {

WeightLoader::WeightLoader(Backend& backend, const WeightSource& source, const LoadOptions& options)
    : backend_(backend), source_(source), options_(options) {}

std::string WeightLoader::stack_name(const std::vector<Part>& parts) {
  PAGELLM_CHECK(!parts.empty());
  return "the stack of " + std::to_string(parts.size()) + " weights '" + parts.front().name + "'" +
         (parts.size() > 1 ? " .. '" + parts.back().name + "'" : "");
}

std::string WeightLoader::loaded_so_far() const {
  return " (after " + memory_size(bytes_) + " of weights)";
}

Result<Tensor> WeightLoader::dummy(const std::string& name, std::vector<int64_t> shape, DType dtype,
                                   float lo, float hi) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  PAGELLM_ASSIGN_OR_RETURN(
      std::unique_ptr<Buffer> made,
      backend_.allocate_or_error(dtype_bytes(dtype, n), "weight '" + name + "'" + loaded_so_far()));
  auto& buf = storage_.emplace_back(std::move(made));
  Tensor t(buf->data(), dtype, {n}, backend_.device());
  t.ndim = static_cast<int>(shape.size());  // the shape first: a device's 4-bit layout has rows
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = shape[i];
  t.set_contiguous_strides();
  backend_.fill_random(t, std::hash<std::string>{}(name), lo, hi);
  bytes_ += dtype_bytes(dtype, n);
  return t;
}

Result<Tensor> WeightLoader::matrix(const std::string& name, std::vector<int64_t> shape,
                                    bool keep_quantized) {
  const bool cpu = backend_.device() == Device::kCpu;
  if (source_.is_dummy()) {
    // Uniform with the spread of a 1/sqrt(fan_in)-scaled init, so activations stay O(1).
    const float a = std::sqrt(3.0f / static_cast<float>(shape.back()));
    const DType dt = keep_quantized && dummy_quantized(name, shape) ? options_.dummy_quantized
                     : cpu                                          ? DType::kBF16
                                                                    : options_.weight_dtype;
    return dummy(name, std::move(shape), dt, -a, a);
  }
  PAGELLM_ASSIGN_OR_RETURN(Tensor host, source_.get(name, std::move(shape)));
  DType want = cpu ? host.dtype : options_.weight_dtype;
  if (!cpu && keep_quantized) {
    const DType kept = device_quantized(name, host.rows(), host.cols());
    if (kept != DType::kF32) want = kept;
  }
  PAGELLM_ASSIGN_OR_RETURN(Tensor t, backend_.upload_weight(host, want, storage_.emplace_back()));
  bytes_ += dtype_bytes(t.dtype, t.numel());
  return t;
}

Result<Tensor> WeightLoader::float_matrix(const std::string& name, std::vector<int64_t> shape) {
  if (source_.is_dummy() || !stays_quantized(name))
    return matrix(name, std::move(shape), /*keep_quantized=*/false);
  PAGELLM_ASSIGN_OR_RETURN(Tensor host, source_.get(name, std::move(shape)));
  PAGELLM_ASSIGN_OR_RETURN(Tensor t,
                           backend_.upload_weight(host, DType::kF32, storage_.emplace_back()));
  bytes_ += dtype_bytes(t.dtype, t.numel());
  return t;
}

Result<Tensor> WeightLoader::vector(const std::string& name, int64_t n, float dummy_value) {
  if (source_.is_dummy()) return dummy(name, {n}, DType::kF32, dummy_value, dummy_value);
  PAGELLM_ASSIGN_OR_RETURN(Tensor host, source_.get(name, {n}));
  PAGELLM_ASSIGN_OR_RETURN(Tensor t, backend_.upload_weight(host, DType::kF32, storage_.emplace_back()));
  bytes_ += dtype_bytes(t.dtype, t.numel());
  return t;
}

Result<Tensor> WeightLoader::stack_loaded(const std::vector<Tensor>& loaded, int64_t cols,
                                          size_t n_owned, const std::string& what) {
  PAGELLM_CHECK(!loaded.empty() && n_owned <= storage_.size());
  const DType dt = loaded[0].dtype;
  // Quantized rows are whole blocks, so pieces of one quantized tensor (the CPU's, which never
  // fuses projections) reorder byte for byte; devices stack quantized weights on the host
  // (stacked_on_host).
  int64_t rows = 0;
  for (const Tensor& t : loaded) {
    if (t.dtype != dt || (is_quantized(dt) && n_owned != 1) || !t.is_contiguous() ||
        t.numel() % cols != 0)
      return invalid_argument("cannot stack weights of different or quantized types (" +
                              t.shape_string() + ")");
    rows += t.numel() / cols;
  }
  PAGELLM_ASSIGN_OR_RETURN(
      std::unique_ptr<Buffer> buf,
      backend_.allocate_or_error(dtype_bytes(dt, rows * cols), what + loaded_so_far()));
  char* dst = static_cast<char*>(buf->data());
  for (const Tensor& t : loaded) {
    backend_.copy(dst, t.data, t.nbytes());
    dst += t.nbytes();
  }
  backend_.synchronize();  // the parts are freed next
  storage_.resize(storage_.size() - n_owned);
  const Tensor out = cols == 1 ? Tensor(buf->data(), dt, {rows}, backend_.device())
                               : Tensor(buf->data(), dt, {rows, cols}, backend_.device());
  storage_.push_back(std::move(buf));
  return out;
}

DType WeightLoader::device_stack_type(const std::vector<Part>& parts, int64_t cols) const {
  if (backend_.device() == Device::kCpu) return DType::kF32;
  const DType kept = device_quantized(parts.front().name, parts.front().rows, cols);
  int64_t rows = 0;
  for (const Part& p : parts) {
    if (device_quantized(p.name, p.rows, cols) != kept) return DType::kF32;
    if (p.ranges.empty()) rows += p.rows;
    for (const auto& [b, e] : p.ranges) rows += e - b;
  }
  if (kept == DType::kF32 || backend_.quantized_storage(kept, rows, cols) != kept)
    return DType::kF32;
  if (source_.is_dummy()) return kept;
  // A checkpoint's parts: one stored type (which the device keeps as `kept`).
  const TensorInfo* first = source_.find(parts.front().name);
  for (const Part& p : parts) {
    const TensorInfo* info = source_.find(p.name);
    if (first == nullptr || info == nullptr || info->dtype != first->dtype) return DType::kF32;
  }
  return kept;
}

Result<Tensor> WeightLoader::stacked_on_host(const std::vector<Part>& parts, int64_t cols,
                                             DType kept) {
  int64_t rows = 0;
  for (const Part& p : parts) {
    if (p.ranges.empty()) rows += p.rows;
    for (const auto& [b, e] : p.ranges) {
      if (!(0 <= b && b < e && e <= p.rows))
        return invalid_argument("weight '" + p.name + "': bad row range for a reordered weight");
      rows += e - b;
    }
  }
  if (source_.is_dummy()) {
    const float a = std::sqrt(3.0f / static_cast<float>(cols));  // as matrix()'s
    return dummy(stack_name(parts), {rows, cols}, kept, -a, a);
  }
  std::vector<Tensor> hosts;
  for (const Part& p : parts) {
    PAGELLM_ASSIGN_OR_RETURN(Tensor h, source_.get(p.name, {p.rows, cols}));
    if (!h.is_contiguous() || (!hosts.empty() && h.dtype != hosts[0].dtype))
      return invalid_argument(stack_name(parts) + ": the parts differ in type or layout");
    hosts.push_back(h);
  }
  const DType dt = hosts[0].dtype;
  const int64_t row_bytes = dtype_bytes(dt, cols);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * row_bytes));
  uint8_t* dst = bytes.data();
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto* src = static_cast<const uint8_t*>(hosts[i].data);
    const RowRanges all = {{0, parts[i].rows}};
    for (const auto& [b, e] : parts[i].ranges.empty() ? all : parts[i].ranges) {
      std::memcpy(dst, src + b * row_bytes, static_cast<size_t>((e - b) * row_bytes));
      dst += (e - b) * row_bytes;
    }
  }
  const Tensor host(bytes.data(), dt, {rows, cols});
  // upload_weight has read the host copy when it returns (pageable copies are staged).
  PAGELLM_ASSIGN_OR_RETURN(Tensor t, backend_.upload_weight(host, kept, storage_.emplace_back()));
  bytes_ += dtype_bytes(t.dtype, t.numel());
  return t;
}

Result<Tensor> WeightLoader::stacked_matrix(const std::vector<Part>& parts, int64_t cols,
                                            bool keep_quantized) {
  // On a device, parts it keeps quantized (one type, one kept layout) are stacked on the host
  // and uploaded as one weight: the device layouts need not concatenate.
  if (keep_quantized) {
    const DType kept = device_stack_type(parts, cols);
    if (kept != DType::kF32) return stacked_on_host(parts, cols, kept);
  }
  const bool keep = backend_.device() == Device::kCpu && keep_quantized;
  std::vector<Tensor> pieces;
  for (const Part& p : parts) {
    PAGELLM_ASSIGN_OR_RETURN(Tensor t, matrix(p.name, {p.rows, cols}, keep));
    for (const Tensor& piece : pieces_of(t, cols, p.ranges)) pieces.push_back(piece);
  }
  return stack_loaded(pieces, cols, parts.size(), stack_name(parts));
}

Result<Tensor> WeightLoader::stacked_vector(const std::vector<Part>& parts, float dummy_value) {
  std::vector<Tensor> pieces;
  for (const Part& p : parts) {
    PAGELLM_ASSIGN_OR_RETURN(Tensor t, vector(p.name, p.rows, dummy_value));
    for (const Tensor& piece : pieces_of(t, 1, p.ranges)) pieces.push_back(piece);
  }
  return stack_loaded(pieces, 1, parts.size(), stack_name(parts));
}

bool WeightLoader::dummy_quantized(const std::string& name,
                                   const std::vector<int64_t>& shape) const {
  const DType q = options_.dummy_quantized;
  if (!source_.is_dummy() || q == DType::kF32 || !is_quantized_projection(name, shape.size()) ||
      shape.back() % block_elems(q) != 0)
    return false;
  if (backend_.device() == Device::kCpu) return true;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return backend_.quantized_storage(q, rows, shape.back()) == q;
}

DType WeightLoader::device_quantized(const std::string& name, int64_t rows, int64_t cols) const {
  if (source_.is_dummy())
    return dummy_quantized(name, {rows, cols}) ? options_.dummy_quantized : DType::kF32;
  const TensorInfo* info = source_.find(name);
  if (info == nullptr || !is_quantized(info->dtype)) return DType::kF32;
  return backend_.quantized_storage(info->dtype, rows, cols);
}

bool WeightLoader::stays_quantized(const std::string& name) const {
  // Dummy weights: the shape is not known here, so any projection may be (the rows of every
  // published shape fit the 4-bit blocks).
  if (source_.is_dummy())
    return options_.dummy_quantized != DType::kF32 && backend_.device() == Device::kCpu &&
           is_quantized_projection(name, 2);
  const TensorInfo* info = source_.find(name);
  return backend_.device() == Device::kCpu && info != nullptr && is_quantized(info->dtype);
}

std::vector<Tensor> WeightLoader::pieces_of(const Tensor& t, int64_t cols,
                                            const RowRanges& ranges) {
  if (ranges.empty()) return {t};
  const int64_t rows = t.numel() / cols;
  std::vector<Tensor> pieces;
  for (const auto& [first, last] : ranges) {
    PAGELLM_CHECK_MSG(0 <= first && first < last && last <= rows,
                      "reordered weight: bad row range");
    const int64_t n = last - first;
    pieces.push_back(Tensor(static_cast<char*>(t.data) + dtype_bytes(t.dtype, first * cols),
                            t.dtype, {n * cols}, t.device));
  }
  return pieces;
}

Result<Tensor> WeightLoader::reorder_loaded(const std::string& name, const Tensor& t, int64_t cols,
                                            const RowRanges& ranges) {
  return stack_loaded(pieces_of(t, cols, ranges), cols, 1, "weight '" + name + "' reordered");
}

Result<Tensor> WeightLoader::reordered_matrix(const std::string& name, std::vector<int64_t> shape,
                                              const RowRanges& ranges) {
  PAGELLM_CHECK(shape.size() == 2);
  return stacked_matrix({{name, shape[0], ranges}}, shape[1]);
}

Result<Tensor> WeightLoader::reordered_vector(const std::string& name, int64_t n, float dummy_value,
                                              const RowRanges& ranges) {
  PAGELLM_ASSIGN_OR_RETURN(Tensor t, vector(name, n, dummy_value));
  return reorder_loaded(name, t, 1, ranges);
}

Status WeightLoader::matrix_into(const std::string& name, std::vector<int64_t> shape, Tensor& out) {
  PAGELLM_ASSIGN_OR_RETURN(out, matrix(name, std::move(shape)));
  return {};
}

Status WeightLoader::norm_into(const std::string& name, int64_t n, Tensor& out) {
  PAGELLM_ASSIGN_OR_RETURN(out, vector(name, n, 1.0f));
  return {};
}

Status WeightLoader::bias_into(const std::string& name, int64_t n, Tensor& out) {
  PAGELLM_ASSIGN_OR_RETURN(out, vector(name, n, 0.0f));
  return {};
}

Status WeightLoader::qkv_into(const std::string& prefix, const std::string& kind, int64_t q_rows,
                              int64_t kv_rows, int64_t cols, bool fuse, Tensor& fused, Tensor& q,
                              Tensor& k, Tensor& v) {
  const bool bias = kind == "bias";
  const std::string suffix = "_proj." + kind;
  if (fuse) {
    const std::vector<Part> parts = {{prefix + "q" + suffix, q_rows},
                                     {prefix + "k" + suffix, kv_rows},
                                     {prefix + "v" + suffix, kv_rows}};
    PAGELLM_ASSIGN_OR_RETURN(fused,
                             bias ? stacked_vector(parts, 0.0f) : stacked_matrix(parts, cols));
    return {};
  }
  const auto one = [&](const char* name, int64_t rows, Tensor& out) {
    return bias ? bias_into(prefix + name + suffix, rows, out)
                : matrix_into(prefix + name + suffix, {rows, cols}, out);
  };
  PAGELLM_RETURN_IF_ERROR(one("q", q_rows, q));
  PAGELLM_RETURN_IF_ERROR(one("k", kv_rows, k));
  return one("v", kv_rows, v);
}

Status WeightLoader::embeddings_and_head(const ModelConfig& cfg, Tensor& embed, Tensor& final_norm,
                                         Tensor& lm_head) {
  const int64_t V = cfg.vocab_size, D = cfg.hidden_size;
  // The table is read by rows (embedding), never as a product's weight: float on devices.
  PAGELLM_ASSIGN_OR_RETURN(embed, matrix("model.embed_tokens.weight", {V, D}, false));
  PAGELLM_RETURN_IF_ERROR(norm_into("model.norm.weight", D, final_norm));
  if (has("lm_head.weight")) return matrix_into("lm_head.weight", {V, D}, lm_head);
  if (!cfg.tie_word_embeddings) {
    return not_found(source_.description() + ": tensor 'lm_head.weight' is missing and the config "
                     "does not tie word embeddings");
  }
  lm_head = embed;
  return {};
}

}  // namespace pagellm
