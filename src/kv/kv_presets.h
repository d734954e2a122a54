#pragma once
// --kv-bits B: the KV configurations Sparrow has measured, ranked by quality, and the choice of the best one whose
// average bits per cached element, on a given model's layers, is at most B.
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace sparrow {

struct KvPreset {
  std::string name;  // "tbq4, q8_0 K on global layers"
  formats::KvCodec k_codec, v_codec;
  std::vector<KvLayerOverride> layers;
};

// Best first: by mean KL divergence against f16 KV on the default model (Gemma 3 270M) at -c 512, measured by
// scripts/kv-quality and per-layer runs (docs/kv-quality.md). On that model each also has fewer bits than the one
// before, so the first that fits a budget is the best that does; on others the first that fits is the best-ranked.
const std::vector<KvPreset>& kv_presets();

// Sets o's codecs and per-layer overrides to the first preset whose bits per element on these layers are at most
// `bits`, and returns a line saying what it chose. Throws sparrow::Error when none fits.
std::string apply_kv_bits(const std::vector<KvLayerShape>& layers, double bits, KvCacheOptions& o);

}  // namespace sparrow
