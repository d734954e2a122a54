#pragma once
// KV-cache writes and fused attention on the GPU: the same semantics as src/cpu/attention.h, reading every KV
// codec directly through its DeviceCodec (src/cuda/kv/device_codec.cuh). Kernels and launch shapes:
// docs/cuda.md, section "Attention".
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/device_position.h"
#include "cuda/device_scratch.h"
#include "ops/backend.h"

namespace sparrow::cuda {

// Per-stream scratch for attention (prepared queries, split-K partial results and their counters), grown on demand
// (device_scratch.h).
class AttentionContext {
 public:
  explicit AttentionContext(cudaStream_t stream);
  ~AttentionContext() = default;
  AttentionContext(const AttentionContext&) = delete;
  AttentionContext& operator=(const AttentionContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  int multiprocessors() const { return multiprocessors_; }
  size_t max_shared_bytes() const { return max_shared_bytes_; }  // dynamic shared memory one CTA may opt into
  // Scratch of at least n floats, valid until the next call of the same function; contents undefined.
  float* prepared_queries(size_t n) { return prepared_.get<float>(n); }
  float* partial_accumulators(size_t n) { return partial_acc_.get<float>(n); }
  float* partial_states(size_t n) { return partial_state_.get<float>(n); }
  // At least n counters, zero before the first kernel that uses them; the kernels leave them zero.
  int32_t* split_counters(size_t n) { return split_counters_.zeroed<int32_t>(n); }

 private:
  cudaStream_t stream_;
  int multiprocessors_ = 0;
  size_t max_shared_bytes_ = 0;
  DeviceScratch prepared_, partial_acc_, partial_state_, split_counters_;
};

// Encodes K and V rows ([n_tokens][n_kv_heads][head_dim], device memory) for positions first_position.. into
// kv's ring slots (position p in slot p % capacity; of a batch longer than the capacity only the last capacity
// tokens are stored). When kv.k_center is non-null, the key stored is k - k_center[head] (the center vector,
// [n_kv_heads][head_dim] in device memory, is set by the KV cache before this call; kv_store only subtracts it).
void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens, DevicePosition first_position,
              cudaStream_t stream);

// Causal (optionally sliding-window) softmax attention of args.q over args.kv, on ctx's stream; every pointer is
// device memory. Query head h reads KV head h / (n_heads / n_kv_heads). first_position_at (null: none) is device
// memory holding args.first_position when the kernels run (device_position.h); the launch plan (the split count)
// is made from args.first_position.
void attention(AttentionContext& ctx, const AttentionArgs& args, const int32_t* first_position_at = nullptr);

// What attention(ctx, args) launches besides its arguments: the split count, the query rows per CTA and the
// scratch it uses, planned (and the scratch grown) without launching anything. A CUDA graph that captured a call
// holds exactly these.
struct AttentionLaunch {
  int32_t n_splits = 0;
  int32_t rows_per_cta = 0;
  const void* prepared = nullptr;        // null when the flash kernel prepares its queries itself
  const void* partial_acc = nullptr;
  const void* partial_state = nullptr;
  const void* split_counters = nullptr;  // null unless the flash kernel's CTAs merge several splits
};
AttentionLaunch plan_attention(AttentionContext& ctx, const AttentionArgs& args);

}  // namespace sparrow::cuda
