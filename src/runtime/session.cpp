#include "runtime/session.h"

#include <algorithm>

#include "kv/kv_presets.h"
#include "runtime/kv_auto.h"
#include "runtime/sequence_state.h"
#include "util/error.h"

namespace sparrow {

SessionSizes SessionSizes::resolve(const ModelConfig& c, const SessionOptions& options) {
  SessionSizes sizes;
  sizes.n_ctx = options.n_ctx > 0 ? options.n_ctx : std::min(c.n_ctx_train, 4096);
  if (sizes.n_ctx > (1 << 24))
    throw Error("context size " + std::to_string(sizes.n_ctx) + " is too large (at most 16777216 tokens)");
  sizes.n_batch = std::clamp(options.n_batch > 0 ? options.n_batch : 512, 1, sizes.n_ctx);
  return sizes;
}

std::unique_ptr<Backend> make_session_backend(const Model& model, const SessionOptions& options) {
  return options.make_backend ? options.make_backend() : make_backend(model.device, options.n_threads);
}

std::unique_ptr<KvCache> make_sequence_cache(Backend& backend, const ModelConfig& c, const SessionOptions& options,
                                             const SessionSizes& sizes) {
  std::vector<KvLayerShape> shapes;
  for (const LayerConfig& l : c.layers)
    shapes.push_back({.sliding = l.sliding, .head_dim = l.head_dim, .n_kv_heads = l.n_kv_heads,
                      .owns_kv = l.owns_kv, .kv_source = l.kv_source});
  KvCacheOptions kv;
  kv.n_ctx = sizes.n_ctx;
  kv.n_batch = sizes.n_batch;
  kv.sliding_window = c.sliding_window;
  kv.k_codec = options.k_codec.value_or(formats::KvCodec::F16);
  kv.v_codec = options.v_codec.value_or(formats::KvCodec::F16);
  kv.layers = options.kv_layers;
  kv.center_keys = options.center_keys;
  kv.balance_keys = options.balance_keys;
  kv.protected_sinks = options.protected_sinks;
  kv.protected_window = options.protected_window;
  kv.protected_codec = options.protected_codec;
  apply_kv_auto(shapes, backend.name(), options.k_codec, options.v_codec, kv);
  if (options.kv_bits > 0) apply_kv_bits(shapes, options.kv_bits, kv);
  return std::make_unique<KvCache>(backend, std::move(shapes), kv);
}

Session::Session(const Model& model, const SessionOptions& options) : model_(model) {
  const SessionSizes sizes = SessionSizes::resolve(model.config, options);
  n_batch_ = sizes.n_batch;
  backend_ = make_session_backend(model, options);
  cache_ = make_sequence_cache(*backend_, model.config, options, sizes);
  forward_ = std::make_unique<GemmaForward>(*backend_, model.config, model.weights, n_batch_, 1,
                                            options.record_decode);
  forward_->observe(options.observer);
}

void Session::decode(const int32_t* tokens, int32_t n, bool all_logits) {
  if (n <= 0) throw Error("decode: no tokens");
  if (n_past_ + n > n_ctx())
    throw Error("decode: " + std::to_string(n) + " more tokens do not fit the context (" +
                std::to_string(n_past_) + " of " + std::to_string(n_ctx()) + " used)");
  using Logits = GemmaForward::Logits;
  const int64_t n_vocab = model_.config.n_vocab;
  n_logit_rows_ = 0;
  if (all_logits) logits_.resize(size_t(n) * n_vocab);
  for (int32_t done = 0; done < n; done += n_batch_) {
    if (should_stop_ && should_stop_()) throw Cancelled();
    const int32_t chunk = std::min(n_batch_, n - done);
    const bool last_chunk = done + chunk == n;
    // Chunks before the last only fill the KV cache unless every row's logits are wanted.
    if (all_logits) forward_->run(*cache_, tokens + done, chunk, n_past_, Logits::All, logits_.data() + done * n_vocab);
    else forward_->run(*cache_, tokens + done, chunk, n_past_, last_chunk ? Logits::Last : Logits::None, nullptr);
    n_past_ += chunk;
  }
  n_logit_rows_ = all_logits ? n : 1;
  host_logits_valid_ = all_logits;
}

int32_t Session::sample(Sampler& sampler) {
  if (n_logit_rows_ == 0) throw Error("sample: nothing decoded yet");
  if (host_logits_valid_) return sampler.sample(logits(-1), model_.config.n_vocab);
  return backend_->sample(forward_->logits_row(0), model_.config.n_vocab, sampler.params(), sampler.next_uniform());
}

void Session::truncate(int32_t n_past) {
  if (n_past < 0 || n_past > n_past_)
    throw Error("truncate: " + std::to_string(n_past) + " is not between 0 and the " + std::to_string(n_past_) +
                " tokens decoded");
  cache_->check_truncate(n_past);
  n_past_ = n_past;
  n_logit_rows_ = 0;
  host_logits_valid_ = false;
}

void Session::save_state(const std::string& path, std::span<const int32_t> tokens) const {
  save_sequence_state(path, model_, *cache_, n_past_, tokens);
}

std::vector<int32_t> Session::restore_state(const std::string& path) {
  reset();
  RestoredSequence r = restore_sequence_state(path, model_, *cache_);
  n_past_ = r.n_past;
  return std::move(r.tokens);
}

const float* Session::logits(int32_t i) {
  if (n_logit_rows_ == 0) throw Error("logits: nothing decoded yet");
  if (i < 0) i = n_logit_rows_ - 1;
  if (i >= n_logit_rows_) throw Error("logits: row " + std::to_string(i) + " was not kept");
  if (!host_logits_valid_) {
    logits_.resize(model_.config.n_vocab);
    backend_->read(forward_->logits_row(0), logits_.data(), logits_.size());
    host_logits_valid_ = true;
  }
  return logits_.data() + size_t(i) * model_.config.n_vocab;
}

}  // namespace sparrow
