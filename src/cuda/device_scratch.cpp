#include "cuda/device_scratch.h"

#include <algorithm>
#include <atomic>

#include "cuda/cuda_check.h"

namespace sparrow::cuda {
namespace {
std::atomic<uint64_t> g_moves{0};
}  // namespace

uint64_t DeviceScratch::moves() { return g_moves.load(std::memory_order_relaxed); }

DeviceScratch::~DeviceScratch() {
  // Destructors do not throw: a failure to release at teardown has nobody left to report to.
  cudaStreamSynchronize(stream_);
  for (void* p : retired_) cudaFree(p);
  if (data_ != nullptr) cudaFree(data_);
}

void* DeviceScratch::bytes(size_t n, bool zero) {
  if (n <= size_ && data_ != nullptr) return data_;
  // Grown by half again, so that a context growing token by token does not reallocate every step.
  const size_t size = std::max(n, size_ + size_ / 2);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SPARROW_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  if (data_ != nullptr) retired_.push_back(data_);
  data_ = nullptr;
  size_ = 0;
  if (capture == cudaStreamCaptureStatusNone) {
    // Queued kernels may still read the old buffers.
    SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (void* p : retired_) SPARROW_CUDA_CHECK(cudaFree(p));
    retired_.clear();
  }
  SPARROW_CUDA_CHECK(cudaMalloc(&data_, size));
  // Stream-ordered, so that it also lands in a graph being recorded (where it zeroes what is zero already).
  if (zero) SPARROW_CUDA_CHECK(cudaMemsetAsync(data_, 0, size, stream_));
  size_ = size;
  g_moves.fetch_add(1, std::memory_order_relaxed);
  return data_;
}

}  // namespace sparrow::cuda
