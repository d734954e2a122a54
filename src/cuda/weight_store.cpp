// The CUDA weight store: a model's weights placed once for every context on one device. A matrix on the
// device is uploaded (tied matrices, placed twice from the same host bytes, once); a matrix left in host
// memory has its pages registered with the driver (cudaHostRegister, read-only, mapped) so kernels read it
// over the bus where the file mapping already holds it.
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "util/error.h"

namespace sparrow {
namespace {

std::string format_bytes(size_t bytes) {
  char text[32];
  if (bytes >= (size_t(1) << 30)) std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(1 << 30));
  else std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(1 << 20));
  return text;
}

size_t matrix_bytes(const WeightMatrix& w) { return tensor_row_bytes(w.type, w.n_in) * size_t(w.n_out); }

class CudaWeightStore final : public WeightStore {
 public:
  explicit CudaWeightStore(int device_index) : info_(cuda::device_info(device_index)) {
    SPARROW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    int flag = 0;
    SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&flag, cudaDevAttrHostRegisterReadOnlySupported, info_.index));
    read_only_registration_ = flag != 0;
    SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&flag, cudaDevAttrCanUseHostPointerForRegisteredMem, info_.index));
    host_pointer_is_device_pointer_ = flag != 0;
  }

  // Destructors do not throw: failures while releasing are ignored.
  ~CudaWeightStore() override {
    cudaDeviceSynchronize();
    for (void* device : owned_) cudaFree(device);
    for (const auto& [begin, end] : registered_) cudaHostUnregister(reinterpret_cast<void*>(begin));
    cudaStreamDestroy(stream_);
  }

  WeightMatrix place(const WeightMatrix& host, bool on_device, WeightUse) override {
    if (!host.data) return host;  // an absent tensor (KV-shared layers, k_eq_v) stays absent
    WeightMatrix placed = host;
    const size_t bytes = matrix_bytes(host);
    placed.data = on_device ? upload(host.data, bytes) : map_host(host.data, bytes);
    return placed;
  }

  // Never deduplicated by address: the binder converts each vector in a temporary host buffer, so two vectors
  // can arrive at the same address.
  const float* place_floats(const float* host, size_t n) override {
    if (!host || n == 0) return nullptr;
    return static_cast<const float*>(copy_to_device(host, n * sizeof(float)));
  }

  size_t device_bytes() const override { return device_bytes_; }

  std::string describe() const override {
    size_t free_bytes = 0, total_bytes = 0;
    SPARROW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    std::string text = "CUDA" + std::to_string(info_.index) + ": " + info_.name + ", " + format_bytes(total_bytes) +
                       " (" + format_bytes(free_bytes) + " free); " + format_bytes(device_bytes_) + " of weights";
    if (mapped_bytes_ > 0) text += ", " + format_bytes(mapped_bytes_) + " read from host memory";
    return text;
  }

 private:
  struct DeviceCopy {
    void* device;
    size_t bytes;
  };

  // A matrix's device copy; tied matrices (the same file bytes placed twice) share one.
  const void* upload(const void* host, size_t bytes) {
    auto it = uploads_.find(host);
    if (it != uploads_.end() && it->second.bytes >= bytes) return it->second.device;
    void* device = copy_to_device(host, bytes);
    if (it != uploads_.end()) {
      device_bytes_ -= it->second.bytes;
      SPARROW_CUDA_CHECK(cudaFree(it->second.device));
      owned_.erase(it->second.device);
    }
    uploads_[host] = {device, bytes};
    return device;
  }

  void* copy_to_device(const void* host, size_t bytes) {
    void* device = nullptr;
    const cudaError_t status = cudaMalloc(&device, bytes);
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw Error("CUDA" + std::to_string(info_.index) + ": out of device memory placing " + format_bytes(bytes) +
                  " of weights (" + format_bytes(device_bytes_) + " placed so far); offload fewer layers (-ngl)");
    }
    SPARROW_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
    SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
    owned_.insert(device);
    device_bytes_ += bytes;
    return device;
  }

  // Registration works on whole pages, and a page may hold the end of one tensor and the start of the next:
  // only the parts of the tensor's page span not registered yet are registered.
  const void* map_host(const void* host, size_t bytes) {
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = uintptr_t(host) / page * page;
    const uintptr_t end = (uintptr_t(host) + bytes + page - 1) / page * page;
    const int registrations = register_uncovered(begin, end);
    mapped_bytes_ += bytes;
    if (host_pointer_is_device_pointer_) return host;
    if (registrations > 1)
      throw Error("CUDA" + std::to_string(info_.index) + ": a weight spans two host registrations and this device " +
                  "does not read registered memory at its host address; place it on the device");
    void* device = nullptr;
    SPARROW_CUDA_CHECK(cudaHostGetDevicePointer(&device, const_cast<void*>(host), 0));
    return device;
  }

  // Registers the parts of [begin, end) that no earlier registration covers; returns how many registrations,
  // earlier or new, the span lies in.
  int register_uncovered(uintptr_t begin, uintptr_t end) {
    int registrations = 0;
    uintptr_t cursor = begin;
    auto it = registered_.upper_bound(begin);
    if (it != registered_.begin() && std::prev(it)->second > begin) --it;
    for (; it != registered_.end() && it->first < end; ++it) {
      if (it->first > cursor) {
        register_span(cursor, it->first);
        ++registrations;
      }
      cursor = std::max(cursor, it->second);
      ++registrations;
    }
    if (cursor < end) {
      register_span(cursor, end);
      ++registrations;
    }
    return registrations;
  }

  void register_span(uintptr_t begin, uintptr_t end) {
    unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
    if (read_only_registration_) flags |= cudaHostRegisterReadOnly;
    const cudaError_t status = cudaHostRegister(reinterpret_cast<void*>(begin), end - begin, flags);
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw Error("CUDA" + std::to_string(info_.index) + ": cannot map " + format_bytes(end - begin) +
                  " of host weights for the GPU (cudaHostRegister: " + cudaGetErrorString(status) + ")");
    }
    registered_[begin] = end;
  }

  cuda::DeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  bool read_only_registration_ = false;
  bool host_pointer_is_device_pointer_ = false;
  std::unordered_map<const void*, DeviceCopy> uploads_;  // matrices, by host address
  std::unordered_set<void*> owned_;                       // every device copy (matrices and vectors)
  std::map<uintptr_t, uintptr_t> registered_;            // page-aligned [begin, end) spans, disjoint
  size_t device_bytes_ = 0;
  size_t mapped_bytes_ = 0;
};

}  // namespace

std::unique_ptr<WeightStore> make_cuda_weight_store(int device_index) {
  return std::make_unique<CudaWeightStore>(device_index);
}

}  // namespace sparrow
