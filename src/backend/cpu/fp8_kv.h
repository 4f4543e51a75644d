// An FP8 KV cache on the CPU (--kv-cache-dtype fp8): keys and values stored as float8_e4m3fn,
// e4m3(x / scale) with one scale per layer for keys and one for values (Backend::rope_store_kv),
// and attention over such a cache, each stored byte read back as scale * e4m3(q) in f32 (a table
// of the 256 codes). The arithmetic is the f32 reference's (cpu/reference.h): the same scores,
// softmax and sums on the dequantized values, so an FP8 cache differs from an f32 one only by
// the rounding of what it stores.
#pragma once

#include "backend/backend.h"

namespace pagellm::cpu {

// Writes token i's k and v (f32 [n, Hkv, D] / [n, Hkv, Dv]) into slot slot_mapping[i] of the FP8
// caches (negative: not stored).
void store_kv_fp8(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, float k_scale,
                  float v_scale, Tensor& k_cache, Tensor& v_cache);

// x[i] = scale * e4m3(x[i] / scale): a value as an FP8 cache stores it.
void round_to_fp8(float* x, int64_t n, float scale);

struct Kernels;

// Backend::attention over FP8 caches (shapes checked by the caller). Without `kernels` (the
// reference backend): the f32 reference's loops on values read from a table, by (query head,
// token). With them: per (sequence, KV head, run of up to 64 of its queries) the context those
// queries read is dequantized once into f32 rows (Kernels::e4m3_row), which the fast row kernel
// then reads as a one-block cache, for every query head of the group. Decoding the codes inside
// the row kernel instead, for every query head and query, was measured slower (TPOT 33 against
// 19 ms on the default model at 1,024 tokens, docs/PERF.md K2's command) and reverted.
void attention_fp8(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                   const AttentionMeta& meta, const AttentionParams& params, Tensor& out,
                   const Kernels* kernels);

}  // namespace pagellm::cpu
