#include "core/kquants.h"

#include <cstring>

#include "core/check.h"

namespace pagellm {
namespace {

// Q3_K's 16 6-bit scales: the low 4 bits of scales 0..7 in bytes 0..7's low nibbles and of
// 8..15 in their high nibbles; the top 2 bits of scale i in byte 8 + i % 4, bits 2 * (i / 4).
int q3k_scale(const uint8_t* s, int i) {
  const int low = i < 8 ? (s[i] & 0xf) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return low | (high << 4);
}

void q5_chunk(const uint8_t qh_bytes[4], const uint8_t qs[16], float d, float m, int offset,
              bool has_min, float* out) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xf) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    if (has_min) {
      out[j] = d * static_cast<float>(lo) + m;
      out[j + 16] = d * static_cast<float>(hi) + m;
    } else {
      out[j] = d * static_cast<float>(lo - offset);
      out[j + 16] = d * static_cast<float>(hi - offset);
    }
  }
}

}  // namespace

void dequantize_chunk(DType t, const void* block, int c, float* out) {
  switch (t) {
    case DType::kQ5_0: {
      const auto* b = static_cast<const BlockQ5_0*>(block);
      return q5_chunk(b->qh, b->qs, f16_to_f32(b->d), 0.0f, 16, false, out);
    }
    case DType::kQ5_1: {
      const auto* b = static_cast<const BlockQ5_1*>(block);
      return q5_chunk(b->qh, b->qs, f16_to_f32(b->d), f16_to_f32(b->m), 0, true, out);
    }
    case DType::kQ2_K: {
      // Chunk c: 128-value half h = c / 4, 2-bit plane j = c % 4 of qs[32h .. 32h + 32); its
      // two 16-value halves take scales 8h + 2j and 8h + 2j + 1.
      const auto* b = static_cast<const BlockQ2_K*>(block);
      const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
      const int h = c / 4, shift = 2 * (c % 4);
      const uint8_t* q = b->qs + 32 * h;
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = b->scales[8 * h + 2 * (c % 4) + half];
        const float dl = d * static_cast<float>(sc & 0xf), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          out[16 * half + l] = dl * static_cast<float>((q[16 * half + l] >> shift) & 3) - ml;
      }
      return;
    }
    case DType::kQ3_K: {
      // As Q2_K, with a high bit per value in hmask (bit 4h + j): clear means 4 is subtracted.
      const auto* b = static_cast<const BlockQ3_K*>(block);
      const float d = f16_to_f32(b->d);
      const int h = c / 4, j = c % 4, shift = 2 * j;
      const uint8_t m = static_cast<uint8_t>(1u << (4 * h + j));
      const uint8_t* q = b->qs + 32 * h;
      for (int half = 0; half < 2; ++half) {
        const float dl = d * static_cast<float>(q3k_scale(b->scales, 8 * h + 2 * j + half) - 32);
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
          const int v = ((q[l] >> shift) & 3) - ((b->hmask[l] & m) ? 0 : 4);
          out[l] = dl * static_cast<float>(v);
        }
      }
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      // Chunk c: the low (c even) or high (c odd) nibbles of qs[32 (c / 2) .. + 32); Q5_K adds
      // bit c of qh[l] as the fifth bit.
      const bool five = t == DType::kQ5_K;
      const auto* b4 = static_cast<const BlockQ4_K*>(block);
      const auto* b5 = static_cast<const BlockQ5_K*>(block);
      const uint16_t dh = five ? b5->d : b4->d, dminh = five ? b5->dmin : b4->dmin;
      const uint8_t* scales = five ? b5->scales : b4->scales;
      const uint8_t* q = (five ? b5->qs : b4->qs) + 32 * (c / 2);
      int sc, mn;
      kquant_scale_min(scales, c, &sc, &mn);
      const float d1 = f16_to_f32(dh) * static_cast<float>(sc);
      const float m1 = f16_to_f32(dminh) * static_cast<float>(mn);
      const int shift = 4 * (c % 2);
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0xf;
        if (five) v += ((b5->qh[l] >> c) & 1) << 4;
        out[l] = d1 * static_cast<float>(v) - m1;
      }
      return;
    }
    case DType::kQ6_K: {
      // Chunk c: 128-value half h = c / 4; r = c % 4 picks the low (r even) or high nibbles of
      // ql[64h + 32 (r % 2) ..] and bits 2r..2r+1 of qh[32h ..]; 16-value scales 8h + 2r, + 1.
      const auto* b = static_cast<const BlockQ6_K*>(block);
      const float d = f16_to_f32(b->d);
      const int h = c / 4, r = c % 4;
      const uint8_t* ql = b->ql + 64 * h + 32 * (r % 2);
      const uint8_t* qh = b->qh + 32 * h;
      const int lo_shift = 4 * (r / 2), hi_shift = 2 * r;
      for (int l = 0; l < 32; ++l) {
        const int v = (((ql[l] >> lo_shift) & 0xf) | (((qh[l] >> hi_shift) & 3) << 4)) - 32;
        out[l] = d * static_cast<float>(b->scales[8 * h + 2 * r + l / 16]) * static_cast<float>(v);
      }
      return;
    }
    case DType::kQ8_K: {
      const auto* b = static_cast<const BlockQ8_K*>(block);
      for (int l = 0; l < 32; ++l) out[l] = b->d * static_cast<float>(b->qs[32 * c + l]);
      return;
    }
    default:
      break;
  }
  PAGELLM_CHECK_MSG(false, "dequantize_chunk: not a 5-bit or k-quant type");
}

}  // namespace pagellm
