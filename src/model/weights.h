#pragma once
// The model's tensors bound to named fields once at load, with their shapes checked against the config.
// Matrices stay in the file mapping (zero-copy); 1-D norm vectors are converted to float once.
#include <functional>
#include <vector>

#include "gguf/gguf.h"
#include "model/config.h"
#include "ops/backend.h"

namespace sparrow {

struct LayerWeights {
  std::vector<float> attn_norm, attn_q_norm, attn_k_norm, post_attention_norm, ffn_norm, post_ffw_norm;
  WeightMatrix attn_q, attn_k, attn_v, attn_output;  // attn_k/attn_v absent (data null) on KV-shared layers;
                                                     // attn_v absent on Gemma 4 k_eq_v layers (V = K projection)
  WeightMatrix ffn_gate, ffn_up, ffn_down;
  // Gemma 4 per-layer embeddings
  WeightMatrix ple_inp_gate, ple_proj;
  std::vector<float> ple_post_norm;
  float output_scale = 1.0f;  // Gemma 4 layer_output_scale
};

struct ModelWeights {
  WeightMatrix token_embd;  // {n_embd, n_vocab}
  WeightMatrix output;      // tied to token_embd when the file has no output.weight
  std::vector<float> output_norm;
  std::vector<float> rope_freq_divisors;  // Gemma 4 rope_freqs.weight (n_rot/2 of the global layers)
  // Gemma 4 per-layer embeddings (PLE)
  WeightMatrix per_layer_token_embd;  // {n_layer * P, n_vocab}
  WeightMatrix per_layer_model_proj;  // {n_embd, n_layer * P}
  std::vector<float> per_layer_proj_norm;
  std::vector<LayerWeights> layers;

  // progress(fraction) is called once per layer.
  static ModelWeights bind(const gguf::File& file, const ModelConfig& config,
                           const std::function<void(float)>& progress);
};

}  // namespace sparrow
