#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "util/binary_io.h"
#include "util/error.h"

namespace sparrow {

using formats::KvCodec;
using formats::kv_codec_info;

namespace {

size_t block_bytes(KvCodec codec, int32_t head_dim) { return kv_codec_info(codec).block_bytes(head_dim); }

int64_t slots(const KvLayerShape& l, const KvCacheOptions& o) {
  return l.sliding ? std::min<int64_t>(o.n_ctx, int64_t(o.sliding_window) + o.n_batch) : o.n_ctx;
}

// The layers an override sets: those that own KV among its range, or of its kind. Throws when there are none,
// or when the range does not exist in the model.
std::vector<int32_t> overridden_layers(const KvLayerOverride& ov, const std::vector<KvLayerShape>& layers) {
  const int32_t n_layer = int32_t(layers.size());
  std::vector<int32_t> selected;
  if (ov.kind != KvLayerOverride::Kind::Range) {
    for (int32_t il = 0; il < n_layer; ++il)
      if (layers[il].owns_kv && ov.selects(il, layers[il])) selected.push_back(il);
    if (selected.empty())
      throw Error(std::string("--kv-layers: the model has no ") +
                  (ov.kind == KvLayerOverride::Kind::Sliding ? "sliding" : "global") + " layers");
    return selected;
  }
  if (ov.first < 0 || ov.last < ov.first)
    throw Error("--kv-layers: " + std::to_string(ov.first) + "-" + std::to_string(ov.last) +
                " is not a range of layers");
  if (ov.last >= n_layer)
    throw Error("--kv-layers: layer " + std::to_string(ov.last) + " does not exist (the model has " +
                std::to_string(n_layer) + " layers, 0-" + std::to_string(n_layer - 1) + ")");
  for (int32_t il = ov.first; il <= ov.last; ++il)
    if (layers[il].owns_kv && ov.selects(il, layers[il])) selected.push_back(il);
  if (selected.empty())
    throw Error("--kv-layers: layers " + std::to_string(ov.first) + "-" + std::to_string(ov.last) +
                " share another layer's KV cache (layer " + std::to_string(layers[ov.first].kv_source) +
                "); set the codec on that layer");
  return selected;
}

// The codecs of every layer that owns KV, after the overrides; checks the overrides against the model.
std::vector<std::pair<KvCodec, KvCodec>> layer_codecs(const std::vector<KvLayerShape>& layers,
                                                      const KvCacheOptions& o) {
  std::vector<std::pair<KvCodec, KvCodec>> codecs(layers.size(), {o.k_codec, o.v_codec});
  for (const KvLayerOverride& ov : o.layers)
    for (int32_t il : overridden_layers(ov, layers)) codecs[size_t(il)] = {ov.k_codec, ov.v_codec};
  for (const auto& [k, v] : codecs)
    if (kv_codec_info(v).keys_only)
      throw Error(std::string(kv_codec_info(v).name) + " stores keys only and cannot hold V");
  return codecs;
}

// Whether a layer with these codecs keeps protected positions: when one of them has fewer bits than the
// protected codec (a q8_0 or f16 cache gains nothing from an f16 copy of some of its positions).
bool protects(const KvCacheOptions& o, std::pair<KvCodec, KvCodec> codecs, int32_t head_dim) {
  if (o.protected_sinks <= 0 && o.protected_window <= 0) return false;
  const double bits = formats::kv_bits_per_element(o.protected_codec, head_dim);
  return formats::kv_bits_per_element(codecs.first, head_dim) < bits ||
         formats::kv_bits_per_element(codecs.second, head_dim) < bits;
}

// The window ring of a protected layer: the window and a whole batch (KvLayerView::window_capacity).
int64_t window_capacity(const KvCacheOptions& o) { return int64_t(std::max(o.protected_window, 1)) + o.n_batch; }

}  // namespace

double kv_bits_per_element(const std::vector<KvLayerShape>& layers, const KvCacheOptions& options) {
  const auto codecs = layer_codecs(layers, options);
  double bytes = 0, elements = 0;
  for (size_t il = 0; il < layers.size(); ++il) {
    const KvLayerShape& l = layers[il];
    if (!l.owns_kv) continue;
    bytes += double(l.n_kv_heads) * double(block_bytes(codecs[il].first, l.head_dim) +
                                           block_bytes(codecs[il].second, l.head_dim));
    if (protects(options, codecs[il], l.head_dim))
      bytes += double(options.protected_sinks + options.protected_window) / std::max(options.n_ctx, 1) *
               l.n_kv_heads * 2.0 * double(block_bytes(options.protected_codec, l.head_dim));
    elements += 2.0 * l.n_kv_heads * l.head_dim;
  }
  return elements > 0 ? 8 * bytes / elements : 0;
}

namespace {

// llama.cpp's own codecs: stored exactly as llama.cpp stores them unless asked otherwise.
bool stock_codec(KvCodec codec) {
  switch (codec) {
    case KvCodec::F32: case KvCodec::F16: case KvCodec::BF16: case KvCodec::Q8_0: case KvCodec::Q4_0: return true;
    default: return false;
  }
}

// Keys have a large common component (in Gemma 3 270M, 30-75% of their energy is the mean key of the
// sequence); removing it before a low-bit codec quantizes them cut the mean KLD of tbq4 against f16 2.3x.
bool centers_keys(KeyCentering mode, KvCodec k_codec) {
  return mode == KeyCentering::Auto ? !stock_codec(k_codec) : mode == KeyCentering::On;
}

// Balancing halved the mean KLD of tbq4, tbq3 and tcq3 keys on Gemma 3 270M (docs/kv-quality.md).
bool balances_keys(KeyBalancing mode, KvCodec k_codec) {
  return mode == KeyBalancing::Auto ? !stock_codec(k_codec) : mode == KeyBalancing::On;
}

// Refuses, before allocating anything, a cache larger than the memory the backend allocates from.
void check_fits_in_memory(const Backend& backend, double total, int32_t n_ctx) {
  const double capacity = double(backend.memory_capacity());
  if (total > capacity)
    throw Error("KV cache for a context of " + std::to_string(n_ctx) + " tokens needs " +
                std::to_string(int64_t(total / (1 << 20))) + " MiB, more than the " +
                std::to_string(int64_t(capacity / (1 << 20))) + " MiB of memory of the " + backend.name() +
                " backend");
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1 << 20));
  return buf;
}

}  // namespace

