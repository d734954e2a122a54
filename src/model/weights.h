#pragma once
// The model's tensors bound to named fields once at load, with their shapes checked against the config, and
// placed by the backend's WeightStore: on the CPU matrices stay in the file mapping (zero-copy); on a GPU they are
// uploaded once (or, for layers not offloaded, read from the mapping over the bus). 1-D norm vectors are
// converted to float once and placed the same way. Every pointer here is backend memory.
#include <functional>
#include <vector>

#include "gguf/gguf.h"
#include "model/config.h"
#include "ops/backend.h"

namespace sparrow {

struct LayerWeights {
  const float* attn_norm = nullptr;
  const float* attn_q_norm = nullptr;
  const float* attn_k_norm = nullptr;  // null on KV-shared layers
  // The same gains for balanced keys (model/key_balance.h): the query's divided by the balance of the layer whose
  // cache this layer reads, the key's multiplied by its own.
  const float* attn_q_norm_balanced = nullptr;
  const float* attn_k_norm_balanced = nullptr;  // null on KV-shared layers
  const float* post_attention_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* post_ffw_norm = nullptr;
  WeightMatrix attn_q, attn_k, attn_v, attn_output;  // attn_k/attn_v absent (data null) on KV-shared layers;
                                                     // attn_v absent on Gemma 4 k_eq_v layers (V = K projection)
  WeightMatrix ffn_gate, ffn_up, ffn_down;
  // Gemma 4 per-layer embeddings
  WeightMatrix ple_inp_gate, ple_proj;
  const float* ple_post_norm = nullptr;
  float output_scale = 1.0f;  // Gemma 4 layer_output_scale
  // Calibrated key transforms (model/key_transform.h), when the model was loaded with them: keys stored as
  // key_transform k (absent on KV-shared layers) and queries formed as query_transform q (the transform of the
  // layer whose cache this layer reads), both F32 head_dim x head_dim, in place of the balanced gains.
  WeightMatrix key_transform, query_transform;
};

struct ModelWeights {
  WeightMatrix token_embd;  // {n_embd, n_vocab}
  WeightMatrix output;      // tied to token_embd when the file has no output.weight
  const float* output_norm = nullptr;
  const float* rope_freq_divisors = nullptr;  // Gemma 4 rope_freqs.weight (n_rot/2 of the global layers), or null
  // Gemma 4 per-layer embeddings (PLE)
  WeightMatrix per_layer_token_embd;  // {n_layer * P, n_vocab}
  WeightMatrix per_layer_model_proj;  // {n_embd, n_layer * P}
  const float* per_layer_proj_norm = nullptr;
  std::vector<LayerWeights> layers;

  // Layers below n_gpu_layers go to device memory (where the store has one); the tensors outside the layers
  // (embeddings, output) too when n_gpu_layers exceeds the layer count, as with llama.cpp's -ngl.
  // progress(fraction) is called once per layer.
  // Bytes of weights one decoded token reads: every matrix it multiplies by and one row of each table it gathers
  // from (token_embd, per_layer_token_embd). At the memory bandwidth, the floor of a decode step's time (the norm
  // vectors, a few KiB, are left out).
  size_t bytes_read_per_token() const;

  static ModelWeights bind(const gguf::File& file, const ModelConfig& config, WeightStore& store,
                           int32_t n_gpu_layers, const std::function<void(float)>& progress);
  // Binds the key transforms of a key-transform file (model/key_transform.h; its fingerprint already checked
  // against the model): one pair for every layer that owns KV, placed on the device.
  void bind_key_transforms(const gguf::File& file, const ModelConfig& config, WeightStore& store);
};

}  // namespace sparrow
