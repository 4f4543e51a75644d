// Tensor-core prefill attention (attention_prefill.cu). launch_attention sends a ragged prefill
// (max_seqlen_q > 1) here when prefill_mma_supported() says the shapes and alignments fit, and to
// the CUDA-core kernel in attention.cu otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/kernels.h"

namespace pagellm::cuda {

// True when launch_prefill_mma covers `a`: scale > 0 (the kernel takes the running max of raw
// scores and scales in the exponent); head_dim and head_dim_v multiples of 8 and at most 256; q
// rows and K/V cache rows 16-byte aligned (base address and every stride, in elements, a multiple
// of 8); output pairs 4-byte aligned; block_size >= 1; grid dimensions in range.
bool prefill_mma_supported(const AttentionArgs& a);

// Queues the tensor-core prefill kernel on `stream`. Precondition: prefill_mma_supported(a).
void launch_prefill_mma(const AttentionArgs& a, cudaStream_t stream);

}  // namespace pagellm::cuda