KvCache::KvCache(Backend& backend, std::vector<KvLayerShape> layers, const KvCacheOptions& options)
    : backend_(backend),
      layers_(std::move(layers)),
      options_(options),
      views_(layers_.size()),
      balanced_(layers_.size(), false) {
  if (options.n_ctx <= 0 || options.n_batch <= 0) throw Error("KV cache: n_ctx and n_batch must be positive");
  if (options.protected_sinks < 0 || options.protected_window < 0 || options.protected_sinks > options.n_ctx ||
      options.protected_window > options.n_ctx)
    throw Error("KV cache: --kv-sinks and --kv-window must be between 0 and the context (" +
                std::to_string(options.n_ctx) + ")");
  if (kv_codec_info(options.protected_codec).keys_only)
    throw Error(std::string(kv_codec_info(options.protected_codec).name) +
                " stores keys only and cannot hold the protected positions' values");
  const auto codecs = layer_codecs(layers_, options);
  double total = 0;
  for (size_t il = 0; il < layers_.size(); ++il) {
    const KvLayerShape& l = layers_[il];
    if (!l.owns_kv) continue;
    if (!formats::kv_head_dim_supported(l.head_dim))
      throw Error("KV cache: layer " + std::to_string(il) + " has head dim " + std::to_string(l.head_dim) +
                  ", which the KV codecs do not support (64, 128, 256 or 512)");
    total += double(slots(l, options)) * l.n_kv_heads *
             double(block_bytes(codecs[il].first, l.head_dim) + block_bytes(codecs[il].second, l.head_dim));
    if (protects(options, codecs[il], l.head_dim))
      total += double(options.protected_sinks + window_capacity(options)) * l.n_kv_heads * 2.0 *
               double(block_bytes(options.protected_codec, l.head_dim));
  }
  check_fits_in_memory(backend, total, options.n_ctx);
  for (size_t il = 0; il < layers_.size(); ++il) {
    const KvLayerShape& l = layers_[il];
    if (!l.owns_kv) continue;
    KvLayerView& v = views_[il];
    v.k_codec = codecs[il].first;
    v.v_codec = codecs[il].second;
    v.n_kv_heads = l.n_kv_heads;
    v.head_dim = l.head_dim;
    v.capacity = slots(l, options);
    const size_t k_bytes = size_t(v.capacity) * l.n_kv_heads * block_bytes(v.k_codec, l.head_dim);
    const size_t v_bytes = size_t(v.capacity) * l.n_kv_heads * block_bytes(v.v_codec, l.head_dim);
    v.k = backend.alloc_bytes(k_bytes);
    if (centers_keys(options.center_keys, v.k_codec)) v.k_center = backend.alloc(size_t(l.n_kv_heads) * l.head_dim);
    balanced_[il] = balances_keys(options.balance_keys, v.k_codec);
    v.v = backend.alloc_bytes(v_bytes);
    bytes_ += k_bytes + v_bytes;
    if (protects(options, codecs[il], l.head_dim)) {
      v.sinks = options.protected_sinks;
      v.window = options.protected_window;
      v.protected_codec = options.protected_codec;
      v.window_capacity = window_capacity(options);
      const size_t p_bytes = size_t(v.protected_slots()) * l.n_kv_heads * block_bytes(v.protected_codec, l.head_dim);
      v.protected_k = backend.alloc_bytes(p_bytes);
      v.protected_v = backend.alloc_bytes(p_bytes);
      bytes_ += 2 * p_bytes;
    }
  }
}

