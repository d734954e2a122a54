#pragma once
// The Gemma 3 / Gemma 4 text decoder forward pass, written once against the Backend op interface.
// Read it beside docs/gemma.md: each step is one op.
#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace sparrow {

// Sees each layer's queries and keys after the norms and RoPE (and a key transform, where one applies), before
// the cache stores the keys: what `sparrow calibrate-keys` gathers (model/key_transform.h). The pointers are
// memory of `backend`, [n_tokens][heads][head_dim]; k is null on KV-shared layers.
class QueryKeyObserver {
 public:
  virtual ~QueryKeyObserver() = default;
  virtual void observe(Backend& backend, int32_t il, const float* q, const float* k, int32_t n_tokens,
                       int32_t first_position) = 0;
};

class GemmaForward {
 public:
  // max_tokens: the most tokens one pass may take (sizes the scratch buffers); max_sequences: the most sequences
  // whose last logits one pass keeps on the backend (sizes the logits buffer). record_decode: passes of one token
  // per sequence ask the backend to record and replay them (Backend::begin_pass).
  GemmaForward(Backend& backend, const ModelConfig& config, const ModelWeights& weights, int32_t max_tokens,
               int32_t max_sequences = 1, bool record_decode = true);
  ~GemmaForward();
  GemmaForward(const GemmaForward&) = delete;
  GemmaForward& operator=(const GemmaForward&) = delete;

  enum class Logits { None, Last, All };
  // One sequence's part of a pass: the next n_tokens tokens of the batch, at positions first_position.., their
  // K/V written to (and their attention reading) `cache`, and the logits kept of none, the last or all of them.
  struct SequenceRun {
    KvCache* cache = nullptr;
    int32_t first_position = 0;
    int32_t n_tokens = 0;
    Logits logits = Logits::Last;
  };

  // One forward pass over the tokens of several sequences: the matrix products and element-wise ops run once
  // over the whole batch (one read of the weights), rope, the KV writes and attention per sequence. The kept
  // logits, in run order, are copied to host_logits (n_vocab floats per row) when it is not null (Logits::All
  // needs it); otherwise they stay in backend memory (logits_row) until the next pass, so that a GPU can sample
  // without copying the vocabulary back.
  void run(const int32_t* tokens, std::span<const SequenceRun> runs, float* host_logits);
  // The single-sequence pass: n tokens at positions first_position.. of `cache`.
  void run(KvCache& cache, const int32_t* tokens, int32_t n, int32_t first_position, Logits logits,
           float* host_logits) {
    const SequenceRun r{&cache, first_position, n, logits};
    run(tokens, std::span<const SequenceRun>(&r, 1), host_logits);
  }
  // Every later pass shows its queries and keys to `observer` (null: none); it disables recorded decode steps.
  void observe(QueryKeyObserver* observer) { observer_ = observer; }
  // Kept row i of the last pass without host logits, in backend memory.
  const float* logits_row(int32_t i) const { return logits_ + int64_t(i) * config_.n_vocab; }

 private:
  // A run with where its tokens start in the batch.
  struct Placed {
    SequenceRun run;
    int32_t first_token;
  };
  void check(const int32_t* tokens, std::span<const SequenceRun> runs, float* host_logits) const;
  // One pass, recorded by the backend when `record`; false when the recording failed and nothing ran.
  bool pass(const int32_t* tokens, int32_t n, float* host_logits, bool record);
  // The ops of one pass: embeddings, the layers, the logits asked for.
  void compute(const int32_t* tokens, int32_t n, float* host_logits);
  void per_layer_inputs(const int32_t* tokens, int32_t n);
  void layer(int32_t il, int32_t n);
  void attention(int32_t il, int32_t n);
  void transform_queries_and_keys(const LayerWeights& w, int32_t n_kv_heads, float* q, float* k, int32_t n_tokens,
                                  float* scratch);
  void feed_forward(int32_t il, int32_t n);
  void per_layer_embedding(int32_t il, int32_t n);
  ResidualStep residual_step(const float* post_norm, const float* next_norm = nullptr) const;
  void last_residual_step(int32_t il, int32_t n, const WeightMatrix& w, const float* post_norm);
  // Logits of the kept rows (batch row indices), logit_rows_ at a time.
  void output(const std::vector<int32_t>& rows, float* host_logits);
  RopeParams rope_params(const LayerConfig& l) const;

  Backend& backend_;
  const ModelConfig& config_;
  const ModelWeights& weights_;
  int32_t max_tokens_;
  int32_t logit_rows_;  // rows of logits_
  bool record_decode_;
  QueryKeyObserver* observer_ = nullptr;
  std::vector<Placed> runs_;  // the current pass's runs
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
  float* logits_;   // [logit_rows_][n_vocab]
  static constexpr int32_t kLogitRows = 16;
};

}  // namespace sparrow
