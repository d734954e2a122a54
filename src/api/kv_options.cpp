#include "api/kv_options.h"

#include <sstream>

#include "util/error.h"

namespace sparrow {

using formats::KvCodec;
using formats::kv_codec_info;

namespace {

std::string codec_names(bool for_values) {
  std::string names;
  for (const formats::KvCodecInfo& info : formats::kv_codecs()) {
    if (for_values && info.keys_only) continue;
    names += (names.empty() ? "" : ", ") + std::string(info.name);
  }
  return names;
}

int32_t parse_layer_index(const std::string& text, const std::string& entry) {
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  if (text.empty() || used != text.size() || value < 0 || value > (1 << 20))
    throw Error("--kv-layers: '" + entry + "': '" + text + "' is not a layer index");
  return int32_t(value);
}

KvLayerOverride parse_override(const std::string& entry) {
  const size_t colon = entry.find(':');
  if (colon == std::string::npos)
    throw Error("--kv-layers: '" + entry + "' should look like 0-3:q8_0/tbq4 (layers:K/V), 5:f16 or global:q8_0/tbq4");
  const std::string layers = entry.substr(0, colon), codecs = entry.substr(colon + 1);
  KvLayerOverride o;
  if (layers == "sliding" || layers == "global") {
    o.kind = layers == "sliding" ? KvLayerOverride::Kind::Sliding : KvLayerOverride::Kind::Global;
  } else {
    const size_t dash = layers.find('-');
    o.first = parse_layer_index(layers.substr(0, dash), entry);
    o.last = dash == std::string::npos ? o.first : parse_layer_index(layers.substr(dash + 1), entry);
    if (o.last < o.first) throw Error("--kv-layers: '" + entry + "': the range ends before it starts");
  }
  const size_t slash = codecs.find('/');
  o.k_codec = parse_kv_codec_option(codecs.substr(0, slash), "--kv-layers (K)", false);
  o.v_codec = parse_kv_codec_option(slash == std::string::npos ? codecs : codecs.substr(slash + 1),
                                    "--kv-layers (V)", true);
  return o;
}

}  // namespace

formats::KvCodec parse_kv_codec_option(const std::string& name, const char* option, bool for_values) {
  const std::optional<KvCodec> codec = formats::parse_kv_codec(name);
  if (!codec)
    throw Error(std::string(option) + ": unknown KV cache codec '" + name + "' (expected auto or one of " +
                codec_names(for_values) + ")");
  if (for_values && kv_codec_info(*codec).keys_only)
    throw Error(std::string(option) + ": " + name + " stores keys only; V needs one of " + codec_names(true));
  return *codec;
}

std::optional<KvCodec> parse_kv_codec_choice(const std::string& name, const char* option, bool for_values) {
  if (name == "auto") return std::nullopt;
  return parse_kv_codec_option(name, option, for_values);
}

std::vector<KvLayerOverride> parse_kv_layers(const std::string& spec) {
  std::vector<KvLayerOverride> overrides;
  std::stringstream in(spec);
  std::string entry;
  while (std::getline(in, entry, ','))
    if (!entry.empty()) overrides.push_back(parse_override(entry));
  return overrides;
}

}  // namespace sparrow