void KvCache::store(int32_t il, const float* k, const float* v, int64_t n_tokens, int32_t first_position) {
  const KvLayerView& view = views_[il];
  if (!layers_[il].owns_kv) throw Error("KV cache: layer " + std::to_string(il) + " reads another layer's cache");
  if (view.k_center && first_position == 0) set_key_center(view, k, n_tokens);
  backend_.kv_store(view, k, v, n_tokens, first_position);
  end_ = std::max(end_, first_position + n_tokens);
}

int64_t KvCache::oldest_held() const {
  int64_t oldest = restored_from_;
  for (size_t il = 0; il < layers_.size(); ++il)
    if (layers_[il].owns_kv && layers_[il].sliding) oldest = std::max(oldest, end_ - views_[il].capacity);
  return oldest;
}

int64_t KvCache::oldest_in_windows() const {
  int64_t oldest = window_restored_from_;
  for (const KvLayerView& v : views_)
    if (v.protects()) oldest = std::max(oldest, end_ - v.window_capacity);
  return oldest;
}

void KvCache::check_truncate(int32_t n_past) const {
  if (options_.protected_window > 0 &&
      std::max<int64_t>(0, int64_t(n_past) - options_.protected_window + 1) < oldest_in_windows())
    throw Error("truncate: the protected window rings no longer hold the " +
                std::to_string(options_.protected_window) + " positions before " + std::to_string(n_past) +
                "; start the sequence over instead");
  const bool any_sliding = std::any_of(layers_.begin(), layers_.end(),
                                       [](const KvLayerShape& l) { return l.owns_kv && l.sliding; });
  if (any_sliding && std::max<int64_t>(0, n_past - options_.sliding_window) < oldest_held())
    throw Error("truncate: the sliding-window rings no longer hold the " + std::to_string(options_.sliding_window) +
                " positions before " + std::to_string(n_past) + " (they keep " +
                std::to_string(end_ - oldest_held() - options_.sliding_window) +
                " beyond the window, back from the furthest position " + std::to_string(end_) +
                "); start the sequence over instead");
}

