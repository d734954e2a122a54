#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cuda/dependent_launch.cuh"

namespace sparrow::cuda {

bool dependent_launch_enabled() {
  constexpr int kMaxDevices = 64;
  static std::once_flag asked[kMaxDevices];
  static bool enabled[kMaxDevices];
  int device = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  std::call_once(asked[device], [device] {
    int major = 0;
    SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const char* switch_value = std::getenv("SPARROW_CUDA_PDL");
    enabled[device] = major >= 9 && !(switch_value != nullptr && std::strcmp(switch_value, "0") == 0);
  });
  return enabled[device];
}

}  // namespace sparrow::cuda
