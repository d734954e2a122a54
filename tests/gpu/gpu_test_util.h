#pragma once
// GPU tests skip, with the reason printed, when this machine has no usable CUDA device; and the device buffers
// and streams they share.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_info.h"

#define SPARROW_REQUIRE_GPU()                                                        \
  do {                                                                               \
    const std::string sparrow_gpu_reason_ = ::sparrow::cuda::unavailable_reason(0);  \
    if (!sparrow_gpu_reason_.empty()) GTEST_SKIP() << sparrow_gpu_reason_;           \
  } while (0)

namespace sparrow::testing {

// Device memory for the span of one test. poison() fills it with all-ones bytes (NaN as floats), so that an
// output element a kernel never wrote cannot pass.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { SPARROW_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    SPARROW_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  void poison() { SPARROW_CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(T))); }
  std::vector<T> read() const {
    std::vector<T> host(n_);
    SPARROW_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class Stream {
 public:
  // A blocking stream: it waits for the uploads that cudaMemcpy queues on the legacy default stream.
  Stream() { SPARROW_CUDA_CHECK(cudaStreamCreate(&stream_)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }
  void sync() const { SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace sparrow::testing
