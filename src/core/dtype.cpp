#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/kquants.h"

namespace pagellm {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_1: return "q4_1";
    case DType::kI4G32:
      return "i4g32";
    case DType::kI4G64:
      return "i4g64";
    case DType::kI4G128:
      return "i4g128";
    case DType::kQ5_0:
      return "q5_0";
    case DType::kQ5_1:
      return "q5_1";
    case DType::kQ2_K:
      return "q2_K";
    case DType::kQ3_K:
      return "q3_K";
    case DType::kQ4_K:
      return "q4_K";
    case DType::kQ5_K:
      return "q5_K";
    case DType::kQ6_K:
      return "q6_K";
    case DType::kQ8_K:
      return "q8_K";
    case DType::kF8E4M3:
      return "f8_e4m3";
    case DType::kF8B32:
      return "f8b32";
    case DType::kF8G128:
      return "f8g128";
    case DType::kF8Row:
      return "f8row";
  }
  return "?";
}

namespace {

// The FP8 block types (F8B32, F8G128): x = d * e4m3(q); written with the block's largest
// magnitude mapped to 448.
template <typename Block, int N>
void f8_to_f32(const void* src, float* dst, int64_t n) {
  auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / N; ++i)
    for (int j = 0; j < N; ++j) dst[i * N + j] = b[i].d * e4m3_to_f32(b[i].q[j]);
}
template <typename Block, int N>
void f8_from_f32(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / N; ++i) {
    const float* x = src + i * N;
    float amax = 0.0f;
    for (int j = 0; j < N; ++j) amax = std::max(amax, std::fabs(x[j]));
    b[i].d = amax / 448.0f;
    for (int j = 0; j < N; ++j) b[i].q[j] = b[i].d > 0.0f ? f32_to_e4m3(x[j] / b[i].d) : 0;
  }
}

template <int G>
void i4g_to_f32(const void* src, float* dst, int64_t n) {
  auto* b = static_cast<const BlockI4G<G>*>(src);
  for (int64_t i = 0; i < n / G; ++i) {
    const float d = f16_to_f32(b[i].d);
    const int z = b[i].z;
    float* o = dst + i * G;
    for (int c = 0; c < G / 32; ++c)
      for (int j = 0; j < 16; ++j) {
        const uint8_t q = b[i].qs[16 * c + j];
        o[32 * c + j] = d * static_cast<float>((q & 0xf) - z);
        o[32 * c + j + 16] = d * static_cast<float>((q >> 4) - z);
      }
  }
}

// AWQ's round-to-nearest: scale = (max - min) / 15 (at least 1e-5 / 15), z = -round(min / scale),
// q = round(x / scale) + z, both clamped to [0, 15]; the scale is rounded to f16 first so that the
// stored scale is the one the values were quantized with.
template <int G>
void i4g_from_f32(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockI4G<G>*>(dst);
  for (int64_t i = 0; i < n / G; ++i) {
    const float* x = src + i * G;
    float lo = x[0], hi = x[0];
    for (int j = 1; j < G; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    const uint16_t dh = f32_to_f16(std::max(hi - lo, 1e-5f) / 15.0f);
    const float d = f16_to_f32(dh);
    const int z = std::clamp(static_cast<int>(-std::nearbyint(lo / d)), 0, 15);
    b[i].d = dh;
    b[i].z = static_cast<uint8_t>(z);
    b[i].pad = 0;
    auto q = [&](int j) {
      return std::clamp(static_cast<int>(std::nearbyint(x[j] / d)) + z, 0, 15);
    };
    for (int c = 0; c < G / 32; ++c)
      for (int j = 0; j < 16; ++j)
        b[i].qs[16 * c + j] = static_cast<uint8_t>(q(32 * c + j) | (q(32 * c + j + 16) << 4));
  }
}

}  // namespace

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    // value * 2^24 rounded to nearest even gives the subnormal mantissa.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
  return sign | static_cast<uint16_t>((r - 0x38000000u) >> 13);
}

namespace {

// The 256 values of e4m3_to_f32, indexed by code.
const float* e4m3_values() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 0xf, m = c & 7;
      float v = e == 0 ? std::ldexp(static_cast<float>(m), -9)  // subnormal: m / 8 * 2^-6
                       : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
      if (e == 15 && m == 7) v = std::numeric_limits<float>::quiet_NaN();
      t[c] = (c & 0x80) ? -v : v;
    }
    return t;
  }();
  return table.data();
}

}  // namespace

