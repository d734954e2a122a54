#pragma once
// Device memory that grows on demand and is kept across calls (dequantized panels, converted activations,
// attention partials, token ids). Growth never waits for queued work to finish when the stream is being recorded
// into a CUDA graph (CudaBackend::begin_pass): the new buffer comes from cudaMalloc, which is immediate rather
// than stream-ordered, so a recording holds a plain pointer, and the old buffer is kept until the next growth
// outside a recording (after the stream has finished with it) or until destruction.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparrow::cuda {

class DeviceScratch {
 public:
  explicit DeviceScratch(cudaStream_t stream) : stream_(stream) {}
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // At least n elements of T; valid until the next call; contents undefined.
  template <class T>
  T* get(size_t n) {
    return static_cast<T*>(bytes(n * sizeof(T)));
  }

  // At least n elements of T, all zero when the buffer is new (its users must leave them zero).
  template <class T>
  T* zeroed(size_t n) {
    return static_cast<T*>(bytes(n * sizeof(T), true));
  }

  // How many times any DeviceScratch of the process has moved to a new buffer: a CUDA graph that holds scratch
  // addresses is stale once this changes.
  static uint64_t moves();

 private:
  void* bytes(size_t n, bool zero = false);

  cudaStream_t stream_;
  void* data_ = nullptr;
  size_t size_ = 0;
  std::vector<void*> retired_;  // outgrown while recording; freed at the next growth outside one
};

}  // namespace sparrow::cuda
