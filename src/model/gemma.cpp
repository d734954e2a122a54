#include "model/gemma.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace sparrow {

GemmaForward::GemmaForward(Backend& backend, const ModelConfig& config, const ModelWeights& weights,
                           int32_t max_tokens, int32_t max_sequences, bool record_decode)
    : backend_(backend),
      config_(config),
      weights_(weights),
      max_tokens_(max_tokens),
      logit_rows_(std::max(std::min(kLogitRows, max_tokens), max_sequences)),
      record_decode_(record_decode) {
  int64_t max_q = 0, max_kv = 0, max_ff = 0;
  for (const LayerConfig& l : config_.layers) {
    max_q = std::max<int64_t>(max_q, int64_t(l.head_dim) * config_.n_heads);
    max_kv = std::max<int64_t>(max_kv, int64_t(l.head_dim) * l.n_kv_heads);
    max_ff = std::max<int64_t>(max_ff, l.n_ff);
  }
  const int64_t n = max_tokens;
  const int64_t ple_width = int64_t(config_.n_layer) * config_.n_embd_per_layer;
  x_ = backend_.alloc(n * config_.n_embd);
  xn_ = backend_.alloc(n * config_.n_embd);
  block_ = backend_.alloc(n * config_.n_embd);
  q_ = backend_.alloc(n * max_q);
  k_ = backend_.alloc(n * max_kv);
  v_ = backend_.alloc(n * max_kv);
  attn_ = backend_.alloc(n * max_q);
  gate_ = backend_.alloc(n * max_ff);
  up_ = backend_.alloc(n * max_ff);
  ple_ = backend_.alloc(std::max<int64_t>(1, n * ple_width));
  ple_tmp_ = backend_.alloc(std::max<int64_t>(1, n * ple_width));
  logits_ = backend_.alloc(int64_t(logit_rows_) * config_.n_vocab);
}

GemmaForward::~GemmaForward() {
  for (float* p : {x_, xn_, block_, q_, k_, v_, attn_, gate_, up_, ple_, ple_tmp_, logits_}) backend_.free_buffer(p);
}

void GemmaForward::check(const int32_t* tokens, std::span<const SequenceRun> runs, float* host_logits) const {
  int64_t n = 0, kept = 0;
  for (const SequenceRun& r : runs) {
    if (!r.cache) throw Error("forward: a sequence without a KV cache");
    if (r.n_tokens <= 0 || r.first_position < 0)
      throw Error("forward: a sequence's run of " + std::to_string(r.n_tokens) + " tokens at position " +
                  std::to_string(r.first_position));
    if (int64_t(r.first_position) + r.n_tokens > r.cache->n_ctx())
      throw Error("forward: context full (" + std::to_string(r.cache->n_ctx()) + " tokens)");
    if (r.logits == Logits::All && !host_logits) throw Error("forward: every row's logits need a host buffer");
    n += r.n_tokens;
    kept += r.logits == Logits::All ? r.n_tokens : r.logits == Logits::Last ? 1 : 0;
  }
  if (n <= 0 || n > max_tokens_)
    throw Error("forward: batch of " + std::to_string(n) + " tokens (max " + std::to_string(max_tokens_) + ")");
  if (!host_logits && kept > logit_rows_)
    throw Error("forward: " + std::to_string(kept) + " rows of logits need a host buffer (" +
                std::to_string(logit_rows_) + " stay on the backend)");
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= config_.n_vocab)
      throw Error("forward: token id " + std::to_string(tokens[t]) + " is outside the vocabulary");
}

void GemmaForward::run(const int32_t* tokens, std::span<const SequenceRun> runs, float* host_logits) {
  check(tokens, runs, host_logits);
  runs_.clear();
  int32_t n = 0;
  bool decode = true;  // one token per sequence
  for (const SequenceRun& r : runs) {
    runs_.push_back({r, n});
    n += r.n_tokens;
    decode = decode && r.n_tokens == 1;
  }
  // A decode step is recorded and replayed (one graph launch on a GPU); if the recording fails, nothing of it
  // ran, and the step runs again op by op.
  if (!pass(tokens, n, host_logits, record_decode_ && decode && !observer_)) pass(tokens, n, host_logits, false);
}

bool GemmaForward::pass(const int32_t* tokens, int32_t n, float* host_logits, bool record) {
  backend_.begin_pass(record);
  try {
    compute(tokens, n, host_logits);
  } catch (...) {
    backend_.cancel_pass();
    throw;
  }
  return backend_.end_pass();
}

void GemmaForward::compute(const int32_t* tokens, int32_t n, float* host_logits) {
  // h = token_embd[id] * sqrt(n_embd)
  backend_.embed(weights_.token_embd, tokens, n, std::sqrt(float(config_.n_embd)), x_);
  if (config_.n_embd_per_layer > 0) per_layer_inputs(tokens, n);
  for (int32_t il = 0; il < config_.n_layer; ++il) layer(il, n);
  std::vector<int32_t> kept;
  for (const Placed& p : runs_) {
    const int32_t last = p.first_token + p.run.n_tokens - 1;
    if (p.run.logits == Logits::All)
      for (int32_t t = p.first_token; t <= last; ++t) kept.push_back(t);
    else if (p.run.logits == Logits::Last) kept.push_back(last);
  }
  if (!kept.empty()) output(kept, host_logits);
}

