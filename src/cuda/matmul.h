#pragma once
// Matrix products and row gathers on the GPU against weights of every supported format (formats/), decoded by
// the same WeightBlock<T>::decode_run the reference dequantization uses.
//
// Activations are first put in the form the CPU multiplies each weight type with (activations.h: rounded to
// f16 / bf16 for those weights, ggml's 8-bit groups for block types), so both backends multiply the same
// numbers and differ only in summation order. Block types multiply their 8-bit codes by the activations' in
// integers, as ggml does (matmul_int8.h: a dp4a GEMV for decode, integer tensor cores for prefill). Float types
// take two paths, chosen by the number of tokens:
//  - decode (n_tokens <= kMaxGemvTokens): a GEMV that reads each weight byte once: one warp per output row,
//    the row staged through shared memory with 16-byte loads, activations in shared memory, fp32 products and
//    accumulation, warp-shuffle reduction.
//  - prefill: f16 and bf16 weights as they are, against the activations' 16-bit encodings, on tensor cores
//    (matmul_half.h: 16-element partial sums, exact products, added in rounded fp32); f32 to cuBLAS in full fp32
//    (CUBLAS_COMPUTE_32F). Not TF32: on an H200 its 10-bit inputs moved a float-weight model's logits by
//    3e-3 of max|logit| against the CPU, three times the parity budget (scripts/gpu-e2e, 2026-12-03).
// Error bounds: tests/gpu/matmul_test.cpp (float types), tests/gpu/matmul_int8_test.cpp (block types).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "cuda/device_scratch.h"
#include "formats/weight_matrix.h"
#include "ops/backend.h"

namespace sparrow::cuda {

// Products of up to this many tokens take a GEMV; more take a tensor-core GEMM.
constexpr int64_t kMaxGemvTokens = 8;

// Per-stream state for matrix products: cuBLAS handle and scratch (converted activations).
class MatmulContext {
 public:
  explicit MatmulContext(cudaStream_t stream);
  ~MatmulContext();
  MatmulContext(const MatmulContext&) = delete;
  MatmulContext& operator=(const MatmulContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  DeviceScratch activations, activation_bits, activation_scales, activation_sums;
  DeviceScratch residual_counts;  // the decode GEMV's CTAs done, for its residual step (matmul_int8_residual)

 private:
  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
};

// y[t][o] = sum_i W[o][i] * x[t][i]. w.data: device memory, or host memory mapped into the device's address
// space (cudaHostRegister'ed): kernels only read it. x, y: device memory, [n_tokens][n_in] / [n_tokens][n_out].
// Enqueued on ctx's stream. Throws an Error for an unsupported type or a shape the type cannot have (n_in a
// multiple of the block size; of 8 for the float types).
void matmul(MatmulContext& ctx, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y);

// Backend::matmuls: y_i = W_i x for every target, x converted once for consecutive targets that take the same
// activation format and n_in, and consecutive targets of one block type and n_in multiplied in one launch
// (matmul_int8). Each y_i is bit-identical to matmul(ctx, W_i, x, n_tokens, y_i).
void matmul(MatmulContext& ctx, const float* x, int64_t n_tokens, std::span<const MatmulTarget> targets);

// out[r][i] = scale * W[ids[r]][i], dequantized; ids: device memory. Ids are read on the device only, so an id
// outside [0, n_out) cannot raise an error: its row comes out NaN.
void get_rows(MatmulContext& ctx, const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float scale,
              float* out);

}  // namespace sparrow::cuda
