#pragma once
// KV cache writes and fused attention on the GPU, over every KV codec. Declarations only on this branch: the
// kernels come from the KV codec and attention work (src/cuda/pending_kernels.cu stands in for them until then
// and throws).
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/backend.h"

namespace sparrow::cuda {

// Per-backend state of the attention kernels (split-context scratch), bound to one stream.
class AttentionContext {
 public:
  explicit AttentionContext(cudaStream_t stream);

 private:
  cudaStream_t stream_;
};

// Backend::kv_store on device memory: k and v are [n_tokens][n_kv_heads][head_dim] floats.
void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens, int32_t first_position,
              cudaStream_t stream);
// Backend::attention on device memory.
void attention(AttentionContext& ctx, const AttentionArgs& args);

}  // namespace sparrow::cuda