// Gemma 4 PLE: pli = (per_layer_token_embd[id] * sqrt(P) + RMSNorm(W_proj e / sqrt(n_embd)) * norm) / sqrt(2),
// laid out [token][layer][P].
void GemmaForward::per_layer_inputs(const int32_t* tokens, int32_t n) {
  const int64_t P = config_.n_embd_per_layer;
  const int64_t width = int64_t(config_.n_layer) * P;
  backend_.embed(weights_.per_layer_token_embd, tokens, n, std::sqrt(float(P)), ple_);
  backend_.matmul(weights_.per_layer_model_proj, x_, n, ple_tmp_);
  backend_.scale(ple_tmp_, 1.0f / std::sqrt(float(config_.n_embd)), n * width);
  backend_.rms_norm(ple_tmp_, weights_.per_layer_proj_norm, n * config_.n_layer, P, config_.rms_eps, ple_tmp_);
  backend_.add(ple_, ple_tmp_, n * width);
  backend_.scale(ple_, 1.0f / std::sqrt(2.0f), n * width);
}

void GemmaForward::layer(int32_t il, int32_t n) {
  const LayerWeights& w = weights_.layers[il];
  // h += post_attention_norm(W_o attention(attn_norm(h))), with ffn_norm(h) for the feed-forward block; a layer
  // after the first finds attn_norm(h) in xn_, made by the last residual step of the layer before.
  if (il == 0) backend_.rms_norm(x_, w.attn_norm, n, config_.n_embd, config_.rms_eps, xn_);
  attention(il, n);
  backend_.matmul_residual(w.attn_output, attn_, n, block_, residual_step(w.post_attention_norm, w.ffn_norm));
  // h += post_ffw_norm(W_down GeGLU(ffn_norm(h)))
  feed_forward(il, n);
  if (config_.n_embd_per_layer > 0) {
    backend_.matmul_residual(w.ffn_down, gate_, n, block_, residual_step(w.post_ffw_norm));
    per_layer_embedding(il, n);
  } else {
    last_residual_step(il, n, w.ffn_down, w.post_ffw_norm);
  }
}

// h += RMSNorm(block) * post_norm, then next_norm(h) into xn_ when there is a next norm.
ResidualStep GemmaForward::residual_step(const float* post_norm, const float* next_norm) const {
  return {.x = x_,
          .r_weight = post_norm,
          .eps = config_.rms_eps,
          .next_weight = next_norm,
          .next = next_norm ? xn_ : nullptr};
}

// h = (h + RMSNorm(W gate_) * post_norm) * output_scale, the layer's last step, which also makes the next layer's
// attention input attn_norm(h).
void GemmaForward::last_residual_step(int32_t il, int32_t n, const WeightMatrix& w, const float* post_norm) {
  const bool last_layer = il + 1 == config_.n_layer;
  ResidualStep step = residual_step(post_norm, last_layer ? nullptr : weights_.layers[il + 1].attn_norm);
  step.x_scale = weights_.layers[il].output_scale;
  backend_.matmul_residual(w, gate_, n, block_, step);
}

RopeParams GemmaForward::rope_params(const LayerConfig& l) const {
  RopeParams p;
  p.n_rot = l.n_rot;
  p.freq_base = l.rope_base;
  p.freq_scale = l.rope_scale;
  p.freq_divisors = l.proportional_rope ? weights_.rope_freq_divisors : nullptr;
  return p;
}

