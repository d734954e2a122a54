#include "model/gemma.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace sparrow {

GemmaForward::GemmaForward(Backend& backend, const ModelConfig& config, const ModelWeights& weights,
                           KvCache& cache, int32_t max_tokens, bool record_decode)
    : backend_(backend),
      config_(config),
      weights_(weights),
      cache_(cache),
      max_tokens_(max_tokens),
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
  logits_ = backend_.alloc(int64_t(std::min(kLogitRows, max_tokens)) * config_.n_vocab);
}

GemmaForward::~GemmaForward() {
  for (float* p : {x_, xn_, block_, q_, k_, v_, attn_, gate_, up_, ple_, ple_tmp_, logits_}) backend_.free_buffer(p);
}

void GemmaForward::run(const int32_t* tokens, int32_t n, int32_t first_position, Logits logits,
                       float* host_logits) {
  if (n <= 0 || n > max_tokens_) throw Error("forward: batch of " + std::to_string(n) + " tokens (max " +
                                             std::to_string(max_tokens_) + ")");
  if (first_position + n > cache_.n_ctx())
    throw Error("forward: context full (" + std::to_string(cache_.n_ctx()) + " tokens)");
  for (int32_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= config_.n_vocab)
      throw Error("forward: token id " + std::to_string(tokens[t]) + " is outside the vocabulary");
  if (logits == Logits::All && !host_logits) throw Error("forward: every row's logits need a host buffer");
  // A decode step is recorded and replayed (one graph launch on a GPU); if the recording fails, nothing of it
  // ran, and the step runs again op by op.
  const bool record = record_decode_ && n == 1;
  if (!pass(tokens, n, first_position, logits, host_logits, record))
    pass(tokens, n, first_position, logits, host_logits, false);
}

bool GemmaForward::pass(const int32_t* tokens, int32_t n, int32_t first_position, Logits logits,
                        float* host_logits, bool record) {
  backend_.begin_pass(record);
  try {
    compute(tokens, n, first_position, logits, host_logits);
  } catch (...) {
    backend_.cancel_pass();
    throw;
  }
  return backend_.end_pass();
}

