#pragma once
// Whether this process can use a CUDA GPU, and which. Built only with the CUDA backend; everything else asks
// through make_backend (src/runtime/backends.h), which says why when it cannot.
#include <cstddef>
#include <string>

namespace sparrow::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;          // "NVIDIA H200"
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;   // bytes
  size_t free_memory = 0;
};

// "" when device `index` can be used; otherwise one line saying why (no driver, no device, ...).
std::string unavailable_reason(int index = 0);
// Throws sparrow::Error (with unavailable_reason) when the device cannot be used.
DeviceInfo device_info(int index = 0);

}  // namespace sparrow::cuda
