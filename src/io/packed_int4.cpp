// The three packings, for a linear of N outputs and K inputs with groups of G inputs:
//   AWQ (GEMM):  qweight i32 [K, N/8], packed along the outputs in AWQ's interleaved order (the
//                nibble at bits 4i of a word holds output 8c + kAwqOrder[i]); qzeros i32
//                [K/G, N/8], the same way; scales f16 [K/G, N].        w = s * (q - z)
//   GPTQ:        qweight i32 [K/8, N], packed along the inputs (nibble i of word r: input 8r + i);
//                qzeros i32 [K/G, N/8], packed along the outputs in order; scales f16 [K/G, N];
//                g_idx i32 [K], each input's group. The v1 format stores z - 1 in 4 bits
//                (so z = 0 is stored as 15); AutoGPTQ reads back ((stored + 1) & 15).
//                                                                     w = s * (q - z)
//   compressed-tensors pack-quantized: weight_packed i32 [N, K/8] (nibble i of word c: input
//                8c + i), values offset by +8; weight_scale [N, K/G]; weight_zero_point i32
//                [N/8, K/G] packed along the outputs (asymmetric only), also offset by +8;
//                weight_shape [2] = [N, K].                           w = s * (q - z)
#include "io/packed_int4.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "core/log.h"
#include "core/thread_pool.h"
#include "io/converted_weights.h"

namespace pagellm {
namespace {

using io_detail::ends_with;
using io_detail::quote_name;
using io_detail::shape_str;

// AWQ's packing puts output 8c + order[i] in nibble i, order = {0, 2, 4, 6, 1, 3, 5, 7};
// kAwqNibble is its inverse: the nibble of output 8c + j.
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};


// Element i of a mapped tensor. safetensors does not align tensors to their element size, so a
// file may place an i32 tensor at any byte: loads go through memcpy.
template <typename T>
T load_at(const void* base, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

int nibble(const int32_t* words, int64_t word, int i) {
  return static_cast<int>((load_at<uint32_t>(words, word) >> (4 * i)) & 0xfu);
}

enum class Packing { kAwq, kGptq, kCompressedTensors };

// One quantized linear: where its packed values and zero points are, read by output n, input k
// and group g (a template on the packing, so the unpacking loop has no call per value).
struct PackedLinear {
  int64_t n = 0, k = 0, group = 0;  // group: the checkpoint's, resolved (-1 -> K)
  Packing packing = Packing::kAwq;
  const int32_t* w = nullptr;    // packed values
  const int32_t* z = nullptr;    // packed zero points; null: 8 (symmetric compressed-tensors)
  int zero_plus = 0;             // GPTQ v1 stores z - 1
  std::vector<uint16_t> scales;  // f16 [N, K/group]
  std::vector<int32_t> g_idx;    // GPTQ act-order: each input's group (empty: k / group)

  template <Packing P>
  int q(int64_t row, int64_t col) const {
    if constexpr (P == Packing::kAwq)
      return nibble(w, col * (n / 8) + row / 8, kAwqNibble[row % 8]);
    if constexpr (P == Packing::kGptq)
      return nibble(w, (col / 8) * n + row, static_cast<int>(col % 8));
    return nibble(w, row * (k / 8) + col / 8, static_cast<int>(col % 8));
  }
  template <Packing P>
  int zero(int64_t row, int64_t g) const {
    if constexpr (P == Packing::kAwq) return nibble(z, g * (n / 8) + row / 8, kAwqNibble[row % 8]);
    if constexpr (P == Packing::kGptq)
      return (nibble(z, g * (n / 8) + row / 8, static_cast<int>(row % 8)) + zero_plus) & 0xf;
    if (z == nullptr) return 8;
    return nibble(z, (row / 8) * (k / group) + g, static_cast<int>(row % 8));
  }
};

// The I4G blocks of a linear (storage group: the largest of 128, 64, 32 dividing the
// checkpoint's group; a larger group's scale and zero point repeat in each of its blocks).
template <int G, Packing P>
void fill_blocks(const PackedLinear& p, uint8_t* out) {
  const int64_t blocks = p.k / G, groups = p.k / p.group;
  ThreadPool::global().parallel_for(p.n, 16, [&](int64_t nb, int64_t ne) {
    for (int64_t n = nb; n < ne; ++n) {
      auto* row = reinterpret_cast<BlockI4G<G>*>(out) + n * blocks;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t g = b * G / p.group, k0 = b * G;
        BlockI4G<G>& blk = row[b];
        blk.d = p.scales[n * groups + g];
        blk.z = static_cast<uint8_t>(p.zero<P>(n, g));
        blk.pad = 0;
        for (int c = 0; c < G / 32; ++c)
          for (int j = 0; j < 16; ++j)
            blk.qs[16 * c + j] = static_cast<uint8_t>(p.q<P>(n, k0 + 32 * c + j) |
                                                      (p.q<P>(n, k0 + 32 * c + j + 16) << 4));
      }
    }
  });
}

// AWQ packs along the outputs: a word holds one input of 8 rows, and the words of one row are n / 8
// apart. So the 8 rows of a word column are filled together, each word read once.
template <int G>
void fill_blocks_awq(const PackedLinear& p, uint8_t* out) {
  const int64_t blocks = p.k / G, groups = p.k / p.group, words = p.n / 8;
  ThreadPool::global().parallel_for(words, 2, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      BlockI4G<G>* rows[8];
      for (int j = 0; j < 8; ++j)
        rows[j] = reinterpret_cast<BlockI4G<G>*>(out) + (8 * c + j) * blocks;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t g = b * G / p.group;
        for (int j = 0; j < 8; ++j) {
          BlockI4G<G>& blk = rows[j][b];
          blk.d = p.scales[(8 * c + j) * groups + g];
          blk.z = static_cast<uint8_t>(p.zero<Packing::kAwq>(8 * c + j, g));
          blk.pad = 0;
          std::memset(blk.qs, 0, sizeof blk.qs);
        }
        for (int i = 0; i < G; ++i) {
          const uint32_t word = load_at<uint32_t>(p.w, (b * G + i) * words + c);
          const int byte = 16 * (i / 32) + (i & 15), shift = (i & 31) < 16 ? 0 : 4;
          for (int j = 0; j < 8; ++j)
            rows[j][b].qs[byte] |=
                static_cast<uint8_t>(((word >> (4 * kAwqNibble[j])) & 0xfu) << shift);
        }
      }
    }
  });
}

