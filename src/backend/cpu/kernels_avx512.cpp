// AVX-512 (F/BW/VL/DQ) kernels (16 lanes). Compiled with the AVX-512 flags; called only after
// cpu_kernels() has checked the CPU (see kernels.h). AVX512_BF16's dot products are not used:
// they round activations to bf16, and results must stay within fp32 rounding of the reference.
// GCC 12's AVX-512 headers build results from _mm*_undefined_*() (`__m256d __Y = __Y;`), which
// -Wuninitialized flags wherever they are inlined; the values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <math.h>

#include "backend/cpu/kernels.h"
#include "core/kquants.h"

namespace pagellm::cpu {
namespace {

struct I {
  using V = __m512;
  static constexpr int kW = 16;
  // GEMM register tile: 4 activation rows x 6 weight rows = 24 accumulators of 32 registers.
  static constexpr int kMr = 4;
  static constexpr int kNr = 6;

  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float f) { return _mm512_set1_ps(f); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static float reduce_add(V v) {
    // Lane shuffles rather than _mm512_extractf64x4_pd, whose GCC 12 header trips -Wuninitialized.
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));  // + the other 256-bit half
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xb1));  // + the neighbouring 128-bit lane
    __m128 s = _mm512_castps512_ps128(v);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float f16(uint16_t h) { return _cvtsh_ss(h); }
  static V load_bf16(const uint16_t* p) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // 16 signed bytes -> f32
  static V i8_to_f32(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
  // 16 e4m3 codes at p -> f32, exactly (the AVX2 table's e4m3_to_f32, 16 at a time).
  static V e4m3_to_f32(const uint8_t* p) {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i mag = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x7f)), 20);
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(mag, sign)), _mm512_set1_ps(0x1p120f));
  }
  static void decode_q8_0(const BlockQ8_0* b, V* out) {
    const V d = set1(f16(b->d));
    out[0] = mul(i8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs))), d);
    out[1] = mul(i8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16))), d);
  }
  // Nibbles of 16 bytes: values 0..15 are the low nibbles, 16..31 the high ones.
  static void nibbles(const uint8_t* qs, __m128i* lo, __m128i* hi) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0f);
    *lo = _mm_and_si128(q, mask);
    *hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  }
  // 16 + 16 signed bytes -> 32 f32 values.
  static void bytes32_to_f32(__m128i a, __m128i b, V* out) {
    out[0] = i8_to_f32(a);
    out[1] = i8_to_f32(b);
  }
  // Q5_0 / Q5_1's fifth bits: bit j of 16 bits of qh -> byte j, 0x10 or 0.
  static __m128i fifth_bits(uint32_t qh16) {  // 16 bits of qh -> 16 bytes of 0x10 or 0
    return _mm_maskz_set1_epi8(static_cast<__mmask16>(qh16), 0x10);  // AVX-512BW/VL: one op
  }
  static void decode_q4_1(const BlockQ4_1* b, V* out) {
    const V d = set1(f16(b->d)), m = set1(f16(b->m));
    __m128i lo, hi;
    nibbles(b->qs, &lo, &hi);
    out[0] = fma(i8_to_f32(lo), d, m);
    out[1] = fma(i8_to_f32(hi), d, m);
  }
  // e^x for x clamped to [-87, 88]: 2^n * p(r), r = x - n ln2, |r| <= ln2 / 2, Cephes-style
  // degree-6 polynomial (about 2 ulp).
  static V exp(V x) {
    x = _mm512_min_ps(_mm512_max_ps(x, set1(-87.0f)), set1(88.0f));
    const V n = _mm512_roundscale_ps(mul(x, set1(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = fma(n, set1(-0.693359375f), x);
    r = fma(n, set1(2.12194440e-4f), r);
    V p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    p = fma(mul(p, r), r, add(r, set1(1.0f)));
    return _mm512_scalef_ps(p, n);  // p * 2^n
  }
};

#include "backend/cpu/kernels_impl.inc"

}  // namespace

const Kernels* avx512_kernels() {
  static const Kernels kernels = make_kernels("avx512");
  return &kernels;
}

}  // namespace pagellm::cpu
