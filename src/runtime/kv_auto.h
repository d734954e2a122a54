#pragma once
// -ctk auto / -ctv auto (the default): each layer's K and V codecs from the kernel decisions
// (docs/kernel-decisions.md, generated with its table by scripts/kernel-decisions from the committed verify,
// bench and KV-quality results), by the session's backend and the layer's head dim.
#include <optional>
#include <string>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "kv/kv_cache.h"

namespace sparrow {

struct KvCodecPair {
  formats::KvCodec k, v;
};

// The decided pair for a backend ("cpu", "cuda") and head dim; f16/f16 for a backend or head dim the decisions
// do not cover (a test backend).
KvCodecPair decided_kv_codecs(const std::string& backend, int32_t head_dim);

// Resolves the codecs left to auto (k or v empty) into one override per layer that owns KV, placed before o's
// own overrides so that those still win, and returns a line saying what it chose (also put in o.chosen_by).
// With both given, changes nothing and returns "".
std::string apply_kv_auto(const std::vector<KvLayerShape>& layers, const std::string& backend,
                          std::optional<formats::KvCodec> k, std::optional<formats::KvCodec> v, KvCacheOptions& o);

}  // namespace sparrow