void KvCache::reset() {
  end_ = 0;
  restored_from_ = 0;
  window_restored_from_ = 0;
}

void KvCache::set_key_center(const KvLayerView& view, const float* k, int64_t n_tokens) {
  const int64_t width = int64_t(view.n_kv_heads) * view.head_dim;  // one token's keys, all heads
  if (n_tokens < kKeyCenterMinTokens) {
    const std::vector<float> zeros(size_t(width), 0.0f);
    backend_.write(view.k_center, zeros.data(), zeros.size());
    return;
  }
  backend_.mean_rows(k + width, n_tokens - 1, width, view.k_center);
}

KvCache::~KvCache() {
  for (KvLayerView& v : views_) {
    if (v.k) backend_.free_buffer(v.k);
    if (v.v) backend_.free_buffer(v.v);
    if (v.k_center) backend_.free_buffer(v.k_center);
    if (v.protected_k) backend_.free_buffer(v.protected_k);
    if (v.protected_v) backend_.free_buffer(v.protected_v);
  }
}

size_t KvCache::bytes_per_token(bool sliding) const {
  size_t total = 0;
  for (size_t il = 0; il < layers_.size(); ++il) {
    const KvLayerShape& l = layers_[il];
    const KvLayerView& v = views_[il];
    if (!l.owns_kv || l.sliding != sliding) continue;
    total += size_t(l.n_kv_heads) * (block_bytes(v.k_codec, l.head_dim) + block_bytes(v.v_codec, l.head_dim));
  }
  return total;
}

