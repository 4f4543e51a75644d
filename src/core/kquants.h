// GGUF's 5-bit and k-quant block formats, byte-exact as llama.cpp writes them, and their
// dequantization one 32-value chunk at a time (the unit core/dtype.cpp's to_f32 and the CPU
// kernels' decoders work in). Q5_0 / Q5_1 hold 32 values a block; the k-quants hold 256 in a
// super-block whose 32-value chunks (16-value halves for Q2_K, Q3_K and Q6_K) each have their own
// scale (and, for Q2_K / Q4_K / Q5_K, a minimum):
//   Q5_0  x = d * (q - 16)                   q: 4 low bits in qs, the 5th in qh
//   Q5_1  x = d * q + m
//   Q2_K  x = d * sc * q - dmin * mn         q: 2 bits; sc, mn: 4 bits each, per 16 values
//   Q3_K  x = d * (sc - 32) * (q - 4 * !h)   q: 2 bits + a high bit h in hmask; sc: 6 bits per 16
//   Q4_K  x = d * sc * q - dmin * mn         q: 4 bits; sc, mn: 6 bits each, per 32 values
//   Q5_K  the same with a 5th bit from qh
//   Q6_K  x = d * sc * (q - 32)              q: 4 bits in ql + 2 in qh; sc: int8 per 16 values
//   Q8_K  x = d * q                          d: f32, q: int8 (bsums unused here)
// The arithmetic is llama.cpp's dequantize_row_* order in f32 (d * sc first, then times q, less
// the minimum's product), so values equal the reference's.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace pagellm {

inline constexpr int kSuperBlock = 256;

#pragma pack(push, 1)
struct BlockQ5_0 {
  uint16_t d;  // f16
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d, m;  // f16
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ2_K {
  uint8_t scales[16];  // low nibble: scale, high nibble: min, per 16 values
  uint8_t qs[64];
  uint16_t d, dmin;  // f16
};
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];  // 16 6-bit scales
  uint16_t d;          // f16
};
struct BlockQ4_K {
  uint16_t d, dmin;    // f16
  uint8_t scales[12];  // 8 6-bit scales and 8 6-bit mins
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
#pragma pack(pop)
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockQ2_K) == 84 &&
              sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 &&
              sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

constexpr bool is_kquant(DType t) {
  return t == DType::kQ2_K || t == DType::kQ3_K || t == DType::kQ4_K || t == DType::kQ5_K ||
         t == DType::kQ6_K || t == DType::kQ8_K;
}

// Q4_K / Q5_K: the 6-bit scale and minimum of 32-value chunk c (0..7) from the 12 packed bytes.
// Static: each file gets its own copy, compiled with that file's instruction set (the CPU
// kernels' files are built for AVX2 and AVX-512; a shared inline copy could be either).
static inline void kquant_scale_min(const uint8_t* s, int c, int* scale, int* min) {
  if (c < 4) {
    *scale = s[c] & 63;
    *min = s[c + 4] & 63;
  } else {
    *scale = (s[c + 4] & 0xf) | ((s[c - 4] >> 6) << 4);
    *min = (s[c + 4] >> 4) | ((s[c] >> 6) << 4);
  }
}

// Values [32c, 32c + 32) of the block at `block` of type t (Q5_0, Q5_1 or a k-quant), in f32.
void dequantize_chunk(DType t, const void* block, int c, float* out);

}  // namespace pagellm