template <int G>
void fill_blocks_of(const PackedLinear& p, uint8_t* out) {
  switch (p.packing) {
    case Packing::kAwq:
      return fill_blocks_awq<G>(p, out);
    case Packing::kGptq:
      return fill_blocks<G, Packing::kGptq>(p, out);
    case Packing::kCompressedTensors:
      return fill_blocks<G, Packing::kCompressedTensors>(p, out);
  }
}

class UnpackedInt4Weights final : public io_detail::ConvertedWeights {
 public:
  UnpackedInt4Weights(std::unique_ptr<WeightSource> inner, const QuantConfig& q)
      : ConvertedWeights(std::move(inner)), q_(q) {}

  Status unpack() {
    const bool ct = q_.method == QuantMethod::kCompressedTensors;
    const std::vector<std::string> parts =
        ct ? std::vector<std::string>{"weight_packed", "weight_scale", "weight_zero_point",
                                      "weight_shape"}
           : std::vector<std::string>{"qweight", "qzeros", "scales", "g_idx"};
    const std::string packed_suffix = ct ? ".weight_packed" : ".qweight";
    std::unordered_set<std::string> consumed;
    std::vector<std::string> prefixes;
    for (const TensorInfo& t : inner_->tensors())
      if (ends_with(t.name, packed_suffix))
        prefixes.push_back(t.name.substr(0, t.name.size() - packed_suffix.size()));
    for (const std::string& prefix : prefixes) {
      if (inner_->find(prefix + ".weight"))
        return data_loss(describe(prefix + ".weight") + " exists beside its packed form " +
                         quote_name(prefix + packed_suffix));
      PackedLinear p;
      switch (q_.method) {
        case QuantMethod::kAwq:
          PAGELLM_RETURN_IF_ERROR(read_awq(prefix, p));
          break;
        case QuantMethod::kGptq:
          PAGELLM_RETURN_IF_ERROR(read_gptq(prefix, p));
          break;
        case QuantMethod::kCompressedTensors:
          PAGELLM_RETURN_IF_ERROR(read_ct(prefix, p));
          break;
        case QuantMethod::kFp8:  // io/fp8_weights.h reads those
          return invalid_argument("unpack_int4_weights: an FP8 checkpoint is not 4-bit");
      }
      PAGELLM_RETURN_IF_ERROR(add_unpacked(prefix, p));
      for (const std::string& part : parts) consumed.insert(prefix + "." + part);
    }
    for (const TensorInfo& t : inner_->tensors()) {
      if (consumed.count(t.name)) continue;
      for (const std::string& part : parts)
        if (ends_with(t.name, "." + part))
          return data_loss(describe(t.name) + " belongs to no " + packed_suffix.substr(1) +
                           " tensor: the checkpoint is incomplete");
      pass_through(t);
    }
    index();
    return Status::ok_status();
  }

