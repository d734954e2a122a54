#pragma once
// The KV cache of one sequence: per layer, the codec of K and of V (formats/kv/), rings of the window size
// for sliding-window layers (memory follows the window, not the context), and nothing at all for Gemma 4's
// KV-shared layers, which read their source layer's cache. Gemma 4's dual head dims come with the layers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "model/config.h"
#include "ops/backend.h"

namespace sparrow {

// Layers first..last (inclusive) store K and V with these codecs.
struct KvLayerOverride {
  int32_t first = 0, last = 0;
  formats::KvCodec k = formats::KvCodec::F16, v = formats::KvCodec::F16;
};

// Key centering (KvLayerView::k_center) per layer: Auto centers the keys of layers whose K codec is one of
// Sparrow's low-bit codecs and leaves llama.cpp's stock codecs (f32, f16, bf16, q8_0, q4_0) exactly as llama.cpp
// stores them.
enum class KeyCentering : int8_t { Auto, On, Off };

struct KvCacheOptions {
  int32_t n_ctx = 4096;   // positions the cache must hold
  int32_t n_batch = 512;  // most tokens written by one forward pass (sizes the sliding rings)
  formats::KvCodec type_k = formats::KvCodec::F16;
  formats::KvCodec type_v = formats::KvCodec::F16;
  std::vector<KvLayerOverride> layers;  // applied in order over type_k/type_v: later entries win
  KeyCentering center_keys = KeyCentering::Auto;
};

// A codec name given for `option` (-ctk, -ctv...) -> the codec; throws sparrow::Error naming the option and
// listing the codecs otherwise, or if a keys-only codec is given for values.
formats::KvCodec parse_kv_codec_option(const std::string& name, const char* option, bool for_values);
// "0-3:q8_0/tbq4,7:f16" (layers:K/V, or layers:C for both) -> overrides; throws sparrow::Error on bad syntax.
std::vector<KvLayerOverride> parse_kv_layers(const std::string& spec);

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
  // Bytes of K+V per token of context, summed over the layers of one kind (sliding or global) that own KV.
  size_t bytes_per_token(bool sliding) const;
  // Lines for the user: per layer kind (sliding, global, shared) the codecs, bytes per token and in all.
  std::string summary() const;

 private:
  Backend& backend_;
  const ModelConfig& config_;
  KvCacheOptions options_;
  std::vector<KvLayerView> views_;  // indexed by layer; empty views for KV-shared layers
  size_t bytes_ = 0;
};

}  // namespace sparrow
