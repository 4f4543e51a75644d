// Element types and their conversions. Quantized types are block formats: a block of
// block_elems() values stored in block_bytes() bytes, rows always a whole number of blocks. The
// Q types are GGUF's (32 values a block; the k-quants 256); the I4G types hold the 4-bit
// group-quantized weights of AWQ, GPTQ and compressed-tensors checkpoints, one group a block;
// F8B32 holds FP8 (e4m3) checkpoints' weights with their scales, 32 values a block; F8G128 is
// the same with one scale per 128 values, which every FP8 scheme's scales are constant over (per
// tensor, per channel, 128 x 128 blocks): the CUDA backend keeps FP8 weights in it, and in F8Row
// (the same blocks) where a row's scales are all one, which its FP8 GEMM runs faster.
// F8_E4M3 is the plain FP8 element as safetensors stores it, read only to build F8B32 blocks.
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
  // G x 4-bit + f16 scale + 4-bit zero point: x = d * (q - z)        (4 + G/2 bytes / G values)
  kI4G32,
  kI4G64,
  kI4G128,
  // GGUF's 5-bit types (32 values a block) and k-quants (256): layouts in core/kquants.h.
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_K,
  kF8E4M3,  // one float8_e4m3fn (FP8 checkpoints' raw weights; no op reads it)
  kF8B32,   // 32 x float8_e4m3fn + f32 scale: x = d * e4m3(q)        (36 bytes / 32 values)
  kF8G128,  // 128 x float8_e4m3fn + f32 scale: x = d * e4m3(q)     (132 bytes / 128 values)
  kF8Row,   // F8G128 whose scales are one per row (per tensor or per channel), the same bytes
};

inline constexpr int kQuantBlock = 32;

constexpr bool is_group_int4(DType t) {
  return t == DType::kI4G32 || t == DType::kI4G64 || t == DType::kI4G128;
}
constexpr bool is_quantized(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3:
      return false;
    default:
      return true;
  }
}
// Number of values in one storage block (1 for plain types). Every quantized block is a whole
// number of 32-value chunks, the unit the kernels decode.
constexpr int block_elems(DType t) {
  switch (t) {
    case DType::kI4G64:
      return 64;
    case DType::kI4G128:
    case DType::kF8G128:
    case DType::kF8Row:
      return 128;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ8_K:
      return 256;
    default:
      return is_quantized(t) ? kQuantBlock : 1;
  }
}
// The I4G type of group size g (32, 64 or 128); kF32 for any other g.
constexpr DType group_int4_dtype(int64_t g) {
  return g == 32    ? DType::kI4G32
         : g == 64  ? DType::kI4G64
         : g == 128 ? DType::kI4G128
                    : DType::kF32;
}
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
    case DType::kI4G32:
      return 4 + 16;
    case DType::kI4G64:
      return 4 + 32;
    case DType::kI4G128:
      return 4 + 64;
    case DType::kQ5_0:
      return 22;
    case DType::kQ5_1:
      return 24;
    case DType::kQ2_K:
      return 84;
    case DType::kQ3_K:
      return 110;
    case DType::kQ4_K:
      return 144;
    case DType::kQ5_K:
      return 176;
    case DType::kQ6_K:
      return 210;
    case DType::kQ8_K:
      return 292;
    case DType::kF8E4M3:
      return 1;
    case DType::kF8B32:
      return 4 + 32;
    case DType::kF8G128:
    case DType::kF8Row:
      return 4 + 128;
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
// float8_e4m3fn (torch's and the FP8 checkpoints'): 1 sign, 4 exponent (bias 7), 3 mantissa bits,
// subnormals, no infinities, S.1111.111 is NaN, 448 the largest finite value. Rounding is to
// nearest even; values past 448 saturate to +-448 (the checkpoint writers scale into range first).
float e4m3_to_f32(uint8_t q);
uint8_t f32_to_e4m3(float f);

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

// One group of an I4G type: G 4-bit values, its scale and its zero point. The zero point is kept
// as the integer the checkpoint stores (not folded into an f16 offset), so d * (q - z) in f32 is
// exactly the value the checkpoint's own dequantization gives before any rounding to 16 bits.
// Within each 32-value chunk c the nibbles are laid out as Q4_0's: value 32c + j in the low
// nibble of qs[16c + j], value 32c + j + 16 in its high nibble. 4-byte aligned.
template <int G>
struct BlockI4G {
  uint16_t d;   // f16 scale
  uint8_t z;    // zero point, 0..15
  uint8_t pad;  // 0
  uint8_t qs[G / 2];
};
static_assert(sizeof(BlockI4G<32>) == 20 && sizeof(BlockI4G<64>) == 36 &&
              sizeof(BlockI4G<128>) == 68);

// 32 FP8 values and the scale their checkpoint gives them (a 128 x 128 block's, a row's or the
// tensor's): d * e4m3_to_f32(q) in f32 is the value the checkpoint's own dequantization gives.
struct BlockF8B32 {
  float d;
  uint8_t q[32];
};
static_assert(sizeof(BlockF8B32) == 36);
// F8G128's block: the same with 128 values.
struct BlockF8G128 {
  float d;
  uint8_t q[128];
};
static_assert(sizeof(BlockF8G128) == 132);

// Converts n values of type `t` starting at `src` to f32 (n a multiple of block_elems(t)).
void to_f32(DType t, const void* src, float* dst, int64_t n);
// Converts n f32 values into type `t` (quantizing blockwise for quantized types: as ggml does for
// Q8_0, Q4_0 and Q4_1; for I4G, round-to-nearest with the group's min and max, as AWQ's quantizer
// does; for F8B32 and F8G128, the block's largest magnitude to 448). The 5-bit and k-quant types
// are only read (llama.cpp's quantizer writes them).
void from_f32(DType t, const float* src, void* dst, int64_t n);

}  // namespace pagellm
