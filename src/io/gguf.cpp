#include "io/gguf.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "core/check.h"
#include "io/file_util.h"

namespace pagellm {

static_assert(std::endian::native == std::endian::little,
              "GGUF values are read with memcpy; a big-endian host needs byte swaps");

namespace {

// Deepest array nesting accepted. llama.cpp itself writes no nested arrays; the bound keeps a
// hostile file from recursing the parser off the stack.
constexpr int kMaxArrayDepth = 8;
// Upper bound on tensor dimensions (GGML_MAX_DIMS).
constexpr uint32_t kMaxDims = 4;

// Block size and bytes per block for every ggml type id in use (ggml's type traits; ids 4, 5
// and 31..33 were removed from ggml and are rejected as unknown).
struct GgmlTypeTraits {
  uint32_t id;
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
};
constexpr int64_t kQK_K = 256;
constexpr GgmlTypeTraits kGgmlTypes[] = {
    {0, "f32", 1, 4},
    {1, "f16", 1, 2},
    {2, "q4_0", 32, 18},
    {3, "q4_1", 32, 20},
    {6, "q5_0", 32, 22},
    {7, "q5_1", 32, 24},
    {8, "q8_0", 32, 34},
    {9, "q8_1", 32, 40},
    {10, "q2_K", kQK_K, 2 + 2 + kQK_K / 16 + kQK_K / 4},
    {11, "q3_K", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + 12},
    {12, "q4_K", kQK_K, 2 + 2 + kQK_K / 2 + 12},
    {13, "q5_K", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 8 + 12},
    {14, "q6_K", kQK_K, 2 + kQK_K / 2 + kQK_K / 4 + kQK_K / 16},
    {15, "q8_K", kQK_K, 4 + kQK_K + kQK_K / 8},
    {16, "iq2_xxs", kQK_K, 2 + kQK_K / 4},
    {17, "iq2_xs", kQK_K, 2 + kQK_K / 4 + kQK_K / 32},
    {18, "iq3_xxs", kQK_K, 2 + kQK_K / 4 + kQK_K / 8},
    {19, "iq1_s", kQK_K, 2 + kQK_K / 8 + kQK_K / 16},
    {20, "iq4_nl", 32, 18},
    {21, "iq3_s", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + kQK_K / 32 + 4},
    {22, "iq2_s", kQK_K, 2 + kQK_K / 4 + kQK_K / 16},
    {23, "iq4_xs", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 64},
    {24, "i8", 1, 1},
    {25, "i16", 1, 2},
    {26, "i32", 1, 4},
    {27, "i64", 1, 8},
    {28, "f64", 1, 8},
    {29, "iq1_m", kQK_K, kQK_K / 8 + kQK_K / 16 + kQK_K / 32},
    {30, "bf16", 1, 2},
    {34, "tq1_0", kQK_K, 2 + 4 * 13},
    {35, "tq2_0", kQK_K, 2 + 64},
    {39, "mxfp4", 32, 17},
};

const GgmlTypeTraits* ggml_traits(uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (t.id == id) return &t;
  return nullptr;
}

// Bytes of one scalar of a fixed-size metadata type; 0 for string and array.
int64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Decodes an integer of type t at p. Values beyond int64 (a u64 above 2^63-1) set `too_big`.
int64_t load_integer(GgufType t, const uint8_t* p, bool& too_big) {
  too_big = false;
  switch (t) {
    case GgufType::kU8: return load<uint8_t>(p);
    case GgufType::kI8: return load<int8_t>(p);
    case GgufType::kU16: return load<uint16_t>(p);
    case GgufType::kI16: return load<int16_t>(p);
    case GgufType::kU32: return load<uint32_t>(p);
    case GgufType::kI32: return load<int32_t>(p);
    case GgufType::kI64: return load<int64_t>(p);
    case GgufType::kU64: {
      const uint64_t u = load<uint64_t>(p);
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        too_big = true;
        return 0;
      }
      return static_cast<int64_t>(u);
    }
    default: PAGELLM_CHECK_MSG(false, "load_integer on a non-integer type");
  }
  return 0;
}

double load_float(GgufType t, const uint8_t* p) {
  return t == GgufType::kF32 ? static_cast<double>(load<float>(p)) : load<double>(p);
}

// A bounds-checked cursor over the file image. Every read checks the bytes left first, so no read
// can leave the image whatever the counts and lengths in it say.
class Reader {
 public:
  Reader(const uint8_t* data, int64_t size) : data_(data), size_(size) {}
  int64_t pos() const { return pos_; }
  int64_t left() const { return size_ - pos_; }
  const uint8_t* here() const { return data_ + pos_; }

