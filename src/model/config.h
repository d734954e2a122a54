#pragma once
// Hyperparameters of a Gemma 3 / Gemma 4 text decoder, read from GGUF metadata and resolved per layer so the
// forward pass never branches on the architecture name. Summary of the architecture: docs/gemma.md.
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace sparrow {

enum class Architecture { Gemma3, Gemma4 };

struct LayerConfig {
  bool sliding = false;        // sliding-window attention layer
  int32_t head_dim = 0;        // K, Q and V head dimension
  int32_t n_kv_heads = 0;
  int32_t n_ff = 0;            // FFN hidden size
  bool owns_kv = true;         // false: a Gemma 4 KV-shared layer, no K/V projections of its own
  int32_t kv_source = 0;       // layer whose KV cache this layer reads (itself when owns_kv)
  int32_t n_rot = 0;           // dimensions RoPE rotates
  float rope_base = 10000.0f;
  float rope_scale = 1.0f;     // multiplies positions (1 / linear scaling factor)
  bool proportional_rope = false;  // Gemma 4 global layers: rope_freqs.weight frequency divisors
};

struct ModelConfig {
  Architecture arch = Architecture::Gemma3;
  std::string arch_name;
  int32_t n_layer = 0;
  int32_t n_embd = 0;
  int32_t n_heads = 0;
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;
  int32_t sliding_window = 0;
  int32_t n_embd_per_layer = 0;  // Gemma 4 per-layer embeddings (PLE) width, 0 if none
  float rms_eps = 1e-6f;
  float attention_scale = 1.0f;  // multiplies q.k
  float final_softcap = 0.0f;    // 0: none
  bool normalize_v = false;      // Gemma 4: V = RMSNorm(V) without weight
  std::vector<LayerConfig> layers;

  static ModelConfig from_gguf(const gguf::File& file);
};

}  // namespace sparrow
