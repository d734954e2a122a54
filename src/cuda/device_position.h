#pragma once
// A position as a kernel receives it: the value itself, or, where `at` is set, the int32 in device memory that
// `at` points to. A decode step replayed from a CUDA graph keeps its kernels' arguments, so the positions that
// change from step to step reach them through device memory (CudaBackend writes them before each replay).
#include <cstdint>

namespace sparrow::cuda {

struct DevicePosition {
  int32_t value = 0;             // the position on the host; what launch planning uses
  const int32_t* at = nullptr;   // device memory holding the position when the kernel runs, or null: value

  DevicePosition() = default;
  DevicePosition(int32_t v) : value(v) {}  // NOLINT(google-explicit-constructor): a plain position converts
  DevicePosition(int32_t v, const int32_t* device) : value(v), at(device) {}
#ifdef __CUDACC__
  __device__ int32_t get() const { return at ? *at : value; }
#endif
};

}  // namespace sparrow::cuda
