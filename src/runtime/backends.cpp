#include "runtime/backends.h"

#include "util/error.h"

#ifdef SPARROW_HAS_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/device_info.h"
#endif

namespace sparrow {

std::optional<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  return std::nullopt;
}

std::vector<std::string> device_names() { return {device_name(Device::Cpu), device_name(Device::Cuda)}; }

const char* device_name(Device device) { return device == Device::Cpu ? "cpu" : "cuda"; }

std::string device_unavailable_reason(Device device) {
  if (device == Device::Cpu) return "";
#ifdef SPARROW_HAS_CUDA
  return cuda::unavailable_reason(0);
#else
  return "this build has no CUDA backend (nvcc was not found, or it was configured with -DSPARROW_CUDA=OFF)";
#endif
}

namespace {
void require(Device device) {
  const std::string reason = device_unavailable_reason(device);
  if (!reason.empty()) throw Error(reason);
}
}  // namespace

std::unique_ptr<WeightStore> make_weight_store(Device device) {
  require(device);
  if (device == Device::Cpu) return make_cpu_weight_store();
#ifdef SPARROW_HAS_CUDA
  return make_cuda_weight_store(0);
#else
  throw Error("unreachable: CUDA requested in a build without it");
#endif
}

std::unique_ptr<Backend> make_backend(Device device, int n_threads) {
  require(device);
  if (device == Device::Cpu) return make_cpu_backend(n_threads);
#ifdef SPARROW_HAS_CUDA
  return make_cuda_backend(0);
#else
  throw Error("unreachable: CUDA requested in a build without it");
#endif
}

}  // namespace sparrow