  std::string description() const override {
    return inner_->description() + " (" + quant_method_name(q_.method) + " 4-bit)";
  }

 private:

  // The tensor `name` as i32 of `shape` (or any shape of `ndim` dims when shape is empty).
  Result<const TensorInfo*> part(const std::string& name, DType dtype,
                                 const std::vector<int64_t>& shape) const {
    const TensorInfo* t = inner_->find(name);
    if (!t)
      return not_found(describe(name) + " is missing (" + quant_method_name(q_.method) +
                       " checkpoints need it beside the packed weight)");
    if (t->dtype != dtype)
      return data_loss(describe(name) + " is " + std::string(dtype_name(t->dtype)) + ", expected " +
                       std::string(dtype_name(dtype)));
    if (t->shape != shape)
      return data_loss(describe(name) + " has shape " + shape_str(t->shape) + ", expected " +
                       shape_str(shape));
    return t;
  }

  // Scales of any float type as f16, which must hold them exactly (they are f16 in AWQ and GPTQ
  // checkpoints; compressed-tensors writes the model's dtype, bf16 values fit f16 unless tiny).
  Result<std::vector<uint16_t>> scales_f16(const std::string& name,
                                           const std::vector<int64_t>& shape) const {
    const TensorInfo* t = inner_->find(name);
    if (!t) return not_found(describe(name) + " is missing");
    if (t->dtype != DType::kF16 && t->dtype != DType::kBF16 && t->dtype != DType::kF32)
      return data_loss(describe(name) + " is " + std::string(dtype_name(t->dtype)) +
                       ", expected a float type");
    if (t->shape != shape)
      return data_loss(describe(name) + " has shape " + shape_str(t->shape) + ", expected " +
                       shape_str(shape));
    const int64_t count = shape[0] * shape[1];
    std::vector<uint16_t> out(count);
    if (t->dtype == DType::kF16) {
      std::memcpy(out.data(), t->data, count * 2);
      return out;
    }
    // An aligned copy first: the mapped tensor may sit at any byte (see load_at).
    std::vector<float> f(count);
    std::memcpy(f.data(), t->data, t->nbytes);
    if (t->dtype == DType::kBF16) {
      std::vector<uint16_t> h(count);
      std::memcpy(h.data(), f.data(), count * 2);
      to_f32(DType::kBF16, h.data(), f.data(), count);
    }
    for (int64_t i = 0; i < count; ++i) {
      out[i] = f32_to_f16(f[i]);
      if (f16_to_f32(out[i]) != f[i])
        return unimplemented(describe(name) + " holds the scale " + std::to_string(f[i]) +
                             ", which f16 cannot hold exactly");
    }
    return out;
  }

  Status check_shape(const std::string& prefix, int64_t n, int64_t k, int64_t& group) const {
    group = q_.group_size < 0 ? k : q_.group_size;
    if (n <= 0 || k <= 0 || group <= 0 || n % 8 != 0 || k % 32 != 0 || k % group != 0)
      return data_loss(describe(prefix + ".weight") + " unpacks to [" + std::to_string(n) + ", " +
                       std::to_string(k) + "]: outputs must be a multiple of 8 and inputs a " +
                       "multiple of 32 and of the group size " + std::to_string(group));
    return Status::ok_status();
  }

  // The packed values of AWQ and GPTQ: a 2-D i32 tensor.
  Result<const TensorInfo*> qweight(const std::string& prefix) const {
    const TensorInfo* qw = inner_->find(prefix + ".qweight");
    if (qw->dtype != DType::kI32 || qw->shape.size() != 2)
      return data_loss(describe(qw->name) + " must be a 2-D i32 tensor, is " +
                       std::string(dtype_name(qw->dtype)) + " " + shape_str(qw->shape));
    return qw;
  }

  // AWQ's and GPTQ's zero points, i32 [K/G, N/8], and scales, [K/G, N] (kept [N, K/G]).
  Status read_zeros_and_scales(const std::string& prefix, PackedLinear& p) {
    const int64_t groups = p.k / p.group;
    PAGELLM_ASSIGN_OR_RETURN(const TensorInfo* qz,
                             part(prefix + ".qzeros", DType::kI32, {groups, p.n / 8}));
    PAGELLM_ASSIGN_OR_RETURN(std::vector<uint16_t> s,
                             scales_f16(prefix + ".scales", {groups, p.n}));
    p.scales = transpose(s, groups, p.n);
    p.z = static_cast<const int32_t*>(qz->data);
    return Status::ok_status();
  }

