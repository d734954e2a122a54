#pragma once
// The Gemma 3 / Gemma 4 text decoder forward pass, written once against the Backend op interface.
// Read it beside docs/gemma.md: each step is one op.
#include <cstdint>

#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace sparrow {

class GemmaForward {
 public:
  // max_tokens: the most tokens one run() may take (sizes the scratch buffers). record_decode: one-token passes
  // ask the backend to record and replay them (Backend::begin_pass).
  GemmaForward(Backend& backend, const ModelConfig& config, const ModelWeights& weights, KvCache& cache,
               int32_t max_tokens, bool record_decode = true);
  ~GemmaForward();
  GemmaForward(const GemmaForward&) = delete;
  GemmaForward& operator=(const GemmaForward&) = delete;

  enum class Logits { None, Last, All };
  // Runs n tokens at positions first_position.. (their K/V enter the cache) and computes the logits of none
  // of them (prefill chunks that only fill the cache), the last, or all. They are copied to host_logits
  // (n_vocab floats per row) when it is not null; All needs it. The last row computed stays in backend
  // memory (last_logits()) until the next run, so a GPU can sample without copying the vocabulary back.
  void run(const int32_t* tokens, int32_t n, int32_t first_position, Logits logits, float* host_logits);
  const float* last_logits() const { return logits_; }

 private:
  // One pass of run(), recorded by the backend when `record`; false when the recording failed and nothing ran.
  bool pass(const int32_t* tokens, int32_t n, int32_t first_position, Logits logits, float* host_logits,
            bool record);
  // The ops of one pass: embeddings, the layers, the logits asked for.
  void compute(const int32_t* tokens, int32_t n, int32_t first_position, Logits logits, float* host_logits);
  void per_layer_inputs(const int32_t* tokens, int32_t n);
  void layer(int32_t il, int32_t n, int32_t first_position);
  void attention(int32_t il, int32_t n, int32_t first_position);
  void feed_forward(int32_t il, int32_t n);
  void per_layer_embedding(int32_t il, int32_t n);
  void output(int32_t first_row, int32_t n_rows, float* host_logits);
  RopeParams rope_params(const LayerConfig& l) const;

  Backend& backend_;
  const ModelConfig& config_;
  const ModelWeights& weights_;
  KvCache& cache_;
  int32_t max_tokens_;
  bool record_decode_;
  // Scratch activations, [max_tokens][width].
  float* x_;        // residual stream, n_embd
  float* xn_;       // normed input of a block, n_embd
  float* block_;    // output of a block, n_embd
  float* q_;        // n_heads * head_dim
  float* k_;        // n_kv_heads * head_dim
  float* v_;
  float* attn_;     // n_heads * head_dim
  float* gate_;     // n_ff
  float* up_;
  float* ple_;      // Gemma 4 per-layer inputs, n_layer * P
  float* ple_tmp_;  // n_layer * P
  float* logits_;   // [kLogitRows][n_vocab]
  static constexpr int32_t kLogitRows = 16;
};

}  // namespace sparrow
