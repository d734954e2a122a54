#include "cuda/device_info.h"

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "util/error.h"

namespace sparrow::cuda {

std::string unavailable_reason(int index) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky status so later checks see their own calls
    return std::string("no usable CUDA device: ") + cudaGetErrorString(status);
  }
  if (count == 0) return "no CUDA device is present";
  if (index < 0 || index >= count)
    return "CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(count) + " present)";
  return "";
}

DeviceInfo device_info(int index) {
  const std::string reason = unavailable_reason(index);
  if (!reason.empty()) throw Error(reason);
  cudaDeviceProp prop{};
  SPARROW_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  SPARROW_CUDA_CHECK(cudaSetDevice(index));
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  SPARROW_CUDA_CHECK(cudaMemGetInfo(&info.free_memory, &info.total_memory));
  return info;
}

}  // namespace sparrow::cuda
