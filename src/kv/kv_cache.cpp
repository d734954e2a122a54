#include "kv/kv_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
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
    throw Error("--kv-layers: '" + entry + "' should look like 0-3:q8_0/tbq4 (layers:K/V) or 5:f16");
  const std::string layers = entry.substr(0, colon), codecs = entry.substr(colon + 1);
  KvLayerOverride o;
  const size_t dash = layers.find('-');
  o.first = parse_layer_index(layers.substr(0, dash), entry);
  o.last = dash == std::string::npos ? o.first : parse_layer_index(layers.substr(dash + 1), entry);
  if (o.last < o.first) throw Error("--kv-layers: '" + entry + "': the range ends before it starts");
  const size_t slash = codecs.find('/');
  o.k = parse_kv_codec_option(codecs.substr(0, slash), "--kv-layers (K)", false);
  o.v = parse_kv_codec_option(slash == std::string::npos ? codecs : codecs.substr(slash + 1), "--kv-layers (V)",
                              true);
  return o;
}

size_t block_bytes(KvCodec codec, int32_t head_dim) { return kv_codec_info(codec).block_bytes(head_dim); }

int64_t slots(const ModelConfig& config, const LayerConfig& l, const KvCacheOptions& o) {
  return l.sliding ? std::min<int64_t>(o.n_ctx, int64_t(config.sliding_window) + o.n_batch) : o.n_ctx;
}

// The codecs of every layer that owns KV, after the overrides; checks the overrides against the model.
std::vector<std::pair<KvCodec, KvCodec>> layer_codecs(const ModelConfig& config, const KvCacheOptions& o) {
  std::vector<std::pair<KvCodec, KvCodec>> codecs(config.n_layer, {o.type_k, o.type_v});
  for (const KvLayerOverride& ov : o.layers) {
    if (ov.last >= config.n_layer)
      throw Error("--kv-layers: layer " + std::to_string(ov.last) + " does not exist (the model has " +
                  std::to_string(config.n_layer) + " layers, 0-" + std::to_string(config.n_layer - 1) + ")");
    bool any_owner = false;
    for (int32_t il = ov.first; il <= ov.last; ++il) {
      if (!config.layers[il].owns_kv) continue;
      codecs[il] = {ov.k, ov.v};
      any_owner = true;
    }
    if (!any_owner)
      throw Error("--kv-layers: layers " + std::to_string(ov.first) + "-" + std::to_string(ov.last) +
                  " share another layer's KV cache (layer " + std::to_string(config.layers[ov.first].kv_source) +
                  "); set the codec on that layer");
  }
  return codecs;
}

// Keys have a large common component (in Gemma 3 270M, 30-75% of their energy is the mean key of the
// sequence); removing it before a low-bit codec quantizes them cut the mean KLD of tbq4 against f16 2.3x.
bool centers_keys(KeyCentering mode, KvCodec k_codec) {
  if (mode != KeyCentering::Auto) return mode == KeyCentering::On;
  switch (k_codec) {
    case KvCodec::F32: case KvCodec::F16: case KvCodec::BF16: case KvCodec::Q8_0: case KvCodec::Q4_0: return false;
    default: return true;
  }
}

// Refuses, before allocating anything, a cache larger than the machine's memory.
void check_fits_in_memory(double total, int32_t n_ctx) {
  const double physical = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (total > physical)
    throw Error("KV cache for a context of " + std::to_string(n_ctx) + " tokens needs " +
                std::to_string(int64_t(total / (1 << 20))) + " MiB, more than this machine's " +
                std::to_string(int64_t(physical / (1 << 20))) + " MiB of memory");
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1 << 20));
  return buf;
}

}  // namespace

formats::KvCodec parse_kv_codec_option(const std::string& name, const char* option, bool for_values) {
  const std::optional<KvCodec> codec = formats::parse_kv_codec(name);
  if (!codec)
    throw Error(std::string(option) + ": unknown KV cache codec '" + name + "' (expected one of " +
                codec_names(for_values) + ")");
  if (for_values && kv_codec_info(*codec).keys_only)
    throw Error(std::string(option) + ": " + name + " stores keys only; V needs one of " + codec_names(true));
  return *codec;
}

std::vector<KvLayerOverride> parse_kv_layers(const std::string& spec) {
  std::vector<KvLayerOverride> overrides;
  std::stringstream in(spec);
  std::string entry;
  while (std::getline(in, entry, ','))
    if (!entry.empty()) overrides.push_back(parse_override(entry));
  return overrides;
}

