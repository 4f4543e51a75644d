// Packed 4-bit checkpoints (AWQ, GPTQ, compressed-tensors pack-quantized) as I4G weights: each
// quantized linear's packed parts (qweight / qzeros / scales / g_idx, or weight_packed /
// weight_scale / weight_zero_point / weight_shape) become one tensor "<module>.weight" [out, in]
// of the I4G type of its group size (core/dtype.h), the layout both backends compute from. The
// values are the checkpoint's exactly: every 4-bit value, scale and zero point is kept, so
// d * (q - z) in f32 is what the writer's own dequantization gives before it rounds to 16 bits.
// Every other tensor passes through untouched.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "io/quant_config.h"
#include "io/weights.h"

namespace pagellm {

// Unpacks every quantized linear of `packed` now (the converted weights are held in memory; the
// packed ones stay mapped but unread afterwards). A tensor whose parts are missing, of the wrong
// type or shape, or inconsistent with `q` is an error naming it. GPTQ act-order (a g_idx that
// permutes the inputs) gives an f32 weight instead: s * (q - z) with each input's own group,
// exactly, at 4 bytes a weight (a warning says so).
Result<std::unique_ptr<WeightSource>> unpack_int4_weights(std::unique_ptr<WeightSource> packed,
                                                          const QuantConfig& q);

// A [n, k] weight rounded to 4 bits as AWQ's quantizer rounds (core/dtype.h's I4G from_f32: the
// group's min and max, zero point on) and packed in AWQ's GEMM layout: qweight i32 [k, n / 8],
// qzeros i32 [k / group, n / 8], scales f16 [k / group, n]. group 32, 64 or 128; n a multiple of
// 8, k of the group. Read back by unpack_int4_weights, it gives from_f32's blocks exactly.
struct AwqTensors {
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
};
AwqTensors pack_awq(const float* w, int64_t n, int64_t k, int group);

}  // namespace pagellm
