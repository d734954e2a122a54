#pragma once
// The KV cache of one sequence: per layer, the storage type of K and V, rings of the window size for
// sliding-window layers (memory follows the window, not the context), and nothing at all for Gemma 4's
// KV-shared layers, which read their source layer's cache.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "ops/backend.h"

namespace sparrow {

struct KvCacheOptions {
  int32_t n_ctx = 4096;   // positions the cache must hold
  int32_t n_batch = 512;  // most tokens written by one forward pass (sizes the sliding rings)
  TensorType type_k = TensorType::F16;
  TensorType type_v = TensorType::F16;
};

// "f32", "f16" -> the storage type; throws sparrow::Error naming the option otherwise.
TensorType parse_kv_type(const std::string& name, const char* option);

class KvCache {
 public:
  KvCache(Backend& backend, const ModelConfig& config, const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // The cache a layer reads and (if it owns KV) writes.
  const KvLayerView& layer(int32_t il) const { return views_[config_.layers[il].kv_source]; }
  int32_t n_ctx() const { return options_.n_ctx; }
  size_t bytes() const { return bytes_; }
  // Bytes of K+V per token of context, summed over layers of one kind (sliding or global) that own KV.
  size_t bytes_per_token(bool sliding) const;

 private:
  Backend& backend_;
  const ModelConfig& config_;
  KvCacheOptions options_;
  std::vector<KvLayerView> views_;  // indexed by layer; empty views for KV-shared layers
  size_t bytes_ = 0;
};

}  // namespace sparrow
