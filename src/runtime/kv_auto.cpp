#include "runtime/kv_auto.h"

#include <map>
#include <string_view>

#include "util/error.h"

namespace sparrow {

namespace {

struct Decision {
  std::string_view backend;
  int32_t head_dim;
  std::string_view k, v;
};

constexpr Decision kDecisions[] = {
#include "runtime/kernel_decisions.inc"
};

formats::KvCodec codec_named(std::string_view name) {
  const std::optional<formats::KvCodec> codec = formats::parse_kv_codec(name);
  if (!codec) throw Error("kernel decisions name an unknown KV codec '" + std::string(name) + "'");
  return *codec;
}

}  // namespace

KvCodecPair decided_kv_codecs(const std::string& backend, int32_t head_dim) {
  for (const Decision& d : kDecisions)
    if (d.backend == backend && d.head_dim == head_dim) return {codec_named(d.k), codec_named(d.v)};
  return {formats::KvCodec::F16, formats::KvCodec::F16};
}

std::string apply_kv_auto(const std::vector<KvLayerShape>& layers, const std::string& backend,
                          std::optional<formats::KvCodec> k, std::optional<formats::KvCodec> v, KvCacheOptions& o) {
  if (k && v) return "";
  std::vector<KvLayerOverride> chosen;
  std::map<int32_t, KvCodecPair> by_head_dim;
  for (int32_t il = 0; il < int32_t(layers.size()); ++il) {
    if (!layers[il].owns_kv) continue;
    const KvCodecPair decided = decided_kv_codecs(backend, layers[il].head_dim);
    const KvCodecPair pair{k.value_or(decided.k), v.value_or(decided.v)};
    by_head_dim.emplace(layers[il].head_dim, pair);
    chosen.push_back({.kind = KvLayerOverride::Kind::Range, .first = il, .last = il, .k_codec = pair.k,
                      .v_codec = pair.v});
  }
  o.layers.insert(o.layers.begin(), chosen.begin(), chosen.end());
  std::string line = std::string(!k && !v ? "-ctk/-ctv" : !k ? "-ctk" : "-ctv") + " auto (" + backend + "): ";
  for (auto it = by_head_dim.begin(); it != by_head_dim.end(); ++it) {
    if (it != by_head_dim.begin()) line += ", ";
    line += "head dim " + std::to_string(it->first) + " " + std::string(formats::kv_codec_info(it->second.k).name) +
            "/" + std::string(formats::kv_codec_info(it->second.v).name);
  }
  line += " (docs/kernel-decisions.md)";
  o.chosen_by = line;
  return line;
}

}  // namespace sparrow