  Status read_awq(const std::string& prefix, PackedLinear& p) {
    PAGELLM_ASSIGN_OR_RETURN(const TensorInfo* qw, qweight(prefix));
    p.k = qw->shape[0];
    p.n = qw->shape[1] * 8;
    PAGELLM_RETURN_IF_ERROR(check_shape(prefix, p.n, p.k, p.group));
    p.packing = Packing::kAwq;
    p.w = static_cast<const int32_t*>(qw->data);
    return read_zeros_and_scales(prefix, p);
  }

  Status read_gptq(const std::string& prefix, PackedLinear& p) {
    PAGELLM_ASSIGN_OR_RETURN(const TensorInfo* qw, qweight(prefix));
    p.k = qw->shape[0] * 8;
    p.n = qw->shape[1];
    PAGELLM_RETURN_IF_ERROR(check_shape(prefix, p.n, p.k, p.group));
    const int64_t groups = p.k / p.group;
    if (const TensorInfo* gi = inner_->find(prefix + ".g_idx")) {
      PAGELLM_ASSIGN_OR_RETURN(gi, part(prefix + ".g_idx", DType::kI32, {p.k}));
      for (int64_t k = 0; k < p.k; ++k) {
        const int32_t g = load_at<int32_t>(gi->data, k);
        if (g < 0 || g >= groups)
          return data_loss(describe(gi->name) + " gives input " + std::to_string(k) +
                           " the group " + std::to_string(g) + " of " + std::to_string(groups));
        p.g_idx.push_back(g);
      }
      bool plain = true;
      for (int64_t k = 0; k < p.k && plain; ++k) plain = p.g_idx[k] == k / p.group;
      if (plain) p.g_idx.clear();
    }
    p.packing = Packing::kGptq;
    p.w = static_cast<const int32_t*>(qw->data);
    p.zero_plus = q_.gptq_zeros_minus_one ? 1 : 0;
    return read_zeros_and_scales(prefix, p);
  }

  Status read_ct(const std::string& prefix, PackedLinear& p) {
    const TensorInfo* wp = inner_->find(prefix + ".weight_packed");
    const TensorInfo* ws = inner_->find(prefix + ".weight_shape");
    if (!ws) return not_found(describe(prefix + ".weight_shape") + " is missing");
    if ((ws->dtype != DType::kI64 && ws->dtype != DType::kI32) ||
        ws->shape != std::vector<int64_t>{2})
      return data_loss(describe(ws->name) + " must hold the 2 integers [out, in]");
    if (ws->dtype == DType::kI64) {
      p.n = load_at<int64_t>(ws->data, 0), p.k = load_at<int64_t>(ws->data, 1);
    } else {
      p.n = load_at<int32_t>(ws->data, 0), p.k = load_at<int32_t>(ws->data, 1);
    }
    PAGELLM_RETURN_IF_ERROR(check_shape(prefix, p.n, p.k, p.group));
    const int64_t groups = p.k / p.group;
    PAGELLM_ASSIGN_OR_RETURN(wp, part(wp->name, DType::kI32, {p.n, p.k / 8}));
    PAGELLM_ASSIGN_OR_RETURN(p.scales, scales_f16(prefix + ".weight_scale", {p.n, groups}));
    p.packing = Packing::kCompressedTensors;
    p.w = static_cast<const int32_t*>(wp->data);
    if (q_.zero_point) {
      PAGELLM_ASSIGN_OR_RETURN(const TensorInfo* zp,
                               part(prefix + ".weight_zero_point", DType::kI32, {p.n / 8, groups}));
      p.z = static_cast<const int32_t*>(zp->data);
    } else if (inner_->find(prefix + ".weight_zero_point")) {
      return data_loss(describe(prefix + ".weight_zero_point") +
                       " is present but the scheme is symmetric");
    }
    return Status::ok_status();
  }

