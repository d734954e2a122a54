#pragma once
// Grids whose CTA that finishes last runs a final step over what all of them wrote: one-launch attention merging
// its splits (attention/flash_kernel.cuh), the decode GEMV's residual step (matmul_int8.cu).
#include <cuda_runtime.h>

#include <cstdint>

namespace sparrow::cuda {

// Whether this CTA is the last of n_ctas that count themselves on *done to have finished writing, so that it
// sees all their writes (read them through L2, __ldcg: L1 is not coherent across multiprocessors). That CTA sets
// the count back to zero for the next launch. Every thread of the CTA calls it after its writes, and every
// thread gets the answer.
__device__ inline bool last_cta_to_finish(int32_t* done, int n_ctas) {
  __shared__ bool last;
  __threadfence();  // this thread's writes are visible device-wide before the count says so
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done, 1) == n_ctas - 1;
    if (last) *done = 0;  // every other CTA has counted itself already
  }
  __syncthreads();
  if (last) __threadfence();  // the other CTAs' writes are read after their counts
  return last;
}

}  // namespace sparrow::cuda
