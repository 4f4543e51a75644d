// The CPU backend's SIMD kernels, one table per instruction set. The table for an ISA is defined
// in a file compiled with that ISA's flags (kernels_avx2.cpp, kernels_avx512.cpp) and must only be
// called after cpu_kernels() has checked the running CPU supports it. The kernels are
// single-threaded; cpu_backend.cpp splits the work over the thread pool.
//
// Numerics: activations stay f32 and every product is accumulated in f32, so results differ from
// the reference loops only by summation order (about 1e-6 relative).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace pagellm::cpu {

// The largest number of activation rows the GEMV kernel takes at once; more rows go to the GEMM.
inline constexpr int kGemvMaxRows = 8;

// A matrix of weight rows in any storage type: row m starts at data + m * row_bytes.
struct WeightRows {
  const char* data = nullptr;
  int64_t row_bytes = 0;
  DType dtype = DType::kF32;
  // GEMV software prefetch distance in bytes ahead of the row being read; 0: none.
  int64_t prefetch_bytes = 0;
};

// The GEMV prefetch distance (PAGELLM_GEMV_PREFETCH bytes overrides it; measured in docs/PERF.md).
int64_t gemv_prefetch_bytes();

// One (query token, query head) of paged attention; everything is in elements unless noted.
struct AttentionRow {
  const float* q = nullptr;  // [D]
  float* out = nullptr;      // [Dv]
  const float* k_cache = nullptr;  // base of [n_blocks, block_size, Hkv, D], already offset to the head
  const float* v_cache = nullptr;  // base of [n_blocks, block_size, Hkv, Dv], already offset to the head
  int64_t k_block_stride = 0, k_token_stride = 0;
  int64_t v_block_stride = 0, v_token_stride = 0;
  const int32_t* block_table = nullptr;  // this sequence's row of the block table
  int32_t block_size = 16;
  int32_t kv_begin = 0, kv_end = 0;  // attend to KV positions [kv_begin, kv_end)
  int32_t head_dim = 0, head_dim_v = 0;
  float scale = 1.0f;
  float softcap = 0.0f;
};

struct Kernels {
  const char* isa;  // "avx2" or "avx512"

  // out[r * ldo + m] = dot(x[r * ldx + :K], w[m, :K]) (+ bias[m]) for r < n (1..kGemvMaxRows),
  // m in [m_begin, m_end). Each weight row is read once for all n activation rows.
  void (*gemv)(const WeightRows& w, int64_t k, const float* x, int64_t ldx, int n,
               const float* bias, float* out, int64_t ldo, int64_t m_begin, int64_t m_end);

  // Converts columns [k0, k0 + kc) of weight rows [m0, m0 + rows) to f32, row j at dst + j * ldd.
  // k0 and kc are multiples of 32 for quantized types (kc may end at K).
  void (*convert_rows)(const WeightRows& w, int64_t m0, int rows, int64_t k0, int64_t kc,
                       float* dst, int64_t ldd);

  // GEMM on an f32 panel: out[i * ldo + j] (+)= dot(x[i * ldx + :kc], wp[j * ldw + :kc]) for
  // i < n, j < m. `accumulate` false stores (adding bias[j] when bias is non-null), true adds.
  void (*gemm_f32)(const float* x, int64_t ldx, int64_t n, const float* wp, int64_t ldw, int64_t m,
                   int64_t kc, float* out, int64_t ldo, bool accumulate, const float* bias);

  // Row ops (d elements). out may alias x.
  void (*rms_norm_row)(const float* x, const float* w, float eps, float* out, int64_t d);
  // res += x; out = rms_norm(res) * w. out may alias x.
  void (*add_rms_norm_row)(const float* x, float* res, const float* w, float eps, float* out,
                           int64_t d);
  void (*silu_mul_row)(const float* gate, const float* up, float* out, int64_t d);
  void (*add_row)(const float* a, const float* b, float* out, int64_t d);

  void (*attention_row)(const AttentionRow& a);

  // Sum of n floats, streaming (memory-bandwidth probe).
  float (*read_sum)(const float* x, int64_t n);

  // dst[k] = scale * e4m3(src[k]) for k < n: an FP8 KV cache row read back (exact).
  void (*e4m3_row)(const uint8_t* src, int64_t n, float scale, float* dst);
};

// The best table this CPU supports (AVX-512 F/BW/VL/DQ, else AVX2+FMA+F16C), or nullptr when it has
// neither, in which case the backend runs the reference loops. PAGELLM_CPU_ISA=avx2|none caps it.
const Kernels* cpu_kernels();

// Defined in the ISA files; only called after the runtime feature check.
const Kernels* avx2_kernels();
const Kernels* avx512_kernels();

}  // namespace pagellm::cpu
