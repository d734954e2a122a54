#pragma once
// The prefill product of f16 / bf16 weights on tensor cores, with the accuracy of an fp32 sum.
//
// An mma's fp32 accumulation is not IEEE round-to-nearest: the tensor core aligns the products and the
// accumulator to the largest exponent and truncates, so a long dot product accumulated inside the mma drifts
// (measured on an H200 by `sparrow lockstep`: 3e-6 of the output per GEMM through cuBLAS, 5e-7 for every other
// kernel; enough to move a float-weight model's logits past the CPU parity bound, docs/verify-cuda.md). Here
// every mma starts from zero and covers 16 elements, and its result is added to the running sum in registers
// with a rounded fp32 add: the truncation is confined to 16-product partial sums, and the long sum rounds like
// the CPU's.
#include <cuda_runtime.h>

#include <cstdint>

#include "gguf/tensor_types.h"

namespace sparrow::cuda {

// y[t][o] = sum_i W[o][i] x[t][i] for t < n_tokens, o < n_out, with W (n_out rows of n_in) and x (n_tokens rows
// of n_in) both of `type`, TensorType::F16 or TensorType::BF16, and n_in a positive multiple of 8; y fp32,
// [n_tokens][n_out]. All pointers to device memory (or mapped host memory for w). Enqueued on `stream`; needs
// sm_80 or newer. Throws an Error for another type, a bad shape or a device older than sm_80.
void matmul_half(cudaStream_t stream, TensorType type, const uint16_t* w, int64_t n_in, int64_t n_out,
                 const uint16_t* x, int64_t n_tokens, float* y);

}  // namespace sparrow::cuda
