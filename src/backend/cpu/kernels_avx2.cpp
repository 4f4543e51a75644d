// AVX2 + FMA + F16C kernels (8 lanes). Compiled with -mavx2 -mfma -mf16c; called only after
// cpu_kernels() has checked the CPU (see kernels.h).
#include <immintrin.h>

#include <math.h>

#include "backend/cpu/kernels.h"
#include "core/kquants.h"

namespace pagellm::cpu {
namespace {

struct I {
  using V = __m256;
  static constexpr int kW = 8;
  // GEMM register tile: 2 activation rows x 4 weight rows = 8 accumulators of 16 registers.
  static constexpr int kMr = 2;
  static constexpr int kNr = 4;

  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static float reduce_add(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float f16(uint16_t h) { return _cvtsh_ss(h); }
  static V load_bf16(const uint16_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // 8 signed bytes -> f32
  static V i8_to_f32(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }
  // 8 e4m3 codes at p -> f32, exactly: the code's magnitude bits placed as an f32's exponent and
  // mantissa (e4m3 subnormals become f32 subnormals), times 2^120 to move the exponent bias from
  // f32's 127 to e4m3's 7. NaN codes are not decoded (the loader refuses them).
  static V e4m3_to_f32(const uint8_t* p) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i mag = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(mag, sign)), _mm256_set1_ps(0x1p120f));
  }
  static void decode_q8_0(const BlockQ8_0* b, V* out) {
    const V d = set1(f16(b->d));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + 16));
    out[0] = mul(i8_to_f32(q0), d);
    out[1] = mul(i8_to_f32(_mm_srli_si128(q0, 8)), d);
    out[2] = mul(i8_to_f32(q1), d);
    out[3] = mul(i8_to_f32(_mm_srli_si128(q1, 8)), d);
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
    out[1] = i8_to_f32(_mm_srli_si128(a, 8));
    out[2] = i8_to_f32(b);
    out[3] = i8_to_f32(_mm_srli_si128(b, 8));
  }
  // Q5_0 / Q5_1's fifth bits: bit j of 16 bits of qh -> byte j, 0x10 or 0.
  static __m128i fifth_bits(uint32_t qh16) {  // 16 bits of qh -> 16 bytes of 0x10 or 0
    const __m128i spread = _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i bit = _mm_set_epi8(-128, 64, 32, 16, 8, 4, 2, 1, -128, 64, 32, 16, 8, 4, 2, 1);
    const __m128i v =
        _mm_and_si128(_mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(qh16)), spread), bit);
    return _mm_and_si128(_mm_cmpeq_epi8(v, bit), _mm_set1_epi8(0x10));
  }
  static void decode_q4_1(const BlockQ4_1* b, V* out) {
    const V d = set1(f16(b->d)), m = set1(f16(b->m));
    __m128i lo, hi;
    nibbles(b->qs, &lo, &hi);
    out[0] = fma(i8_to_f32(lo), d, m);
    out[1] = fma(i8_to_f32(_mm_srli_si128(lo, 8)), d, m);
    out[2] = fma(i8_to_f32(hi), d, m);
    out[3] = fma(i8_to_f32(_mm_srli_si128(hi, 8)), d, m);
  }
  // e^x for x clamped to [-87, 88]: 2^n * p(r), r = x - n ln2, |r| <= ln2 / 2, Cephes-style
  // degree-6 polynomial (about 2 ulp).
  static V exp(V x) {
    x = _mm256_min_ps(_mm256_max_ps(x, set1(-87.0f)), set1(88.0f));
    const V n = _mm256_round_ps(mul(x, set1(1.44269504088896341f)),
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
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return mul(p, _mm256_castsi256_ps(e));
  }
};

#include "backend/cpu/kernels_impl.inc"

}  // namespace

const Kernels* avx2_kernels() {
  static const Kernels kernels = make_kernels("avx2");
  return &kernels;
}

}  // namespace pagellm::cpu
