// A small GGUF writer for tests: builds a file image byte by byte, with hooks to write exactly the
// malformed headers the reader must refuse (wrong counts, offsets, types).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"

namespace pagellm::testing {

using Bytes = std::vector<uint8_t>;

template <typename T>
void put(Bytes& b, T v) {
  const size_t n = b.size();
  b.resize(n + sizeof(T));
  std::memcpy(b.data() + n, &v, sizeof(T));
}
inline void put_str(Bytes& b, std::string_view s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
inline void put_bytes(Bytes& b, const Bytes& more) { b.insert(b.end(), more.begin(), more.end()); }

class GgufBuilder {
 public:
  struct TensorSpec {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> dims;  // GGUF order, fastest first
    Bytes data;
    std::optional<uint64_t> offset;  // default: packed in order, aligned
    std::optional<uint32_t> n_dims;  // default: dims.size()
  };

  uint32_t magic = kGgufMagic;
  uint32_t version = 3;
  std::optional<uint64_t> n_kv_override;
  std::optional<uint64_t> n_tensors_override;
  uint64_t alignment = 32;  // layout only; general.alignment is written by set_alignment
  std::vector<TensorSpec> tensors;

  // A metadata entry with an arbitrary type tag and raw value bytes.
  GgufBuilder& kv_raw(std::string_view key, uint32_t type, const Bytes& value) {
    put_str(kvs_, key);
    put<uint32_t>(kvs_, type);
    put_bytes(kvs_, value);
    ++n_kv_;
    return *this;
  }
  template <typename T>
  GgufBuilder& kv(std::string_view key, GgufType type, T v) {
    Bytes b;
    put<T>(b, v);
    return kv_raw(key, static_cast<uint32_t>(type), b);
  }
  GgufBuilder& kv_str(std::string_view key, std::string_view s) {
    Bytes b;
    put_str(b, s);
    return kv_raw(key, static_cast<uint32_t>(GgufType::kString), b);
  }
  template <typename T>
  static Bytes array_value(GgufType elem, const std::vector<T>& v) {
    Bytes b;
    put<uint32_t>(b, static_cast<uint32_t>(elem));
    put<uint64_t>(b, v.size());
    for (const T& x : v) put<T>(b, x);
    return b;
  }
  static Bytes string_array_value(const std::vector<std::string>& v) {
    Bytes b;
    put<uint32_t>(b, static_cast<uint32_t>(GgufType::kString));
    put<uint64_t>(b, v.size());
    for (const auto& s : v) put_str(b, s);
    return b;
  }
  template <typename T>
  GgufBuilder& kv_arr(std::string_view key, GgufType elem, const std::vector<T>& v) {
    return kv_raw(key, static_cast<uint32_t>(GgufType::kArray), array_value(elem, v));
  }
  GgufBuilder& kv_str_arr(std::string_view key, const std::vector<std::string>& v) {
    return kv_raw(key, static_cast<uint32_t>(GgufType::kArray), string_array_value(v));
  }
  GgufBuilder& set_alignment(uint32_t a) {
    alignment = a;
    return kv<uint32_t>("general.alignment", GgufType::kU32, a);
  }
  GgufBuilder& tensor(std::string name, uint32_t type, std::vector<uint64_t> dims, Bytes data) {
    tensors.push_back({std::move(name), type, std::move(dims), std::move(data), std::nullopt, std::nullopt});
    return *this;
  }

  Bytes build() const {
    Bytes b;
    put<uint32_t>(b, magic);
    put<uint32_t>(b, version);
    put<uint64_t>(b, n_tensors_override.value_or(tensors.size()));
    put<uint64_t>(b, n_kv_override.value_or(n_kv_));
    put_bytes(b, kvs_);
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors) {
      const uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = align(off + t.data.size());
      put_str(b, t.name);
      put<uint32_t>(b, t.n_dims.value_or(static_cast<uint32_t>(t.dims.size())));
      for (uint64_t d : t.dims) put<uint64_t>(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, off);
    }
    if (tensors.empty()) return b;
    b.resize(align(b.size()), 0);
    const size_t data_start = b.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t at = data_start + offsets[i];
      if (offsets[i] > (uint64_t{1} << 28)) continue;  // a deliberately far offset: leave the file short
      if (b.size() < at + tensors[i].data.size()) b.resize(at + tensors[i].data.size(), 0);
      std::memcpy(b.data() + at, tensors[i].data.data(), tensors[i].data.size());
    }
    return b;
  }

 private:
  uint64_t align(uint64_t x) const { return (x + alignment - 1) / alignment * alignment; }
  Bytes kvs_;
  uint64_t n_kv_ = 0;
};

}  // namespace pagellm::testing