KvCache::KvCache(Backend& backend, const ModelConfig& config, const KvCacheOptions& options)
    : backend_(backend), config_(config), options_(options), views_(config.n_layer) {
  if (options.n_ctx <= 0 || options.n_batch <= 0) throw Error("KV cache: n_ctx and n_batch must be positive");
  parse_kv_codec_option(std::string(kv_codec_info(options.type_v).name), "--cache-type-v", true);
  const auto codecs = layer_codecs(config, options);
  double total = 0;
  for (int32_t il = 0; il < config.n_layer; ++il) {
    const LayerConfig& l = config.layers[il];
    if (!l.owns_kv) continue;
    if (!formats::kv_head_dim_supported(l.head_dim))
      throw Error("KV cache: layer " + std::to_string(il) + " has head dim " + std::to_string(l.head_dim) +
                  ", which the KV codecs do not support (64, 128, 256 or 512)");
    total += double(slots(config, l, options)) * l.n_kv_heads *
             double(block_bytes(codecs[il].first, l.head_dim) + block_bytes(codecs[il].second, l.head_dim));
  }
  check_fits_in_memory(total, options.n_ctx);
  for (int32_t il = 0; il < config.n_layer; ++il) {
    const LayerConfig& l = config.layers[il];
    if (!l.owns_kv) continue;
    KvLayerView& v = views_[il];
    v.k_codec = codecs[il].first;
    v.v_codec = codecs[il].second;
    v.n_kv_heads = l.n_kv_heads;
    v.head_dim = l.head_dim;
    v.capacity = slots(config, l, options);
    const size_t k_bytes = size_t(v.capacity) * l.n_kv_heads * block_bytes(v.k_codec, l.head_dim);
    const size_t v_bytes = size_t(v.capacity) * l.n_kv_heads * block_bytes(v.v_codec, l.head_dim);
    v.k = backend.alloc_bytes(k_bytes);
    if (centers_keys(options.center_keys, v.k_codec)) v.k_center = backend.alloc(size_t(l.n_kv_heads) * l.head_dim);
    v.v = backend.alloc_bytes(v_bytes);
    bytes_ += k_bytes + v_bytes;
  }
}

KvCache::~KvCache() {
  for (KvLayerView& v : views_) {
    if (v.k) backend_.free_buffer(v.k);
    if (v.v) backend_.free_buffer(v.v);
    if (v.k_center) backend_.free_buffer(v.k_center);
  }
}

size_t KvCache::bytes_per_token(bool sliding) const {
  size_t total = 0;
  for (int32_t il = 0; il < config_.n_layer; ++il) {
    const LayerConfig& l = config_.layers[il];
    const KvLayerView& v = views_[il];
    if (!l.owns_kv || l.sliding != sliding) continue;
    total += size_t(l.n_kv_heads) * (block_bytes(v.k_codec, l.head_dim) + block_bytes(v.v_codec, l.head_dim));
  }
  return total;
}

std::string KvCache::summary() const {
  struct Kind {
    int32_t layers = 0;
    int64_t slots = 0;
    double bytes = 0;
    std::map<std::string, int32_t> codecs;  // "tbq4/tbq3" -> layers
  };
  Kind sliding, global, shared;
  for (int32_t il = 0; il < config_.n_layer; ++il) {
    const LayerConfig& l = config_.layers[il];
    Kind& kind = !l.owns_kv ? shared : l.sliding ? sliding : global;
    ++kind.layers;
    if (!l.owns_kv) continue;
    const KvLayerView& v = views_[il];
    kind.slots = v.capacity;
    kind.bytes += double(v.capacity) * v.n_kv_heads *
                  double(block_bytes(v.k_codec, v.head_dim) + block_bytes(v.v_codec, v.head_dim));
    ++kind.codecs[std::string(kv_codec_info(v.k_codec).name) + "/" + std::string(kv_codec_info(v.v_codec).name) +
                  (v.k_center ? " centered K" : "")];
  }
  std::ostringstream out;
  out << "KV cache: " << mib(double(bytes_)) << " for a context of " << options_.n_ctx << " tokens\n";
  auto line = [&](const char* name, const Kind& kind, size_t per_token) {
    if (kind.layers == 0) return;
    out << "  " << name << ": " << kind.layers << " layers";
    if (&kind == &shared) {
      out << ", read their source layer's cache: 0 bytes\n";
      return;
    }
    out << " (";
    for (auto it = kind.codecs.begin(); it != kind.codecs.end(); ++it)
      out << (it == kind.codecs.begin() ? "" : ", ") << it->first
          << (kind.codecs.size() > 1 ? " x" + std::to_string(it->second) : "");
    out << "), " << per_token << " bytes/token, " << kind.slots << " slots"
        << (&kind == &sliding ? " (ring: window + batch)" : "") << ", " << mib(kind.bytes) << "\n";
  };
  line("sliding", sliding, bytes_per_token(true));
  line("global", global, bytes_per_token(false));
  line("shared", shared, 0);
  return out.str();
}

}  // namespace sparrow
