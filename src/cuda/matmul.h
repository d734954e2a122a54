#pragma once
// Matrix products and row gathers on the GPU against weights of any supported format. Declarations only on
// this branch: the kernels come from the matrix-product work (src/cuda/pending_kernels.cu stands in for them
// until then and throws).
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/backend.h"

namespace sparrow::cuda {

// Per-backend state of the matrix products (activation scratch, cuBLAS handle), bound to one stream.
class MatmulContext {
 public:
  explicit MatmulContext(cudaStream_t stream);

 private:
  cudaStream_t stream_;
};

// y[t * n_out + o] = sum_i W[o][i] * x[t * n_in + i] for t < n_tokens; x and y in device memory, W in device
// memory or in mapped host memory (WeightStore::place).
void matmul(MatmulContext& ctx, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y);

// out[r * n_in + i] = W[ids[r]][i] dequantized to float (embedding lookup); ids in device memory, all < n_out.
void get_rows(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float* out, cudaStream_t stream);

}  // namespace sparrow::cuda