float e4m3_to_f32(uint8_t q) { return e4m3_values()[q]; }

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate (and +-inf)
  if (a < 0.015625f) {                  // below 2^-6: subnormal steps of 2^-9 (8 steps: 2^-6)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int ex = 0;
  const float fr = std::frexp(a, &ex);  // a = fr * 2^ex, fr in [0.5, 1)
  int e = ex - 1 + 7;                    // biased exponent of 1.m
  int m = static_cast<int>(std::nearbyint((2.0f * fr - 1.0f) * 8.0f));  // exact, then to even
  if (m == 8) m = 0, ++e;
  if (e > 15 || (e == 15 && m == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((e << 3) | m);
}

void to_f32(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kBF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kQ8_0: {
      auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / kQuantBlock; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQuantBlock; ++j) dst[i * kQuantBlock + j] = d * b[i].qs[j];
      }
      return;
    }
    case DType::kQ4_0: {
      auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / kQuantBlock; ++i) {
        const float d = f16_to_f32(b[i].d);
        float* o = dst + i * kQuantBlock;
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          o[j] = d * (static_cast<int>(b[i].qs[j] & 0xf) - 8);
          o[j + 16] = d * (static_cast<int>(b[i].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::kQ4_1: {
      auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t i = 0; i < n / kQuantBlock; ++i) {
        const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        float* o = dst + i * kQuantBlock;
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          o[j] = d * (b[i].qs[j] & 0xf) + m;
          o[j + 16] = d * (b[i].qs[j] >> 4) + m;
        }
      }
      return;
    }
    case DType::kI4G32:
      return i4g_to_f32<32>(src, dst, n);
    case DType::kI4G64:
      return i4g_to_f32<64>(src, dst, n);
    case DType::kI4G128:
      return i4g_to_f32<128>(src, dst, n);
    case DType::kF8E4M3: {
      auto* q = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = e4m3_to_f32(q[i]);
      return;
    }
    case DType::kF8B32:
      return f8_to_f32<BlockF8B32, 32>(src, dst, n);
    case DType::kF8G128:
    case DType::kF8Row:
      return f8_to_f32<BlockF8G128, 128>(src, dst, n);
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ8_K: {
      const int per_block = block_elems(t) / kQuantBlock;
      for (int64_t i = 0; i < n / kQuantBlock; ++i)
        dequantize_chunk(t, static_cast<const char*>(src) + (i / per_block) * block_bytes(t),
                         static_cast<int>(i % per_block), dst + i * kQuantBlock);
      return;
    }
    case DType::kI32:
    case DType::kI64: break;
  }
  PAGELLM_CHECK_MSG(false, "to_f32: unsupported dtype");
}

void from_f32(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kQ8_0: {
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < n / kQuantBlock; ++i) {
        const float* x = src + i * kQuantBlock;
        float amax = 0;
        for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < kQuantBlock; ++j)
          b[i].qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
      }
      return;
    }
    case DType::kQ4_0: {
      auto* b = static_cast<BlockQ4_0*>(dst);
      for (int64_t i = 0; i < n / kQuantBlock; ++i) {
        const float* x = src + i * kQuantBlock;
        float amax = 0, maxv = 0;  // signed value of largest magnitude, as ggml's quantize_row_q4_0
        for (int j = 0; j < kQuantBlock; ++j)
          if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), maxv = x[j];
        const float d = maxv / -8.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
          const int q1 = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
          b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
      }
      return;
    }
    case DType::kQ4_1: {
      auto* b = static_cast<BlockQ4_1*>(dst);
      for (int64_t i = 0; i < n / kQuantBlock; ++i) {
        const float* x = src + i * kQuantBlock;
        float lo = x[0], hi = x[0];
        for (int j = 1; j < kQuantBlock; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
        const float d = (hi - lo) / 15.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(lo);
        for (int j = 0; j < kQuantBlock / 2; ++j) {
          const int q0 = std::min(15, static_cast<int>((x[j] - lo) * id + 0.5f));
          const int q1 = std::min(15, static_cast<int>((x[j + 16] - lo) * id + 0.5f));
          b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
      }
      return;
    }
    case DType::kI4G32:
      return i4g_from_f32<32>(src, dst, n);
    case DType::kI4G64:
      return i4g_from_f32<64>(src, dst, n);
    case DType::kI4G128:
      return i4g_from_f32<128>(src, dst, n);
    case DType::kF8E4M3: {
      auto* q = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) q[i] = f32_to_e4m3(src[i]);
      return;
    }
    case DType::kF8B32:
      return f8_from_f32<BlockF8B32, 32>(src, dst, n);
    case DType::kF8G128:
      return f8_from_f32<BlockF8G128, 128>(src, dst, n);
    default:
      break;  // the 5-bit and k-quant types are written by llama.cpp's quantizer, not here
  }
  PAGELLM_CHECK_MSG(false, "from_f32: unsupported dtype");
}

}  // namespace pagellm