  static std::vector<uint16_t> transpose(const std::vector<uint16_t>& s, int64_t rows,
                                         int64_t cols) {
    std::vector<uint16_t> t(s.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = s[r * cols + c];
    return t;
  }

  Status add_unpacked(const std::string& prefix, const PackedLinear& p) {
    if (!p.g_idx.empty()) return add_act_order(prefix, p);
    const int g = p.group % 128 == 0 ? 128 : p.group % 64 == 0 ? 64 : 32;
    const DType dt = group_int4_dtype(g);
    const int64_t bytes = dtype_bytes(dt, p.n * p.k);
    auto buf = std::make_unique<uint8_t[]>(bytes);
    switch (g) {
      case 128:
        fill_blocks_of<128>(p, buf.get());
        break;
      case 64:
        fill_blocks_of<64>(p, buf.get());
        break;
      default:
        fill_blocks_of<32>(p, buf.get());
        break;
    }
    TensorInfo t;
    t.name = prefix + ".weight";
    t.dtype = dt;
    t.shape = {p.n, p.k};
    t.data = buf.get();
    t.nbytes = bytes;
    const TensorInfo* src = inner_->find(
        prefix + (q_.method == QuantMethod::kCompressedTensors ? ".weight_packed" : ".qweight"));
    t.file = src->file;
    add_converted(std::move(t), std::move(buf));
    return Status::ok_status();
  }

  // GPTQ act-order: inputs quantized in another order, so a block of consecutive inputs mixes
  // groups, which no I4G block holds. The weight becomes f32, s * (q - z) of each input's own
  // group exactly (4 bytes a weight: the 4-bit kernels need contiguous groups).
  Status add_act_order(const std::string& prefix, const PackedLinear& p) {
    PAGELLM_LOG_WARN("%s: GPTQ act-order (desc_act) permutes the inputs; loaded as f32 weights",
                     describe(prefix + ".g_idx").c_str());
    const int64_t groups = p.k / p.group, bytes = p.n * p.k * 4;
    auto buf = std::make_unique<uint8_t[]>(bytes);
    float* w = reinterpret_cast<float*>(buf.get());
    ThreadPool::global().parallel_for(p.n, 16, [&](int64_t nb, int64_t ne) {
      for (int64_t n = nb; n < ne; ++n)
        for (int64_t k = 0; k < p.k; ++k) {
          const int32_t g = p.g_idx[k];
          w[n * p.k + k] = f16_to_f32(p.scales[n * groups + g]) *
                           static_cast<float>(p.q<Packing::kGptq>(n, k) - p.zero<Packing::kGptq>(n, g));
        }
    });
    TensorInfo t;
    t.name = prefix + ".weight";
    t.dtype = DType::kF32;
    t.shape = {p.n, p.k};
    t.data = buf.get();
    t.nbytes = bytes;
    t.file = inner_->find(prefix + ".qweight")->file;
    add_converted(std::move(t), std::move(buf));
    return Status::ok_status();
  }

  QuantConfig q_;
};

template <int G>
void pack_awq_t(const float* w, int64_t n, int64_t k, AwqTensors& out) {
  const int64_t words = n / 8, groups = k / G;
  out.qweight.assign(k * words, 0);
  out.qzeros.assign(groups * words, 0);
  out.scales.assign(groups * n, 0);
  // Each task owns 8 outputs (one column of words), so no two write the same word.
  ThreadPool::global().parallel_for(words, 1, [&](int64_t cb, int64_t ce) {
    std::vector<BlockI4G<G>> row(groups);
    for (int64_t c = cb; c < ce; ++c)
      for (int j = 0; j < 8; ++j) {
        const int64_t r = 8 * c + j;
        from_f32(group_int4_dtype(G), w + r * k, row.data(), k);
        const int shift = 4 * kAwqNibble[j];
        for (int64_t g = 0; g < groups; ++g) {
          const BlockI4G<G>& b = row[g];
          out.scales[g * n + r] = b.d;
          out.qzeros[g * words + c] |= static_cast<int32_t>(static_cast<uint32_t>(b.z) << shift);
          for (int i = 0; i < G; ++i) {
            const int chunk = i / 32, l = i % 32;
            const uint8_t byte = b.qs[16 * chunk + (l & 15)];
            const uint32_t q = l < 16 ? (byte & 0xfu) : (byte >> 4);
            out.qweight[(g * G + i) * words + c] |= static_cast<int32_t>(q << shift);
          }
        }
      }
  });
}

}  // namespace

AwqTensors pack_awq(const float* w, int64_t n, int64_t k, int group) {
  PAGELLM_CHECK(n % 8 == 0 && (group == 32 || group == 64 || group == 128) && k % group == 0);
  AwqTensors out;
  switch (group) {
    case 32:
      pack_awq_t<32>(w, n, k, out);
      break;
    case 64:
      pack_awq_t<64>(w, n, k, out);
      break;
    default:
      pack_awq_t<128>(w, n, k, out);
      break;
  }
  return out;
}

Result<std::unique_ptr<WeightSource>> unpack_int4_weights(std::unique_ptr<WeightSource> packed,
                                                          const QuantConfig& q) {
  auto w = std::make_unique<UnpackedInt4Weights>(std::move(packed), q);
  PAGELLM_RETURN_IF_ERROR(w->unpack());
  return std::unique_ptr<WeightSource>(std::move(w));
}

}  // namespace pagellm
