#include "kv/kv_presets.h"

#include <algorithm>
#include <cstdio>

#include "util/error.h"

namespace sparrow {

using formats::KvCodec;

namespace {

KvLayerOverride global_keys(KvCodec k, KvCodec v) {
  return {.kind = KvLayerOverride::Kind::Global, .k_codec = k, .v_codec = v};
}

// Whether each of the preset's overrides sets some layer of this model: one that names a kind the model lacks
// (no global layers) would leave the preset the same as its base, so the preset does not apply.
bool applies_to(const KvPreset& preset, const std::vector<KvLayerShape>& layers) {
  return std::all_of(preset.layers.begin(), preset.layers.end(), [&](const KvLayerOverride& ov) {
    for (int32_t il = 0; il < int32_t(layers.size()); ++il)
      if (layers[il].owns_kv && ov.selects(il, layers[il])) return true;
    return false;
  });
}

}  // namespace

const std::vector<KvPreset>& kv_presets() {
  // Mean KLD against f16 KV and bits per element, both on the default model at -c 512 (docs/kv-quality.md;
  // bench/results/kv-quality-gemma-3-270m-q4_k_m-b20cb0e.json), low-bit keys centered and balanced (the
  // defaults). Each has fewer bits and a higher KLD than the one before: the frontier of what was measured.
  // Chosen for quality alone: the trellis codecs decode slower than tbq4 at long contexts (docs/kv-quality.md).
  static const std::vector<KvPreset> presets = {
      {"f16", KvCodec::F16, KvCodec::F16, {}},                             // the reference, 16 bits
      {"q8_0", KvCodec::Q8_0, KvCodec::Q8_0, {}},                          // 0.0067, 8.5
      {"q8_0 K, tcq4 V", KvCodec::Q8_0, KvCodec::TCQ4, {}},                // 0.0110, 6.31
      {"tcq4, q8_0 K on global layers", KvCodec::TCQ4, KvCodec::TCQ4,      // 0.0194, 4.49
       {global_keys(KvCodec::Q8_0, KvCodec::TCQ4)}},
      {"tcq4", KvCodec::TCQ4, KvCodec::TCQ4, {}},                          // 0.0225, 4.125
      {"tcq4 K, tcq3 V, q8_0 K on global layers", KvCodec::TCQ4, KvCodec::TCQ3,  // 0.0289, 3.99
       {global_keys(KvCodec::Q8_0, KvCodec::TCQ3)}},
      {"tcq4 K, tcq3 V", KvCodec::TCQ4, KvCodec::TCQ3, {}},                // 0.0315, 3.63
      {"tcq3, q8_0 K on global layers", KvCodec::TCQ3, KvCodec::TCQ3,      // 0.0524, 3.57
       {global_keys(KvCodec::Q8_0, KvCodec::TCQ3)}},
      {"tcq3", KvCodec::TCQ3, KvCodec::TCQ3, {}},                          // 0.0611, 3.125
      {"tcq2", KvCodec::TCQ2, KvCodec::TCQ2, {}},                          // 0.265, 2.125
  };
  return presets;
}

std::string apply_kv_bits(const std::vector<KvLayerShape>& layers, double bits, KvCacheOptions& o) {
  double fewest = 0;  // the bits of the last preset that applies: the smallest
  for (const KvPreset& preset : kv_presets()) {
    if (!applies_to(preset, layers)) continue;
    KvCacheOptions candidate = o;
    candidate.k_codec = preset.k_codec;
    candidate.v_codec = preset.v_codec;
    candidate.layers = preset.layers;
    const double preset_bits = kv_bits_per_element(layers, candidate);
    fewest = preset_bits;
    if (preset_bits > bits) continue;
    char line[160];
    std::snprintf(line, sizeof line, "--kv-bits %g: %s, %.3g bits per element", bits, preset.name.c_str(),
                  preset_bits);
    o = candidate;
    o.chosen_by = line;
    return line;
  }
  char message[160];
  std::snprintf(message, sizeof message, "--kv-bits %g: no KV configuration is that small (the smallest, %s, takes "
                "%.3g bits per element)", bits, kv_presets().back().name.c_str(), fewest);
  throw Error(message);
}

}  // namespace sparrow