void GemmaForward::compute(const int32_t* tokens, int32_t n, int32_t first_position, Logits logits,
                           float* host_logits) {
  // h = token_embd[id] * sqrt(n_embd)
  backend_.embed(weights_.token_embd, tokens, n, std::sqrt(float(config_.n_embd)), x_);
  if (config_.n_embd_per_layer > 0) per_layer_inputs(tokens, n);
  for (int32_t il = 0; il < config_.n_layer; ++il) layer(il, n, first_position);
  if (logits == Logits::All) output(0, n, host_logits);
  else if (logits == Logits::Last) output(n - 1, 1, host_logits);
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

void GemmaForward::layer(int32_t il, int32_t n, int32_t first_position) {
  const LayerWeights& w = weights_.layers[il];
  const int64_t rows = n;
  // h += post_attention_norm(attention(attn_norm(h)))
  backend_.rms_norm(x_, w.attn_norm, rows, config_.n_embd, config_.rms_eps, xn_);
  attention(il, n, first_position);
  backend_.rms_norm(block_, w.post_attention_norm, rows, config_.n_embd, config_.rms_eps, block_);
  backend_.add(x_, block_, rows * config_.n_embd);
  // h += post_ffw_norm(ffn(ffn_norm(h)))
  backend_.rms_norm(x_, w.ffn_norm, rows, config_.n_embd, config_.rms_eps, xn_);
  feed_forward(il, n);
  backend_.rms_norm(block_, w.post_ffw_norm, rows, config_.n_embd, config_.rms_eps, block_);
  backend_.add(x_, block_, rows * config_.n_embd);
  if (config_.n_embd_per_layer > 0) per_layer_embedding(il, n);
  if (w.output_scale != 1.0f) backend_.scale(x_, w.output_scale, rows * config_.n_embd);
}

RopeParams GemmaForward::rope_params(const LayerConfig& l) const {
  RopeParams p;
  p.n_rot = l.n_rot;
  p.freq_base = l.rope_base;
  p.freq_scale = l.rope_scale;
  p.freq_divisors = l.proportional_rope ? weights_.rope_freq_divisors : nullptr;
  return p;
}

void GemmaForward::attention(int32_t il, int32_t n, int32_t first_position) {
  const LayerConfig& l = config_.layers[il];
  const LayerWeights& w = weights_.layers[il];
  const int32_t d = l.head_dim;
  const RopeParams rope = rope_params(l);
  // q = RoPE(RMSNorm_head(Wq x) * q_norm)
  backend_.matmul(w.attn_q, xn_, n, q_);
  backend_.rms_norm(q_, w.attn_q_norm, int64_t(n) * config_.n_heads, d, config_.rms_eps, q_);
  backend_.rope(q_, n, config_.n_heads, d, first_position, rope);
  const KvLayerView& kv = cache_.layer(il);
  if (l.owns_kv) {
    // k = RoPE(RMSNorm_head(Wk x) * k_norm); v = Wv x (Gemma 4 k_eq_v: the raw K projection),
    // Gemma 4 then normalizes v per head without a weight.
    const int64_t kv_rows = int64_t(n) * l.n_kv_heads;
    backend_.matmul(w.attn_k, xn_, n, k_);
    if (w.attn_v.data) backend_.matmul(w.attn_v, xn_, n, v_);
    else backend_.copy(v_, k_, kv_rows * d);
    backend_.rms_norm(k_, w.attn_k_norm, kv_rows, d, config_.rms_eps, k_);
    backend_.rope(k_, n, l.n_kv_heads, d, first_position, rope);
    if (config_.normalize_v) backend_.rms_norm(v_, nullptr, kv_rows, d, config_.rms_eps, v_);
    cache_.store(il, k_, v_, n, first_position);
  }
  AttentionArgs args;
  args.q = q_;
  args.out = attn_;
  args.n_tokens = n;
  args.n_heads = config_.n_heads;
  args.first_position = first_position;
  args.sliding_window = l.sliding ? config_.sliding_window : 0;
  args.scale = config_.attention_scale;
  args.kv = kv;
  backend_.attention(args);
  backend_.matmul(w.attn_output, attn_, n, block_);
}

// GeGLU: Wdown (gelu_tanh(Wgate x) * Wup x)
void GemmaForward::feed_forward(int32_t il, int32_t n) {
  const LayerWeights& w = weights_.layers[il];
  const int64_t n_ff = config_.layers[il].n_ff;
  backend_.matmul(w.ffn_gate, xn_, n, gate_);
  backend_.matmul(w.ffn_up, xn_, n, up_);
  backend_.gelu_mul(gate_, up_, n * n_ff, gate_);
  backend_.matmul(w.ffn_down, gate_, n, block_);
}

// Gemma 4: h += RMSNorm(W_proj (gelu_tanh(W_gate h) * pli[il])) * post_norm
void GemmaForward::per_layer_embedding(int32_t il, int32_t n) {
  const LayerWeights& w = weights_.layers[il];
  const int64_t P = config_.n_embd_per_layer;
  backend_.matmul(w.ple_inp_gate, x_, n, gate_);
  backend_.gelu_mul(gate_, nullptr, n * P, gate_);
  backend_.mul_rows(gate_, ple_ + il * P, n, P, int64_t(config_.n_layer) * P);
  backend_.matmul(w.ple_proj, gate_, n, block_);
  backend_.rms_norm(block_, w.ple_post_norm, n, config_.n_embd, config_.rms_eps, block_);
  backend_.add(x_, block_, int64_t(n) * config_.n_embd);
}

// logits = softcap(token_embd · output_norm(h)), kLogitRows rows at a time so the vocabulary-sized buffer
// stays small while the output matrix is still read once per chunk, not once per row. The last chunk's last
// row is left at the start of logits_ only when it is the sole row (Logits::Last), which is what sampling reads.
void GemmaForward::output(int32_t first_row, int32_t n_rows, float* host_logits) {
  for (int32_t r = 0; r < n_rows; r += kLogitRows) {
    const int32_t chunk = std::min(kLogitRows, n_rows - r);
    const float* h = x_ + int64_t(first_row + r) * config_.n_embd;
    backend_.rms_norm(h, weights_.output_norm, chunk, config_.n_embd, config_.rms_eps, xn_);
    backend_.matmul(weights_.output, xn_, chunk, logits_);
    const int64_t n_out = int64_t(chunk) * config_.n_vocab;
    if (config_.final_softcap > 0) backend_.softcap(logits_, config_.final_softcap, n_out);
    if (host_logits) backend_.read(logits_, host_logits + int64_t(r) * config_.n_vocab, n_out);
  }
}

}  // namespace sparrow
