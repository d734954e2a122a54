#pragma once
// The KV cache of one sequence: per layer, the codec of K and of V (formats/kv/), rings of the window size
// for sliding-window layers (memory follows the window, not the context), and nothing at all for layers that
// read another layer's cache (Gemma 4's KV-shared layers). It knows layer shapes, not models: the runtime
// describes each layer with a KvLayerShape.
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "ops/backend.h"

namespace sparrow {

// What the cache needs to know of one layer.
struct KvLayerShape {
  bool sliding = false;    // sliding-window attention: a ring of window + batch slots
  int32_t head_dim = 0;    // 64, 128, 256 or 512
  int32_t n_kv_heads = 0;
  bool owns_kv = true;     // false: reads the cache of layer kv_source and stores nothing
  int32_t kv_source = 0;   // the layer whose cache this layer reads (itself when owns_kv)
};

// Layers that store K and V with these codecs: first..last (inclusive), or every layer of one kind.
struct KvLayerOverride {
  enum class Kind : int8_t { Range, Sliding, Global };
  Kind kind = Kind::Range;
  int32_t first = 0, last = 0;  // for Range
  formats::KvCodec k_codec = formats::KvCodec::F16, v_codec = formats::KvCodec::F16;

  // Whether the override sets layer il of shape l (a layer that owns KV).
  bool selects(int32_t il, const KvLayerShape& l) const {
    if (kind == Kind::Range) return il >= first && il <= last;
    return l.sliding == (kind == Kind::Sliding);
  }
};

// Key centering (KvLayerView::k_center) per layer: Auto centers the keys of layers whose K codec is one of
// Sparrow's low-bit codecs and leaves llama.cpp's stock codecs (f32, f16, bf16, q8_0, q4_0) exactly as llama.cpp
// stores them.
enum class KeyCentering : int8_t { Auto, On, Off };
// A sequence whose first batch has fewer keys than this is not centered (its center stays zero): the mean of
// a handful of keys is no estimate of the sequence's common component.
constexpr int64_t kKeyCenterMinTokens = 8;

// Key balancing per layer: keys are stored scaled per RoPE pair, and queries divided by the same scale, so that
// every score is unchanged while the codec's error (about the same in every direction of a rotated codec) lands
// less where queries look. The model chooses the scales from its norm gains and applies both through them
// (model/key_balance.h); the cache only says, per layer, whether its keys are balanced. Auto balances the keys
// of Sparrow's low-bit K codecs, as KeyCentering::Auto centers them.
enum class KeyBalancing : int8_t { Auto, On, Off };

struct KvCacheOptions {
  int32_t n_ctx = 4096;   // positions the cache must hold
  int32_t n_batch = 512;  // most tokens written by one forward pass (sizes the sliding rings)
  int32_t sliding_window = 0;
  formats::KvCodec k_codec = formats::KvCodec::F16;
  formats::KvCodec v_codec = formats::KvCodec::F16;
  std::vector<KvLayerOverride> layers;  // applied in order over k_codec/v_codec: later entries win
  KeyCentering center_keys = KeyCentering::Auto;
  KeyBalancing balance_keys = KeyBalancing::Auto;
  std::string chosen_by;  // how the codecs were chosen (--kv-bits), shown first by KvCache::summary; "" if given
  // Protected positions (KvLayerView::protects; off when both are 0): the first protected_sinks positions and
  // each query's protected_window most recent ones, kept in protected_codec beside the blocks of every layer
  // whose K or V codec has fewer bits than it.
  int32_t protected_sinks = 0;
  int32_t protected_window = 0;
  formats::KvCodec protected_codec = formats::KvCodec::F16;
};

// Average bits per cached element (K and V of every layer that owns KV, per token) of these options on these
// layers, the protected positions' blocks counted over the context (options.n_ctx). Throws sparrow::Error for
// overrides the layers cannot take.
double kv_bits_per_element(const std::vector<KvLayerShape>& layers, const KvCacheOptions& options);

class KvCache {
 public:
  // Throws sparrow::Error, before allocating anything, for an unusable codec or override, an unsupported head
  // dim, or a cache larger than the backend's memory.
  KvCache(Backend& backend, std::vector<KvLayerShape> layers, const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // The cache a layer reads (its own, or its source layer's).
  const KvLayerView& layer(int32_t il) const { return views_[layers_[il].kv_source]; }
  // Whether the keys layer il reads are balanced (KeyBalancing): then its keys must be stored, and its queries
  // formed, with the balanced norm gains.
  bool balanced_keys(int32_t il) const { return balanced_[size_t(layers_[il].kv_source)]; }
  // Writes K and V rows ([n_tokens][n_kv_heads][head_dim], backend memory) of layer il for positions
  // first_position... At the start of a sequence it first sets the layer's key center: the mean key of the
  // batch without position 0 (the attention sink, whose key is far from the rest), or zero for a short batch.
  void store(int32_t il, const float* k, const float* v, int64_t n_tokens, int32_t first_position);

  int32_t n_ctx() const { return options_.n_ctx; }
  size_t bytes() const { return bytes_; }
  // Bytes of K+V per token of context, summed over the layers of one kind (sliding or global) that own KV.
  size_t bytes_per_token(bool sliding) const;
  // Bytes of K and V a decode step at position n_past reads: every layer's visible positions (a sliding layer's
  // window), a KV-shared layer reading its source's cache again.
  size_t bytes_read_by_decode(int32_t n_past) const;
  // Lines for the user: per layer kind (sliding, global, shared) the codecs, bytes per token and in all.
  std::string summary() const;

  // Checks that the sequence can go back to n_past tokens (the positions after them are then rewritten): throws
  // sparrow::Error when a sliding-window ring no longer holds the window a token at n_past sees (a ring keeps
  // n_batch positions beyond the window, counted back from the furthest position stored).
  void check_truncate(int32_t n_past) const;
  // A new sequence: every position forgotten.
  void reset();

  // What a sequence of n_past tokens left in the cache, as bytes: per layer that owns KV its codecs, shape, key
  // center and the K and V blocks of the positions it still holds (a sliding ring's last slots).
  void save(std::ostream& out, int32_t n_past) const;
  // Puts what save() wrote back, into a cache of the same layers and codecs whose rings may differ in size (a
  // position this cache's ring cannot hold is one no later token sees; truncate() then goes back no further
  // than both rings allow). Throws sparrow::Error saying what differs
  // or that the bytes end early; the cache's contents are then undefined (the caller starts the sequence over).
  void restore(std::istream& in, int32_t n_past);

 private:
  void set_key_center(const KvLayerView& view, const float* k, int64_t n_tokens);
  // The oldest position that every sliding-window ring still holds.
  int64_t oldest_held() const;
  // The oldest position that every protected window ring still holds.
  int64_t oldest_in_windows() const;
  // Copies the blocks of positions [first, end) of one layer's K or V between the cache and a host buffer laid
  // out [head][position].
  void copy_positions(const KvLayerView& view, bool keys, int64_t first, int64_t end, uint8_t* host,
                      bool to_host) const;
  // The same for the protected blocks of positions [first, end): the sinks' own slots when `sinks`, else the
  // window ring's.
  void copy_protected(const KvLayerView& view, bool keys, bool sinks, int64_t first, int64_t end, uint8_t* host,
                      bool to_host) const;
  void save_protected(std::ostream& out, const KvLayerView& view, int32_t n_past) const;
  void restore_protected(std::istream& in, const KvLayerView& view, int32_t n_past, const std::string& layer);

  Backend& backend_;
  std::vector<KvLayerShape> layers_;
  KvCacheOptions options_;
  std::vector<KvLayerView> views_;  // indexed by layer; empty views for layers that do not own KV
  std::vector<bool> balanced_;      // indexed by layer: KeyBalancing's choice for the layers that own KV
  size_t bytes_ = 0;
  int64_t end_ = 0;            // one past the furthest position stored since the last reset
  int64_t restored_from_ = 0;  // the oldest position a restore() put into every ring (0: none restored)
  int64_t window_restored_from_ = 0;  // the same for the protected window rings
};

}  // namespace sparrow
