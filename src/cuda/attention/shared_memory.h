#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/cuda_check.h"

namespace sparrow::cuda {

// Kernels that need more than the default 48 KiB of dynamic shared memory per CTA must ask for it before launch.
template <class Kernel>
void allow_shared_bytes(Kernel kernel, size_t bytes) {
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (bytes > kDefaultLimit)
    SPARROW_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace sparrow::cuda