size_t KvCache::bytes_read_by_decode(int32_t n_past) const {
  size_t total = 0;
  for (const KvLayerShape& l : layers_) {
    const KvLayerView& v = views_[size_t(l.kv_source)];
    const int64_t visible = l.sliding && options_.sliding_window > 0
                                ? std::min<int64_t>(int64_t(n_past) + 1, options_.sliding_window)
                                : int64_t(n_past) + 1;
    total += size_t(visible) * size_t(v.n_kv_heads) *
             (block_bytes(v.k_codec, v.head_dim) + block_bytes(v.v_codec, v.head_dim));
    // Protected positions are read from their own blocks (and their main blocks are not read).
    if (v.protects())
      total += size_t(std::min<int64_t>(visible, v.sinks + v.window)) * v.n_kv_heads * 2 *
               block_bytes(v.protected_codec, v.head_dim);
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
  for (size_t il = 0; il < layers_.size(); ++il) {
    const KvLayerShape& l = layers_[il];
    Kind& kind = !l.owns_kv ? shared : l.sliding ? sliding : global;
    ++kind.layers;
    if (!l.owns_kv) continue;
    const KvLayerView& v = views_[il];
    kind.slots = v.capacity;
    kind.bytes += double(v.capacity) * v.n_kv_heads *
                  double(block_bytes(v.k_codec, v.head_dim) + block_bytes(v.v_codec, v.head_dim));
    ++kind.codecs[std::string(kv_codec_info(v.k_codec).name) + "/" + std::string(kv_codec_info(v.v_codec).name) +
                  (v.k_center ? " centered K" : "") + (balanced_[il] ? " balanced K" : "")];
  }
  std::ostringstream out;
  if (!options_.chosen_by.empty()) out << options_.chosen_by << "\n";
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
  int32_t protected_layers = 0;
  double protected_bytes = 0, per_position = 0;
  for (const KvLayerView& v : views_) {
    if (!v.protects()) continue;
    ++protected_layers;
    const double block = double(block_bytes(v.protected_codec, v.head_dim)) * v.n_kv_heads * 2;  // K and V
    per_position += block;
    protected_bytes += block * double(v.protected_slots());
  }
  // Per token: the sinks and the window over the context, as kv_bits_per_element counts them.
  if (protected_layers > 0)
    out << "  protected: the first " << options_.protected_sinks << " and the last " << options_.protected_window
        << " positions in " << kv_codec_info(options_.protected_codec).name << " on " << protected_layers
        << " layers, " << std::lround(per_position) << " bytes/position, +"
        << std::lround(per_position * (options_.protected_sinks + options_.protected_window) / options_.n_ctx)
        << " bytes/token over the context (ring: window + batch), " << mib(protected_bytes) << "\n";
  return out.str();
}

void KvCache::copy_positions(const KvLayerView& view, bool keys, int64_t first, int64_t end, uint8_t* host,
                             bool to_host) const {
  const size_t bb = block_bytes(keys ? view.k_codec : view.v_codec, view.head_dim);
  auto* base = static_cast<uint8_t*>(keys ? view.k : view.v);
  for (int32_t h = 0; h < view.n_kv_heads; ++h) {
    // Slots p % capacity: at most two runs of consecutive slots when the positions wrap around a ring.
    for (int64_t p = first; p < end;) {
      const int64_t slot = p % view.capacity;
      const int64_t run = std::min(end - p, view.capacity - slot);
      uint8_t* device = base + (h * view.capacity + slot) * bb;
      uint8_t* mine = host + (h * (end - first) + (p - first)) * bb;
      if (to_host) backend_.read_bytes(device, mine, size_t(run) * bb);
      else backend_.write_bytes(device, mine, size_t(run) * bb);
      p += run;
    }
  }
}

void KvCache::save(std::ostream& out, int32_t n_past) const {
  binary::write(out, uint32_t(layers_.size()));
  for (size_t il = 0; il < layers_.size(); ++il) {
    const KvLayerView& v = views_[il];
    binary::write(out, uint8_t(layers_[il].owns_kv));
    if (!layers_[il].owns_kv) continue;
    binary::write_string(out, std::string(kv_codec_info(v.k_codec).name));
    binary::write_string(out, std::string(kv_codec_info(v.v_codec).name));
    binary::write(out, v.head_dim);
    binary::write(out, v.n_kv_heads);
    const int64_t first = std::max<int64_t>(0, n_past - v.capacity);
    binary::write(out, first);
    binary::write(out, uint8_t(balanced_[il]));
    binary::write(out, uint8_t(v.k_center != nullptr));
    if (v.k_center) {
      std::vector<float> center(size_t(v.n_kv_heads) * v.head_dim);
      backend_.read(v.k_center, center.data(), center.size());
      binary::write_bytes(out, center.data(), center.size() * sizeof(float));
    }
    for (bool keys : {true, false}) {
      std::vector<uint8_t> blocks(size_t(v.n_kv_heads) * size_t(n_past - first) *
                                  block_bytes(keys ? v.k_codec : v.v_codec, v.head_dim));
      copy_positions(v, keys, first, n_past, blocks.data(), true);
      binary::write_bytes(out, blocks.data(), blocks.size());
    }
    save_protected(out, v, n_past);
  }
}

void KvCache::copy_protected(const KvLayerView& view, bool keys, bool sinks, int64_t first, int64_t end,
                             uint8_t* host, bool to_host) const {
  const size_t bb = block_bytes(view.protected_codec, view.head_dim);
  auto* base = static_cast<uint8_t*>(keys ? view.protected_k : view.protected_v);
  for (int32_t h = 0; h < view.n_kv_heads; ++h)
    for (int64_t p = first; p < end; ++p) {
      uint8_t* device = base + (h * view.protected_slots() + (sinks ? p : view.window_slot(p))) * bb;
      uint8_t* mine = host + (h * (end - first) + (p - first)) * bb;
      if (to_host) backend_.read_bytes(device, mine, bb);
      else backend_.write_bytes(device, mine, bb);
    }
}

// The protected blocks of a layer: its sinks and, of its window ring, the positions it holds.
void KvCache::save_protected(std::ostream& out, const KvLayerView& v, int32_t n_past) const {
  binary::write(out, uint8_t(v.protects()));
  if (!v.protects()) return;
  binary::write_string(out, std::string(kv_codec_info(v.protected_codec).name));
  binary::write(out, v.sinks);
  binary::write(out, v.window);
  const int64_t first = std::max<int64_t>(0, n_past - v.window_capacity);
  binary::write(out, first);
  const size_t bb = block_bytes(v.protected_codec, v.head_dim);
  const int64_t sinks = std::min<int64_t>(v.sinks, n_past);
  for (bool keys : {true, false}) {
    std::vector<uint8_t> blocks(size_t(v.n_kv_heads) * size_t(sinks + n_past - first) * bb);
    copy_protected(v, keys, true, 0, sinks, blocks.data(), true);
    copy_protected(v, keys, false, first, n_past, blocks.data() + size_t(v.n_kv_heads) * sinks * bb, true);
    binary::write_bytes(out, blocks.data(), blocks.size());
  }
}

void KvCache::restore_protected(std::istream& in, const KvLayerView& v, int32_t n_past, const std::string& layer) {
  const bool saved = binary::read<uint8_t>(in, "a layer's protected positions") != 0;
  if (saved != v.protects())
    throw Error(layer + ": saved with protected positions " + (saved ? "on" : "off") + ", this cache has them " +
                (v.protects() ? "on" : "off"));
  if (!saved) return;
  const std::string codec = binary::read_string(in, "a codec name");
  const auto sinks = binary::read<int32_t>(in, "the protected sinks");
  const auto window = binary::read<int32_t>(in, "the protected window");
  if (codec != kv_codec_info(v.protected_codec).name || sinks != v.sinks || window != v.window)
    throw Error(layer + ": saved with " + std::to_string(sinks) + " sinks and a window of " + std::to_string(window) +
                " in " + codec + ", this cache keeps " + std::to_string(v.sinks) + " and " +
                std::to_string(v.window) + " in " + std::string(kv_codec_info(v.protected_codec).name));
  const auto first = binary::read<int64_t>(in, "the window's first position");
  if (first < 0 || first > n_past) throw Error(layer + ": first saved window position " + std::to_string(first) +
                                               " is outside the " + std::to_string(n_past) + " saved tokens");
  const size_t bb = block_bytes(v.protected_codec, v.head_dim);
  const int64_t n_sinks = std::min<int64_t>(v.sinks, n_past), held = n_past - first;
  // A ring smaller than the saved one keeps the last positions.
  const int64_t kept = std::max<int64_t>(first, n_past - v.window_capacity);
  for (bool keys : {true, false}) {
    std::vector<uint8_t> blocks(size_t(v.n_kv_heads) * size_t(n_sinks + held) * bb);
    binary::read_bytes(in, blocks.data(), blocks.size(), "protected KV blocks");
    copy_protected(v, keys, true, 0, n_sinks, blocks.data(), false);
    uint8_t* window = blocks.data() + size_t(v.n_kv_heads) * n_sinks * bb;
    std::vector<uint8_t> ring(size_t(v.n_kv_heads) * size_t(n_past - kept) * bb);
    for (int32_t h = 0; h < v.n_kv_heads; ++h)
      std::copy_n(window + (h * held + (kept - first)) * bb, size_t(n_past - kept) * bb,
                  ring.data() + h * (n_past - kept) * bb);
    copy_protected(v, keys, false, kept, n_past, ring.data(), false);
  }
  window_restored_from_ = std::max(window_restored_from_, kept);
}

void KvCache::restore(std::istream& in, int32_t n_past) {
  reset();
  const auto n_layers = binary::read<uint32_t>(in, "the layer count");
  if (n_layers != layers_.size())
    throw Error("saved for " + std::to_string(n_layers) + " layers, this model has " + std::to_string(layers_.size()));
  for (size_t il = 0; il < layers_.size(); ++il) {
    const KvLayerView& v = views_[il];
    const std::string layer = "layer " + std::to_string(il);
    if (binary::read<uint8_t>(in, "a layer's header") != uint8_t(layers_[il].owns_kv))
      throw Error(layer + ": saved and current models differ in which layers share KV");
    if (!layers_[il].owns_kv) continue;
    const std::string k_name = binary::read_string(in, "a codec name");
    const std::string v_name = binary::read_string(in, "a codec name");
    if (k_name != kv_codec_info(v.k_codec).name || v_name != kv_codec_info(v.v_codec).name)
      throw Error(layer + ": saved with KV codecs " + k_name + "/" + v_name + ", this cache uses " +
                  std::string(kv_codec_info(v.k_codec).name) + "/" + std::string(kv_codec_info(v.v_codec).name));
    const auto head_dim = binary::read<int32_t>(in, "a head dim");
    const auto n_kv_heads = binary::read<int32_t>(in, "a KV head count");
    if (head_dim != v.head_dim || n_kv_heads != v.n_kv_heads)
      throw Error(layer + ": saved with " + std::to_string(n_kv_heads) + " KV heads of " + std::to_string(head_dim) +
                  ", this model has " + std::to_string(v.n_kv_heads) + " of " + std::to_string(v.head_dim));
    const auto first = binary::read<int64_t>(in, "a layer's first position");
    if (first < 0 || first > n_past) throw Error(layer + ": first saved position " + std::to_string(first) +
                                                 " is outside the " + std::to_string(n_past) + " saved tokens");
    const bool balanced = binary::read<uint8_t>(in, "a layer's key balancing") != 0;
    if (balanced != balanced_[il])
      throw Error(layer + ": saved with key balancing " + (balanced ? "on" : "off") + ", this cache has it " +
                  (balanced_[il] ? "on" : "off"));
    const bool centered = binary::read<uint8_t>(in, "a layer's key centering") != 0;
    if (centered != (v.k_center != nullptr))
      throw Error(layer + ": saved with key centering " + (centered ? "on" : "off") + ", this cache has it " +
                  (v.k_center ? "on" : "off"));
    if (centered) {
      std::vector<float> center(size_t(v.n_kv_heads) * v.head_dim);
      binary::read_bytes(in, center.data(), center.size() * sizeof(float), "a key center");
      backend_.write(v.k_center, center.data(), center.size());
    }
    // A ring smaller than the saved one keeps the last positions of each head's saved run.
    const int64_t kept = std::max<int64_t>(first, n_past - v.capacity);
    for (bool keys : {true, false}) {
      const size_t bb = block_bytes(keys ? v.k_codec : v.v_codec, v.head_dim);
      std::vector<uint8_t> saved(size_t(v.n_kv_heads) * size_t(n_past - first) * bb);
      binary::read_bytes(in, saved.data(), saved.size(), "KV blocks");
      std::vector<uint8_t> blocks(size_t(v.n_kv_heads) * size_t(n_past - kept) * bb);
      for (int32_t h = 0; h < v.n_kv_heads; ++h)
        std::copy_n(saved.data() + (h * (n_past - first) + (kept - first)) * bb, size_t(n_past - kept) * bb,
                    blocks.data() + h * (n_past - kept) * bb);
      copy_positions(v, keys, kept, n_past, blocks.data(), false);
    }
    if (layers_[il].sliding) restored_from_ = std::max(restored_from_, kept);
    restore_protected(in, v, n_past, layer);
  }
  end_ = n_past;
}

}  // namespace sparrow
