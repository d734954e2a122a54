#pragma once
// Fused attention over the compressed KV cache on the CPU (see attention.cpp), and the cache writes.
#include "cpu/thread_pool.h"
#include "ops/backend.h"

namespace sparrow::cpu {

// Encodes K and V rows ([n_tokens][n_kv_heads][head_dim]) with the layer's codecs into their slots (position p
// in slot p mod capacity; of a batch longer than the capacity only the last `capacity` tokens are stored), keys
// minus kv.k_center when it is set.
void kv_store(ThreadPool& pool, const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
              int32_t first_position);
void attention(ThreadPool& pool, const AttentionArgs& args);

}  // namespace sparrow::cpu