void GemmaForward::attention(int32_t il, int32_t n) {
  const LayerConfig& l = config_.layers[il];
  const LayerWeights& w = weights_.layers[il];
  const int32_t d = l.head_dim;
  const int64_t q_width = int64_t(config_.n_heads) * d, kv_width = int64_t(l.n_kv_heads) * d;
  const RopeParams rope = rope_params(l);
  // q = RoPE(RMSNorm_head(Wq x) * q_norm); k = RoPE(RMSNorm_head(Wk x) * k_norm); v = Wv x (Gemma 4 k_eq_v: the
  // raw K projection), which Gemma 4 then normalizes per head without a weight.
  if (l.owns_kv) {
    const MatmulTarget qkv[] = {{w.attn_q, q_}, {w.attn_k, k_}, {w.attn_v, v_}};
    backend_.matmuls(xn_, n, std::span(qkv).first(w.attn_v.data ? 3 : 2));
    if (!w.attn_v.data) backend_.copy(v_, k_, int64_t(n) * kv_width);
  } else {
    backend_.matmul(w.attn_q, xn_, n, q_);
  }
  // Positions and KV are each sequence's own.
  for (const Placed& p : runs_) {
    const SequenceRun& r = p.run;
    float* q = q_ + p.first_token * q_width;
    float* k = k_ + p.first_token * kv_width;
    float* v = v_ + p.first_token * kv_width;
    // Keys the cache balances are stored scaled (model/key_balance.h) or, with calibrated transforms, transformed
    // (model/key_transform.h); either way the scores are unchanged.
    const bool balanced = r.cache->balanced_keys(il);
    const bool transformed = balanced && w.query_transform.data;
    const bool scaled = balanced && !transformed;
    const HeadTensor heads[] = {
        {.x = q, .weight = scaled ? w.attn_q_norm_balanced : w.attn_q_norm, .n_heads = config_.n_heads},
        {.x = k, .weight = scaled ? w.attn_k_norm_balanced : w.attn_k_norm, .n_heads = l.n_kv_heads},
        {.x = v, .weight = nullptr, .n_heads = l.n_kv_heads, .rotate = false}};
    const size_t n_heads = l.owns_kv ? (config_.normalize_v ? 3 : 2) : 1;
    backend_.rms_norm_rope(std::span(heads).first(n_heads), config_.rms_eps, r.n_tokens, d, r.first_position, rope);
    float* out = attn_ + p.first_token * q_width;  // free until attention writes it
    if (transformed) transform_queries_and_keys(w, l.n_kv_heads, q, l.owns_kv ? k : nullptr, r.n_tokens, out);
    if (observer_) observer_->observe(backend_, il, q, l.owns_kv ? k : nullptr, r.n_tokens, r.first_position);
    if (l.owns_kv) r.cache->store(il, k, v, r.n_tokens, r.first_position);
    AttentionArgs args;
    args.q = q;
    args.out = out;
    args.n_tokens = r.n_tokens;
    args.n_heads = config_.n_heads;
    args.first_position = r.first_position;
    args.sliding_window = l.sliding ? config_.sliding_window : 0;
    args.scale = config_.attention_scale;
    args.kv = r.cache->layer(il);
    backend_.attention(args);
  }
}

// q <- query_transform q per query head, k <- key_transform k per KV head (k null: a KV-shared layer), through
// `scratch` (n_tokens x n_heads x head_dim floats).
void GemmaForward::transform_queries_and_keys(const LayerWeights& w, int32_t n_kv_heads, float* q, float* k,
                                              int32_t n_tokens, float* scratch) {
  const int64_t d = w.query_transform.n_in;
  const int64_t q_rows = int64_t(n_tokens) * config_.n_heads, k_rows = int64_t(n_tokens) * n_kv_heads;
  backend_.matmul(w.query_transform, q, q_rows, scratch);
  backend_.copy(q, scratch, q_rows * d);
  if (!k) return;
  backend_.matmul(w.key_transform, k, k_rows, scratch);
  backend_.copy(k, scratch, k_rows * d);
}

// GeGLU's product before the down projection: gelu_tanh(Wgate x) * Wup x
void GemmaForward::feed_forward(int32_t il, int32_t n) {
  const LayerWeights& w = weights_.layers[il];
  backend_.gated_matmul(xn_, n, {.gate = w.ffn_gate, .up = &w.ffn_up, .up_y = up_}, gate_);
}

// Gemma 4: h += RMSNorm(W_proj (gelu_tanh(W_gate h) * pli[il])) * post_norm (then the layer output scale)
void GemmaForward::per_layer_embedding(int32_t il, int32_t n) {
  const LayerWeights& w = weights_.layers[il];
  const int64_t P = config_.n_embd_per_layer;
  const GatedProduct gate{.gate = w.ple_inp_gate, .mul = ple_ + il * P, .mul_stride = int64_t(config_.n_layer) * P};
  backend_.gated_matmul(x_, n, gate, gate_);
  last_residual_step(il, n, w.ple_proj, w.ple_post_norm);
}

// logits = softcap(token_embd · output_norm(h)) for the kept rows, logit_rows_ at a time, so that the
// vocabulary-sized buffer stays small while the output matrix is still read once per chunk, not once per row.
// Rows that are not consecutive in the batch (the last token of each sequence) are gathered first. Without host
// logits every kept row fits one chunk (check()), and they stay in logits_ for sampling.
void GemmaForward::output(const std::vector<int32_t>& rows, float* host_logits) {
  const int64_t n_embd = config_.n_embd;
  for (size_t r = 0; r < rows.size(); r += size_t(logit_rows_)) {
    const int32_t chunk = int32_t(std::min(rows.size() - r, size_t(logit_rows_)));
    const bool consecutive = rows[r + chunk - 1] - rows[r] == chunk - 1;
    const float* h = x_ + rows[r] * n_embd;
    if (!consecutive) {
      for (int32_t i = 0; i < chunk; ++i) backend_.copy(block_ + i * n_embd, x_ + rows[r + i] * n_embd, n_embd);
      h = block_;
    }
    backend_.rms_norm(h, weights_.output_norm, chunk, n_embd, config_.rms_eps, xn_);
    backend_.matmul(weights_.output, xn_, chunk, logits_);
    const int64_t n_out = int64_t(chunk) * config_.n_vocab;
    if (config_.final_softcap > 0) backend_.softcap(logits_, config_.final_softcap, n_out);
    if (host_logits) backend_.read(logits_, host_logits + int64_t(r) * config_.n_vocab, n_out);
  }
}

}  // namespace sparrow
