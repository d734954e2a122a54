#include "kv/kv_cache.h"

#include <unistd.h>

#include <algorithm>

#include "util/error.h"

namespace sparrow {

TensorType parse_kv_type(const std::string& name, const char* option) {
  if (name == "f16") return TensorType::F16;
  if (name == "f32") return TensorType::F32;
  throw Error(std::string(option) + ": unknown KV cache type '" + name + "' (expected f16 or f32)");
}

namespace {

size_t row_bytes(TensorType type, int64_t n) { return tensor_row_bytes(type, n); }

int64_t slots(const ModelConfig& config, const LayerConfig& l, const KvCacheOptions& o) {
  return l.sliding ? std::min<int64_t>(o.n_ctx, int64_t(config.sliding_window) + o.n_batch) : o.n_ctx;
}

// Refuses, before allocating anything, a cache larger than the machine's memory.
void check_fits_in_memory(const ModelConfig& config, const KvCacheOptions& o) {
  double total = 0;
  for (const LayerConfig& l : config.layers)
    if (l.owns_kv)
      total += double(slots(config, l, o)) * l.n_kv_heads * (row_bytes(o.type_k, l.head_dim) + row_bytes(o.type_v, l.head_dim));
  const double physical = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (total > physical)
    throw Error("KV cache for a context of " + std::to_string(o.n_ctx) + " tokens needs " +
                std::to_string(int64_t(total / (1 << 20))) + " MiB, more than this machine's " +
                std::to_string(int64_t(physical / (1 << 20))) + " MiB of memory");
}

}  // namespace

KvCache::KvCache(Backend& backend, const ModelConfig& config, const KvCacheOptions& options)
    : backend_(backend), config_(config), options_(options), views_(config.n_layer) {
  if (options.n_ctx <= 0 || options.n_batch <= 0)
    throw Error("KV cache: n_ctx and n_batch must be positive");
  if (options.type_k != options.type_v)
    throw Error("KV cache: K and V must use the same type for now (got different -ctk and -ctv)");
  check_fits_in_memory(config, options);
  for (int32_t il = 0; il < config.n_layer; ++il) {
    const LayerConfig& l = config.layers[il];
    if (!l.owns_kv) continue;
    KvLayerView& v = views_[il];
    v.type = options.type_k;
    v.n_kv_heads = l.n_kv_heads;
    v.head_dim = l.head_dim;
    v.capacity = slots(config, l, options);
    const size_t k_bytes = size_t(v.capacity) * l.n_kv_heads * row_bytes(options.type_k, l.head_dim);
    const size_t v_bytes = size_t(v.capacity) * l.n_kv_heads * row_bytes(options.type_v, l.head_dim);
    v.k = backend.alloc_bytes(k_bytes);
    v.v = backend.alloc_bytes(v_bytes);
    bytes_ += k_bytes + v_bytes;
  }
}

KvCache::~KvCache() {
  for (KvLayerView& v : views_) {
    if (v.k) backend_.free_buffer(v.k);
    if (v.v) backend_.free_buffer(v.v);
  }
}

size_t KvCache::bytes_per_token(bool sliding) const {
  size_t total = 0;
  for (int32_t il = 0; il < config_.n_layer; ++il) {
    const LayerConfig& l = config_.layers[il];
    if (!l.owns_kv || l.sliding != sliding) continue;
    total += l.n_kv_heads * (row_bytes(options_.type_k, l.head_dim) + row_bytes(options_.type_v, l.head_dim));
  }
  return total;
}

}  // namespace sparrow
