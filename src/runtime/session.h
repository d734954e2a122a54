#pragma once
// One sequence being run: its backend (on the model's device), KV cache, forward pass and the logits of the
// last decode.
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/gemma.h"
#include "ops/backend.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

namespace sparrow {

struct SessionOptions {
  int32_t n_ctx = 0;     // 0: min(training context, 4096)
  int32_t n_threads = 0;
  int32_t n_batch = 512;
  // Empty: auto, each layer's codec from the kernel decisions for the backend and head dim (runtime/kv_auto.h).
  std::optional<formats::KvCodec> k_codec, v_codec;
  std::vector<KvLayerOverride> kv_layers;
  double kv_bits = 0;  // > 0: the best measured KV configuration of at most this many bits per element
                       // (kv/kv_presets.h), in place of k_codec, v_codec and kv_layers
  KeyCentering center_keys = KeyCentering::Auto;
  KeyBalancing balance_keys = KeyBalancing::Auto;
  // Protected positions (kv/kv_cache.h): sinks and recent window kept in protected_codec; 0, 0: off.
  int32_t protected_sinks = 0;
  int32_t protected_window = 0;
  formats::KvCodec protected_codec = formats::KvCodec::F16;
  // Decode steps recorded and replayed by the backend (CUDA graphs on a GPU; Backend::begin_pass).
  bool record_decode = true;
  // The backend the session runs on; empty: the model's device's (runtime/backends.h). It must work with the
  // weights the model's store placed (`sparrow lockstep` pairs them).
  std::function<std::unique_ptr<Backend>()> make_backend;
  // Shown every layer's queries and keys (model/gemma.h; `sparrow calibrate-keys`); null: none.
  QueryKeyObserver* observer = nullptr;
};

// The context and batch sizes options ask for: n_ctx 0 means min(training context, 4096), n_batch 0 means 512,
// and n_batch is at most n_ctx. Throws for a context above 2^24 tokens.
struct SessionSizes {
  int32_t n_ctx = 0;
  int32_t n_batch = 0;
  static SessionSizes resolve(const ModelConfig& c, const SessionOptions& options);
};
// The backend a session runs on (options.make_backend, or the model's device's).
std::unique_ptr<Backend> make_session_backend(const Model& model, const SessionOptions& options);
// One sequence's KV cache with options' codecs (auto ones resolved for this backend), centering and per-layer
// overrides.
std::unique_ptr<KvCache> make_sequence_cache(Backend& backend, const ModelConfig& c, const SessionOptions& options,
                                             const SessionSizes& sizes);

class Session {
 public:
  Session(const Model& model, const SessionOptions& options);

  // Appends tokens (split into batches of n_batch) and keeps logits for the last or for all of them. The last
  // row alone stays in backend memory until logits() or a host-side sampler asks for it. Throws Cancelled when
  // the abort check says so before a batch; the batches before it stay decoded.
  void decode(const int32_t* tokens, int32_t n, bool all_logits);
  // Asked before every forward pass; true stops the decode. Empty: never.
  void set_abort(std::function<bool()> should_stop) { should_stop_ = std::move(should_stop); }
  const float* logits(int32_t i);  // i = -1: last kept row; host memory
  // The next token from the last decode's last row, drawn with `sampler` on the session's backend (on a GPU
  // only the id is copied back).
  int32_t sample(Sampler& sampler);
  void synchronize() { backend_->synchronize(); }  // the last decode's work has finished on the device
  int32_t n_logit_rows() const { return n_logit_rows_; }
  int32_t n_past() const { return n_past_; }
  int32_t n_ctx() const { return cache_->n_ctx(); }
  void reset() {
    n_past_ = 0;
    n_logit_rows_ = 0;
    cache_->reset();
  }
  // Forgets tokens after the first n_past; throws if the sliding-window rings no longer hold what the next
  // token would see (KvCache::check_truncate).
  void truncate(int32_t n_past);
  const KvCache& cache() const { return *cache_; }
  // The sequence's state to a file and back (runtime/sequence_state.h); tokens: empty or the n_past ids. After a
  // restore no logits are kept: decode the next token before sampling. A failed restore resets the session.
  void save_state(const std::string& path, std::span<const int32_t> tokens) const;
  std::vector<int32_t> restore_state(const std::string& path);

 private:
  const Model& model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<GemmaForward> forward_;
  int32_t n_batch_;
  int32_t n_past_ = 0;
  int32_t n_logit_rows_ = 0;
  bool host_logits_valid_ = false;  // logits_ holds the kept rows (else only the backend has the last one)
  std::vector<float> logits_;
  std::function<bool()> should_stop_;
};

}  // namespace sparrow
