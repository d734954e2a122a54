#pragma once
// Attention over the KV cache on the CPU: one pass per (query token, head) with an online softmax, reading
// K and V rows straight from the cache (no score matrix, no decoded copy of the cache).
#include "cpu/thread_pool.h"
#include "ops/backend.h"

namespace sparrow::cpu {

void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens, int32_t first_position);
void attention(ThreadPool& pool, const AttentionArgs& args);

}  // namespace sparrow::cpu