  bool skip(int64_t n) {
    if (n < 0 || n > left()) return false;
    pos_ += n;
    return true;
  }
  template <typename T>
  bool read(T& v) {
    if (static_cast<int64_t>(sizeof(T)) > left()) return false;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // A u64 length and that many bytes; the length is checked against the bytes left before any
  // allocation.
  bool read_string(std::string& s) {
    uint64_t n;
    if (!read(n)) return false;
    if (n > static_cast<uint64_t>(left())) return false;
    s.assign(reinterpret_cast<const char*>(here()), static_cast<size_t>(n));
    pos_ += static_cast<int64_t>(n);
    return true;
  }
  bool skip_string() {
    uint64_t n;
    if (!read(n)) return false;
    if (n > static_cast<uint64_t>(left())) return false;
    pos_ += static_cast<int64_t>(n);
    return true;
  }

 private:
  const uint8_t* data_;
  int64_t size_;
  int64_t pos_ = 0;
};

// Walks one value of type `t` (the type tag already read), checking that it lies inside the
// image. Returns an empty string on success, else what is wrong.
std::string skip_value(Reader& r, GgufType t, int depth) {
  if (static_cast<uint32_t>(t) >= kGgufTypeCount)
    return "unknown value type " + std::to_string(static_cast<uint32_t>(t));
  if (t == GgufType::kString) {
    if (!r.skip_string()) return "string runs past the end of the file";
    return {};
  }
  if (t == GgufType::kBool) {
    uint8_t b;
    if (!r.read(b)) return "bool runs past the end of the file";
    if (b > 1) return "bool has byte value " + std::to_string(b);
    return {};
  }
  if (t != GgufType::kArray) {
    if (!r.skip(scalar_size(t))) return std::string(gguf_type_name(t)) + " runs past the end of the file";
    return {};
  }
  if (depth >= kMaxArrayDepth) return "arrays nested deeper than " + std::to_string(kMaxArrayDepth);
  uint32_t et;
  uint64_t n;
  if (!r.read(et) || !r.read(n)) return "array header runs past the end of the file";
  if (et >= kGgufTypeCount) return "array of unknown element type " + std::to_string(et);
  const GgufType elem = static_cast<GgufType>(et);
  const int64_t esize = scalar_size(elem);
  if (esize > 0) {
    if (n > static_cast<uint64_t>(r.left() / esize))
      return "array of " + std::to_string(n) + " " + std::string(gguf_type_name(elem)) +
             " runs past the end of the file";
    if (elem == GgufType::kBool) {
      for (uint64_t i = 0; i < n; ++i)
        if (r.here()[i] > 1) return "bool array element " + std::to_string(i) + " is not 0 or 1";
    }
    r.skip(static_cast<int64_t>(n) * esize);
    return {};
  }
  // Strings take at least 8 bytes and arrays at least 12, so this loop ends within
  // size / 8 iterations however large n claims to be.
  for (uint64_t i = 0; i < n; ++i) {
    std::string err = skip_value(r, elem, depth + 1);
    if (!err.empty()) return "array element " + std::to_string(i) + ": " + err;
  }
  return {};
}

// a * b for non-negative values, false on overflow of int64.
bool mul_ok(int64_t a, int64_t b, int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

using io_detail::quote_name;

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "?";
}

std::string_view ggml_type_name(uint32_t type) {
  const GgmlTypeTraits* t = ggml_traits(type);
  return t ? t->name : "";
}

std::optional<DType> dtype_from_ggml(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: return DType::kF32;
    case GgmlType::kF16: return DType::kF16;
    case GgmlType::kBF16: return DType::kBF16;
    case GgmlType::kQ8_0: return DType::kQ8_0;
    case GgmlType::kQ4_0: return DType::kQ4_0;
    case GgmlType::kQ4_1: return DType::kQ4_1;
    case GgmlType::kQ5_0:
      return DType::kQ5_0;
    case GgmlType::kQ5_1:
      return DType::kQ5_1;
    case GgmlType::kQ2_K:
      return DType::kQ2_K;
    case GgmlType::kQ3_K:
      return DType::kQ3_K;
    case GgmlType::kQ4_K:
      return DType::kQ4_K;
    case GgmlType::kQ5_K:
      return DType::kQ5_K;
    case GgmlType::kQ6_K:
      return DType::kQ6_K;
    case GgmlType::kQ8_K:
      return DType::kQ8_K;
  }
  return std::nullopt;
}

std::optional<uint32_t> ggml_from_dtype(DType t) {
  switch (t) {
    case DType::kF32: return static_cast<uint32_t>(GgmlType::kF32);
    case DType::kF16: return static_cast<uint32_t>(GgmlType::kF16);
    case DType::kBF16: return static_cast<uint32_t>(GgmlType::kBF16);
    case DType::kQ8_0: return static_cast<uint32_t>(GgmlType::kQ8_0);
    case DType::kQ4_0: return static_cast<uint32_t>(GgmlType::kQ4_0);
    case DType::kQ4_1: return static_cast<uint32_t>(GgmlType::kQ4_1);
    case DType::kQ5_0:
      return static_cast<uint32_t>(GgmlType::kQ5_0);
    case DType::kQ5_1:
      return static_cast<uint32_t>(GgmlType::kQ5_1);
    case DType::kQ2_K:
      return static_cast<uint32_t>(GgmlType::kQ2_K);
    case DType::kQ3_K:
      return static_cast<uint32_t>(GgmlType::kQ3_K);
    case DType::kQ4_K:
      return static_cast<uint32_t>(GgmlType::kQ4_K);
    case DType::kQ5_K:
      return static_cast<uint32_t>(GgmlType::kQ5_K);
    case DType::kQ6_K:
      return static_cast<uint32_t>(GgmlType::kQ6_K);
    case DType::kQ8_K:
      return static_cast<uint32_t>(GgmlType::kQ8_K);
    case DType::kI32: case DType::kI64: return std::nullopt;
    case DType::kI4G32:
    case DType::kI4G64:
    case DType::kI4G128:
    case DType::kF8E4M3:
    case DType::kF8B32:
    case DType::kF8G128:
    case DType::kF8Row:
      return std::nullopt;  // no GGUF type
  }
  return std::nullopt;
}

// ------------------------------------------------------------------------------------------------
// GgufFile: parsing and validation

Result<GgufFile> GgufFile::open(const std::string& path) {
  PAGELLM_ASSIGN_OR_RETURN(MappedFile mf, MappedFile::open(path));
  GgufFile f;
  f.data_ = mf.data();
  f.size_ = mf.size();
  f.path_ = path;
  f.file_ = std::move(mf);  // the mapping's address does not change on move
  PAGELLM_RETURN_IF_ERROR(f.parse_header());
  return f;
}

Result<GgufFile> GgufFile::parse(const uint8_t* data, int64_t size, std::string name) {
  GgufFile f;
  f.data_ = data;
  f.size_ = size;
  f.path_ = std::move(name);
  PAGELLM_RETURN_IF_ERROR(f.parse_header());
  return f;
}

Status GgufFile::parse_header() {
  const std::string& p = path_;
  Reader r(data_, size_);
  uint32_t magic = 0, version = 0;
  if (!r.read(magic)) return invalid_argument(p + ": not a GGUF file (shorter than its magic)");
  if (magic != kGgufMagic) return invalid_argument(p + ": not a GGUF file (bad magic)");
  if (!r.read(version)) return data_loss(p + ": truncated GGUF header (version)");
  if (version == 0x02000000u || version == 0x03000000u)
    return unimplemented(p + ": big-endian GGUF files are not supported");
  if (version == 1)
    return unimplemented(p + ": GGUF version 1 is not supported (re-convert with a current llama.cpp)");
  if (version != 2 && version != 3)
    return unimplemented(p + ": unsupported GGUF version " + std::to_string(version));
  version_ = version;

  uint64_t n_tensors = 0, n_kv = 0;
  if (!r.read(n_tensors) || !r.read(n_kv)) return data_loss(p + ": truncated GGUF header (counts)");
  // A metadata entry takes at least 13 bytes (key length, type, 1-byte value) and a tensor info
  // at least 32 (name length, n_dims, one dim, type, offset): counts beyond that cannot fit.
  if (n_kv > static_cast<uint64_t>(r.left() / 13))
    return data_loss(p + ": metadata count " + std::to_string(n_kv) + " runs past the end of the file");
  if (n_tensors > static_cast<uint64_t>(r.left() / 32))
    return data_loss(p + ": tensor count " + std::to_string(n_tensors) + " runs past the end of the file");

  kvs_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKv kv;
    if (!r.read_string(kv.key))
      return data_loss(p + ": metadata key #" + std::to_string(i) + " runs past the end of the file");
    if (kv.key.empty()) return data_loss(p + ": metadata key #" + std::to_string(i) + " is empty");
    const std::string where = p + ": metadata key " + quote_name(kv.key);
    uint32_t type;
    if (!r.read(type)) return data_loss(where + ": value type runs past the end of the file");
    if (type >= kGgufTypeCount)
      return data_loss(where + ": unknown value type " + std::to_string(type));
    kv.type = static_cast<GgufType>(type);
    const int64_t start = r.pos();
    if (kv.type == GgufType::kArray) {
      // Peek the element type and count; skip_value below validates them.
      uint32_t et = 0;
      uint64_t n = 0;
      if (r.left() >= 12) {
        std::memcpy(&et, r.here(), 4);
        std::memcpy(&n, r.here() + 4, 8);
      }
      kv.elem_type = static_cast<GgufType>(et);
      kv.n_elems = n;
      kv.value_offset = start + 12;
    } else {
      kv.value_offset = start;
    }
    std::string err = skip_value(r, kv.type, 0);
    if (!err.empty()) return data_loss(where + ": " + err);
    if (kv_index_.count(kv.key))
      return data_loss(p + ": duplicate metadata key " + quote_name(kv.key));
    kv_index_.emplace(kv.key, kvs_.size());
    kvs_.push_back(std::move(kv));
  }

