#pragma once
// Token sampling on the device, so that a decode step copies back one token id instead of the logits. The
// choice is the CPU sampler's (src/runtime/sampler.h) for the same logits and uniform draw u: candidates in
// descending-logit order (lowest id first among equal logits), top-k, then top-p and min-p on the temperature-1
// probabilities of those, then the temperature, then the inverse CDF at u over the kept candidates.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/sampling.h"

namespace sparrow {

namespace cuda {

// Scratch and kernels of device sampling on one stream; buffers grow to the largest vocabulary seen.
class DeviceSampler {
 public:
  DeviceSampler(cudaStream_t stream, int multiprocessors);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // The sampled token id; logits: n_vocab floats in device memory (finite or -inf); u in [0, 1). Waits for
  // the stream, since the id is on the host when it returns.
  int32_t sample(const float* logits, int64_t n_vocab, const SamplingParams& params, float u);

  // The most candidates top-k keeps by radix selection; a larger top-k (or none) sorts the whole vocabulary.
  static constexpr int32_t kMaxSelected = 4096;

 private:
  int32_t argmax(const float* logits, int32_t n_vocab);
  void select_top_k(const float* logits, int32_t n_vocab, int32_t k);
  void sort_all(const float* logits, int32_t n_vocab);
  int32_t pick(int32_t n_sorted, const SamplingParams& params, float u);
  void reserve(int32_t n_vocab);

  cudaStream_t stream_;
  int multiprocessors_;
  int32_t capacity_ = 0;  // vocabulary size the per-token buffers hold
  // Radix selection: its state, one digit histogram per pass, the gathered candidates.
  void* select_state_ = nullptr;
  uint32_t* histograms_ = nullptr;
  unsigned long long* candidates_ = nullptr;
  // Descending candidates (order keys, ids), and the whole-vocabulary sort's inputs and scratch.
  uint32_t* sorted_keys_ = nullptr;
  int32_t* sorted_ids_ = nullptr;
  uint32_t* keys_ = nullptr;
  int32_t* ids_ = nullptr;
  void* sort_scratch_ = nullptr;
  size_t sort_scratch_bytes_ = 0;
  // The answer: an argmax key or a picked id, and its pinned host copy.
  unsigned long long* result_ = nullptr;
  unsigned long long* host_result_ = nullptr;
};

}  // namespace cuda
}  // namespace sparrow
