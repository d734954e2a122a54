#pragma once
// Programmatic dependent launch (sm_90 and newer): a kernel launched with launch_dependent may start while the
// kernel before it in the stream still runs, as soon as every CTA of that one has called allow_dependents (or
// exited). Until it calls wait_for_predecessor, which returns once the kernel before it has completed and its
// writes are visible, it may only touch what no earlier kernel writes or reads (the decode GEMV streams its
// weights meanwhile). On older devices, or with SPARROW_CUDA_PDL=0 in the environment (an A/B switch), the
// launch is an ordinary one and both calls do nothing.
//
// Order stays transitive: every kernel launched this way waits (in all its CTAs) before it completes, so when
// it has completed, so has everything before it.
#include <cuda_runtime.h>

#include <utility>

#include "cuda/cuda_check.h"

namespace sparrow::cuda {

// Whether launch_dependent sets the attribute: the current device is sm_90 or newer and SPARROW_CUDA_PDL is not
// "0". Asked once per device.
bool dependent_launch_enabled();

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to start early as above.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent_launch_enabled() ? 1 : 0;
  SPARROW_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Lets the kernel launched after this one (with launch_dependent) start its CTAs now. Kernels that precede the
// decode GEMV call it first thing: their successors wait for them anyway.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the kernel before this one in the stream has completed and its writes are visible.
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace sparrow::cuda
