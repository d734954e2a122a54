#pragma once
// Layer shapes the KV cache tests share.
#include <vector>

#include "kv/kv_cache.h"

namespace sparrow::kv_test {

// Gemma-4-like: sliding layers with head dim 256 and 2 KV heads, a global layer with head dim 512 and 1 KV
// head, and two KV-shared layers reading layers 3 (sliding) and 2 (global).
inline std::vector<KvLayerShape> mixed_layers() {
  return {{.sliding = true, .head_dim = 256, .n_kv_heads = 2, .owns_kv = true, .kv_source = 0},
          {.sliding = true, .head_dim = 256, .n_kv_heads = 2, .owns_kv = true, .kv_source = 1},
          {.sliding = false, .head_dim = 512, .n_kv_heads = 1, .owns_kv = true, .kv_source = 2},
          {.sliding = true, .head_dim = 256, .n_kv_heads = 2, .owns_kv = true, .kv_source = 3},
          {.sliding = true, .head_dim = 256, .n_kv_heads = 2, .owns_kv = false, .kv_source = 3},
          {.sliding = false, .head_dim = 512, .n_kv_heads = 1, .owns_kv = false, .kv_source = 2}};
}

}  // namespace sparrow::kv_test
