// Element types and their conversions. Quantized types are GGUF's block formats: a block of
// kBlockElems values stored in block_bytes() bytes, rows always a whole number of blocks.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace pagellm {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,
  kI64,
  kQ8_0,  // 32 x int8 + f16 scale: x = d * q                       (34 bytes / 32 values)
  kQ4_0,  // 32 x 4-bit + f16 scale: x = d * (q - 8)                (18 bytes / 32 values)
  kQ4_1,  // 32 x 4-bit + f16 scale + f16 min: x = d * q + m        (20 bytes / 32 values)
};

inline constexpr int kQuantBlock = 32;

constexpr bool is_quantized(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1;
}
// Number of values in one storage block (1 for plain types).
constexpr int block_elems(DType t) { return is_quantized(t) ? kQuantBlock : 1; }
// Bytes of one storage block.
constexpr int block_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kQ8_0: return 34;
    case DType::kQ4_0: return 18;
    case DType::kQ4_1: return 20;
  }
  return 0;
}
// Bytes for n values; n must be a multiple of block_elems(t).
constexpr int64_t dtype_bytes(DType t, int64_t n) { return n / block_elems(t) * block_bytes(t); }

std::string_view dtype_name(DType t);

// --- scalar conversions (round-to-nearest-even, as torch does) ---

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Block layouts (GGUF's, byte-exact).
#pragma pack(push, 1)
struct BlockQ8_0 {
  uint16_t d;  // f16
  int8_t qs[kQuantBlock];
};
struct BlockQ4_0 {
  uint16_t d;  // f16
  uint8_t qs[kQuantBlock / 2];  // value j in low nibble of qs[j], value j+16 in high nibble
};
struct BlockQ4_1 {
  uint16_t d;  // f16
  uint16_t m;  // f16
  uint8_t qs[kQuantBlock / 2];
};
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);

// Converts n values of type `t` starting at `src` to f32 (n a multiple of block_elems(t)).
void to_f32(DType t, const void* src, float* dst, int64_t n);
// Converts n f32 values into type `t` (quantizing blockwise for quantized types, as ggml does).
void from_f32(DType t, const float* src, void* dst, int64_t n);

}  // namespace pagellm