  if (const GgufKv* kv = find_kv("general.alignment")) {
    if (kv->type != GgufType::kU32)
      return data_loss(p + ": metadata key 'general.alignment' has type " +
                       std::string(gguf_type_name(kv->type)) + ", expected u32");
    const uint32_t a = load<uint32_t>(data_ + kv->value_offset);
    if (a == 0 || (a & (a - 1)) != 0)
      return data_loss(p + ": metadata key 'general.alignment' = " + std::to_string(a) +
                       " is not a power of two");
    alignment_ = a;
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    if (!r.read_string(t.name))
      return data_loss(p + ": tensor info #" + std::to_string(i) + " name runs past the end of the file");
    if (t.name.empty()) return data_loss(p + ": tensor info #" + std::to_string(i) + " has an empty name");
    const std::string where = p + ": tensor " + quote_name(t.name);
    uint32_t n_dims;
    if (!r.read(n_dims)) return data_loss(where + ": n_dims runs past the end of the file");
    if (n_dims == 0 || n_dims > kMaxDims)
      return data_loss(where + ": n_dims = " + std::to_string(n_dims) + " (expected 1.." +
                       std::to_string(kMaxDims) + ")");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim;
      if (!r.read(dim)) return data_loss(where + ": dims run past the end of the file");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          !mul_ok(numel, static_cast<int64_t>(dim), numel))
        return data_loss(where + ": element count overflows");
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    if (!r.read(t.ggml_type)) return data_loss(where + ": type runs past the end of the file");
    const GgmlTypeTraits* traits = ggml_traits(t.ggml_type);
    if (!traits) return data_loss(where + ": unknown ggml type " + std::to_string(t.ggml_type));
    uint64_t offset;
    if (!r.read(offset)) return data_loss(where + ": offset runs past the end of the file");
    if (offset > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return data_loss(where + ": offset " + std::to_string(offset) + " is beyond the file");
    t.offset = static_cast<int64_t>(offset);
    if (t.dims[0] % traits->block_elems != 0)
      return data_loss(where + ": row length " + std::to_string(t.dims[0]) + " is not a multiple of " +
                       traits->name + "'s block of " + std::to_string(traits->block_elems));
    // numel / block_elems blocks; the division is exact because dims[0] is a block multiple.
    if (!mul_ok(numel / traits->block_elems, traits->block_bytes, t.nbytes))
      return data_loss(where + ": byte size overflows");
    if (tensor_index_.count(t.name))
      return data_loss(p + ": duplicate tensor name " + quote_name(t.name));
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (the padding may be cut short
  // in a file that holds no tensor bytes).
  const int64_t pos = r.pos();
  data_offset_ = pos + (alignment_ - pos % alignment_) % alignment_;
  const int64_t data_bytes = size_ >= data_offset_ ? size_ - data_offset_ : 0;
  for (GgufTensor& t : tensors_) {
    const std::string where = p + ": tensor " + quote_name(t.name);
    if (t.offset % alignment_ != 0)
      return data_loss(where + ": offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                       std::to_string(alignment_));
    if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset)
      return data_loss(where + ": bytes [" + std::to_string(t.offset) + ", " +
                       std::to_string(static_cast<uint64_t>(t.offset) + static_cast<uint64_t>(t.nbytes)) +
                       ") run past the end of the data section (" + std::to_string(data_bytes) + " bytes)");
    // An empty tensor at the very end may sit past a padding the file cut short: keep its
    // pointer inside (or one past) the image.
    t.data = data_ + std::min(data_offset_ + t.offset, size_);
  }
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  const GgufTensor* prev = nullptr;
  for (size_t i : order) {
    const GgufTensor& t = tensors_[i];
    if (t.nbytes == 0) continue;
    if (prev && t.offset < prev->offset + prev->nbytes)
      return data_loss(p + ": tensors " + quote_name(prev->name) + " and " + quote_name(t.name) +
                       " overlap");
    prev = &t;
  }
  return Status::ok_status();
}

// ------------------------------------------------------------------------------------------------
// GgufFile: metadata access

const GgufKv* GgufFile::find_kv(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<const GgufKv*> GgufFile::lookup(const std::string& key) const {
  const GgufKv* kv = find_kv(key);
  if (!kv) return not_found(path_ + ": metadata key " + quote_name(key) + " not found");
  return kv;
}

Status GgufFile::type_error(const GgufKv& kv, const char* expected) const {
  std::string actual(gguf_type_name(kv.type));
  if (kv.type == GgufType::kArray) actual += " of " + std::string(gguf_type_name(kv.elem_type));
  return invalid_argument(path_ + ": metadata key " + quote_name(kv.key) + " has type " + actual +
                          ", expected " + expected);
}

Result<std::string> GgufFile::get_string(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(const GgufKv* kv, lookup(key));
  if (kv->type != GgufType::kString) return type_error(*kv, "string");
  const uint64_t n = load<uint64_t>(data_ + kv->value_offset);
  return std::string(reinterpret_cast<const char*>(data_ + kv->value_offset + 8), n);
}

Result<int64_t> GgufFile::get_i64(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(const GgufKv* kv, lookup(key));
  if (!is_integer(kv->type)) return type_error(*kv, "an integer");
  bool too_big;
  const int64_t v = load_integer(kv->type, data_ + kv->value_offset, too_big);
  if (too_big)
    return out_of_range(path_ + ": metadata key " + quote_name(key) + " = " +
                        std::to_string(load<uint64_t>(data_ + kv->value_offset)) +
                        " does not fit i64");
  return v;
}

Result<uint32_t> GgufFile::get_u32(const std::string& key) const {
  auto v = get_i64(key);
  if (!v.ok() && v.status().code() == StatusCode::kOutOfRange)
    return out_of_range(v.status().message() + " (expected u32)");
  if (!v.ok()) return v.status();
  if (*v < 0 || *v > std::numeric_limits<uint32_t>::max())
    return out_of_range(path_ + ": metadata key " + quote_name(key) + " = " + std::to_string(*v) +
                        " does not fit u32");
  return static_cast<uint32_t>(*v);
}

Result<double> GgufFile::get_f64(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(const GgufKv* kv, lookup(key));
  if (kv->type != GgufType::kF32 && kv->type != GgufType::kF64) return type_error(*kv, "f32 or f64");
  return load_float(kv->type, data_ + kv->value_offset);
}

Result<float> GgufFile::get_f32(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(double v, get_f64(key));
  return static_cast<float>(v);
}

Result<bool> GgufFile::get_bool(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(const GgufKv* kv, lookup(key));
  if (kv->type != GgufType::kBool) return type_error(*kv, "bool");
  return data_[kv->value_offset] != 0;
}

Result<uint64_t> GgufFile::get_array_size(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(const GgufKv* kv, lookup(key));
  if (kv->type != GgufType::kArray) return type_error(*kv, "an array");
  return kv->n_elems;
}

Result<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(const GgufKv* kv, lookup(key));
  if (kv->type != GgufType::kArray || kv->elem_type != GgufType::kString)
    return type_error(*kv, "array of string");
  // Validated at open: n_elems strings follow, each inside the file.
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(kv->n_elems));
  const uint8_t* q = data_ + kv->value_offset;
  for (uint64_t i = 0; i < kv->n_elems; ++i) {
    const uint64_t n = load<uint64_t>(q);
    out.emplace_back(reinterpret_cast<const char*>(q + 8), n);
    q += 8 + n;
  }
  return out;
}

Result<std::vector<int32_t>> GgufFile::get_i32_array(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(const GgufKv* kv, lookup(key));
  if (kv->type != GgufType::kArray || !is_integer(kv->elem_type))
    return type_error(*kv, "array of integers");
  const int64_t esize = scalar_size(kv->elem_type);
  std::vector<int32_t> out(static_cast<size_t>(kv->n_elems));
  for (uint64_t i = 0; i < kv->n_elems; ++i) {
    bool too_big;
    const int64_t v = load_integer(kv->elem_type, data_ + kv->value_offset + i * esize, too_big);
    if (too_big || v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      return out_of_range(path_ + ": metadata key " + quote_name(key) + " element " +
                          std::to_string(i) + " does not fit i32");
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

Result<std::vector<float>> GgufFile::get_f32_array(const std::string& key) const {
  PAGELLM_ASSIGN_OR_RETURN(const GgufKv* kv, lookup(key));
  if (kv->type != GgufType::kArray ||
      (kv->elem_type != GgufType::kF32 && kv->elem_type != GgufType::kF64))
    return type_error(*kv, "array of f32 or f64");
  const int64_t esize = scalar_size(kv->elem_type);
  std::vector<float> out(static_cast<size_t>(kv->n_elems));
  for (uint64_t i = 0; i < kv->n_elems; ++i)
    out[i] = static_cast<float>(load_float(kv->elem_type, data_ + kv->value_offset + i * esize));
  return out;
}

namespace {

// Renders the value of type t at q (validated at open); advances q past it.
void render_value(std::string& out, GgufType t, const uint8_t*& q, size_t max_elems) {
  switch (t) {
    case GgufType::kString: {
      const uint64_t n = load<uint64_t>(q);
      std::string_view s(reinterpret_cast<const char*>(q + 8), n);
      out += quote_name(s.substr(0, 120));
      if (n > 120) out.insert(out.size() - 1, "...");
      q += 8 + n;
      return;
    }
    case GgufType::kBool: out += *q ? "true" : "false"; q += 1; return;
    case GgufType::kF32: case GgufType::kF64: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.9g", load_float(t, q));
      out += buf;
      q += scalar_size(t);
      return;
    }
    case GgufType::kU64:
      out += std::to_string(load<uint64_t>(q));
      q += 8;
      return;
    case GgufType::kArray: {
      const auto et = static_cast<GgufType>(load<uint32_t>(q));
      const uint64_t n = load<uint64_t>(q + 4);
      q += 12;
      out += "[";
      for (uint64_t i = 0; i < n; ++i) {
        if (i < max_elems) {
          if (i) out += ", ";
          render_value(out, et, q, max_elems);
        } else if (scalar_size(et) > 0) {  // fixed-size rest: jump over it
          q += (n - i) * scalar_size(et);
          break;
        } else {
          std::string sink;
          render_value(sink, et, q, 0);
        }
      }
      if (n > max_elems) out += ", ... (" + std::to_string(n) + " " + std::string(gguf_type_name(et)) + ")";
      out += "]";
      return;
    }
    default: {
      bool too_big;
      out += std::to_string(load_integer(t, q, too_big));
      q += scalar_size(t);
      return;
    }
  }
}

}  // namespace

std::string GgufFile::value_to_string(const GgufKv& kv, size_t max_elems) const {
  std::string out;
  const uint8_t* q = data_ + kv.value_offset - (kv.type == GgufType::kArray ? 12 : 0);
  render_value(out, kv.type, q, max_elems);
  return out;
}

// ------------------------------------------------------------------------------------------------
// Names, permutation, weight source

std::optional<std::string> gguf_to_hf_name(std::string_view name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  constexpr std::string_view kBlk = "blk.";
  if (name.substr(0, kBlk.size()) != kBlk) return std::nullopt;
  std::string_view rest = name.substr(kBlk.size());
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos) return std::nullopt;
  const std::string_view layer = rest.substr(0, dot);
  for (char c : layer)
    if (c < '0' || c > '9') return std::nullopt;
  if (layer.size() > 1 && layer[0] == '0') return std::nullopt;
  rest = rest.substr(dot + 1);  // e.g. "attn_q.weight"
  const size_t dot2 = rest.rfind('.');
  if (dot2 == std::string_view::npos) return std::nullopt;
  const std::string_view part = rest.substr(0, dot2);
  const std::string_view suffix = rest.substr(dot2 + 1);
  if (suffix != "weight" && suffix != "bias") return std::nullopt;
  static constexpr std::pair<std::string_view, std::string_view> kParts[] = {
      {"attn_norm", "input_layernorm"},
      {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},
      {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  for (const auto& [g, hf] : kParts) {
    if (part == g)
      return "model.layers." + std::string(layer) + "." + std::string(hf) + "." + std::string(suffix);
  }
  return std::nullopt;
}

void unpermute_qk_rows(const uint8_t* src, uint8_t* dst, int64_t n_rows, int64_t row_bytes,
                       int64_t n_head) {
  PAGELLM_CHECK(n_head > 0 && n_rows % (2 * n_head) == 0);
  const int64_t d = n_rows / n_head;  // rows per head
  const int64_t half = d / 2;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t stored = h * d + 2 * i + j;
        const int64_t hf = h * d + j * half + i;
        std::memcpy(dst + hf * row_bytes, src + stored * row_bytes, static_cast<size_t>(row_bytes));
      }
}

Result<std::unique_ptr<GgufWeightSource>> GgufWeightSource::create(
    std::shared_ptr<const GgufFile> file, const GgufWeightOptions& options) {
  PAGELLM_CHECK(file != nullptr);
  std::unique_ptr<GgufWeightSource> ws(new GgufWeightSource());
  ws->file_ = std::move(file);
  const GgufFile& f = *ws->file_;
  for (const GgufTensor& t : f.tensors()) {
    // llama3 rope factors are folded into ModelConfig::rope by gguf_model_config.
    if (t.name == "rope_freqs.weight") continue;
    const std::string where = f.path() + ": tensor " + quote_name(t.name);
    std::optional<std::string> hf = gguf_to_hf_name(t.name);
    if (!hf) return unimplemented(where + " has no Hugging Face counterpart (not a Llama/Qwen2/Qwen3 tensor)");
    std::optional<DType> dt = dtype_from_ggml(t.ggml_type);
    if (!dt) {
      return unimplemented(where + " has ggml type " + std::string(ggml_type_name(t.ggml_type)) +
                           ", which pagellm does not compute with (supported: f32 f16 bf16 q8_0 q4_0 q4_1)");
    }
    TensorInfo info;
    info.name = *hf;
    info.dtype = *dt;
    info.shape.assign(t.dims.rbegin(), t.dims.rend());  // torch order: slowest first
    info.data = t.data;
    info.nbytes = t.nbytes;
    info.file = f.path();

    const bool is_q = hf->find(".self_attn.q_proj.") != std::string::npos;
    const bool is_k = hf->find(".self_attn.k_proj.") != std::string::npos;
    if (options.unpermute_qk && (is_q || is_k)) {
      const int64_t n_head = is_q ? options.n_head : options.n_head_kv;
      const int64_t n_rows = info.shape[0];
      const int64_t row_bytes = n_rows > 0 ? t.nbytes / n_rows : 0;
      if (n_head <= 0 || n_rows % (2 * n_head) != 0)
        return invalid_argument(where + ": " + std::to_string(n_rows) + " rows do not split into " +
                                std::to_string(n_head) + " heads of even size");
      auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(t.nbytes));
      unpermute_qk_rows(t.data, buf.get(), n_rows, row_bytes, n_head);
      info.data = buf.get();
      ws->owned_.push_back(std::move(buf));
    }
    ws->index_.emplace(info.name, ws->tensors_.size());
    ws->tensors_.push_back(std::move(info));
  }
  return ws;
}

const TensorInfo* GgufWeightSource::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::string GgufWeightSource::description() const {
  return file_->path() + " (GGUF v" + std::to_string(file_->version()) + ", " +
         std::to_string(tensors_.size()) + " tensors)";
}

}  // namespace pagellm
