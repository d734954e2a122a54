#pragma once
// Every CUDA runtime and cuBLAS call in src/cuda/ goes through these checks: a failure becomes a sparrow::Error
// naming the call, the file and line and the runtime's message, never a silently ignored status. Kernel
// launches are checked with SPARROW_CUDA_CHECK_LAUNCH() right after the launch.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "util/error.h"

namespace sparrow::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw Error(std::string("CUDA: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
              cudaGetErrorString(status));
}
[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(std::string("cuBLAS: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
              cublasGetStatusString(status));
}

}  // namespace sparrow::cuda

#define SPARROW_CUDA_CHECK(call)                                                                   \
  do {                                                                                             \
    const cudaError_t sparrow_status_ = (call);                                                    \
    if (sparrow_status_ != cudaSuccess)                                                            \
      ::sparrow::cuda::throw_cuda_error(sparrow_status_, #call, __FILE__, __LINE__);               \
  } while (0)

#define SPARROW_CUDA_CHECK_LAUNCH() SPARROW_CUDA_CHECK(cudaGetLastError())

#define SPARROW_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                             \
    const cublasStatus_t sparrow_status_ = (call);                                                 \
    if (sparrow_status_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::sparrow::cuda::throw_cublas_error(sparrow_status_, #call, __FILE__, __LINE__);             \
  } while (0)
