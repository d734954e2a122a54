// The C API: thin wrappers that turn sparrow::Error into a NULL or negative return and a last-error string.
#include "sparrow/sparrow.h"

#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "api/kv_options.h"
#include "runtime/backends.h"
#include "runtime/chat_format.h"
#include "runtime/model.h"
#include "runtime/multi_session.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "util/error.h"

struct sparrow_model {
  std::unique_ptr<sparrow::Model> model;
  std::string description;
  std::string placement;
  std::string key_transforms;  // empty without them
};
struct sparrow_context {
  const sparrow::Model* model = nullptr;
  std::unique_ptr<sparrow::Session> session;
  std::string kv_summary;
};
struct sparrow_sampler {
  sparrow::Sampler sampler;
};
struct sparrow_batch {
  std::unique_ptr<sparrow::MultiSession> sequences;
};

namespace {

thread_local std::string last_error;

// Runs body, turning an exception into on_error (on_cancel for a decode the abort callback stopped) and the
// last-error string: no C++ exception crosses the C API.
template <typename R, typename F>
R guarded(R on_error, R on_cancel, F&& body) {
  try {
    return body();
  } catch (const sparrow::Cancelled& e) {
    last_error = e.what();
    return on_cancel;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return on_error;
}

template <typename R, typename F>
R guarded(R on_error, F&& body) {
  return guarded(on_error, on_error, std::forward<F>(body));
}

// The host's abort callback as the engine asks it.
std::function<bool()> abort_check(sparrow_abort_fn fn, void* user) {
  if (!fn) return {};
  return [fn, user] { return fn(user) != 0; };
}

std::span<const int32_t> token_span(const sparrow_token* tokens, int32_t n_tokens) {
  if (n_tokens < 0 || (n_tokens > 0 && !tokens)) throw sparrow::Error("token ids: NULL or a negative count");
  return tokens ? std::span<const int32_t>(tokens, size_t(n_tokens)) : std::span<const int32_t>();
}

// A restored sequence's ids out to the caller: all of them or an error (capacity too small).
int32_t restored(const std::vector<int32_t>& ids, int32_t n_past, sparrow_token* out, int32_t capacity,
                 int32_t* n_out) {
  if (out && int64_t(ids.size()) > capacity)
    throw sparrow::Error("the state holds " + std::to_string(ids.size()) + " token ids, more than the capacity " +
                         std::to_string(capacity) + " given");
  if (out) std::copy(ids.begin(), ids.end(), out);
  if (n_out) *n_out = int32_t(ids.size());
  return n_past;
}

// Copies bytes out C-style: the length, or -(length needed) when capacity is too small.
int32_t copy_out(const std::string& s, char* out, int32_t capacity) {
  if (int64_t(s.size()) > capacity) return -int32_t(s.size());
  if (!s.empty()) std::memcpy(out, s.data(), s.size());
  return int32_t(s.size());
}

// What the context params ask of a session (or of each sequence of a batch).
sparrow::SessionOptions session_options(const sparrow_context_params& params) {
  sparrow::SessionOptions o;
  o.n_ctx = params.n_ctx;
  o.n_threads = params.n_threads;
  o.n_batch = params.n_batch;
  o.k_codec = sparrow::parse_kv_codec_choice(params.cache_type_k ? params.cache_type_k : "auto", "cache_type_k", false);
  o.v_codec = sparrow::parse_kv_codec_choice(params.cache_type_v ? params.cache_type_v : "auto", "cache_type_v", true);
  if (params.kv_layers) o.kv_layers = sparrow::parse_kv_layers(params.kv_layers);
  o.center_keys = params.kv_center_keys < 0    ? sparrow::KeyCentering::Auto
                  : params.kv_center_keys == 0 ? sparrow::KeyCentering::Off
                                               : sparrow::KeyCentering::On;
  o.balance_keys = params.kv_balance_keys < 0    ? sparrow::KeyBalancing::Auto
                   : params.kv_balance_keys == 0 ? sparrow::KeyBalancing::Off
                                                 : sparrow::KeyBalancing::On;
  o.record_decode = params.decode_graphs != 0;
  if (!(params.kv_bits >= 0)) throw sparrow::Error("kv_bits must be 0 (off) or a positive number of bits");
  o.kv_bits = params.kv_bits;
  o.protected_sinks = params.kv_sinks;
  o.protected_window = params.kv_window;
  if (params.kv_protected_type) {
    const auto codec = sparrow::formats::parse_kv_codec(params.kv_protected_type);
    if (!codec) throw sparrow::Error(std::string("kv_protected_type: unknown KV codec '") + params.kv_protected_type + "'");
    o.protected_codec = *codec;
  }
  return o;
}

}  // namespace

extern "C" {

const char* sparrow_last_error(void) { return last_error.c_str(); }
const char* sparrow_version(void) { return SPARROW_VERSION_STRING; }

sparrow_model_params sparrow_model_default_params(void) {
  sparrow_model_params p{};
  p.device = "cpu";
  p.n_gpu_layers = 0;
  p.progress = nullptr;
  p.progress_user = nullptr;
  p.key_transforms = nullptr;
  return p;
}

const char* sparrow_device_unavailable_reason(const char* device) {
  static thread_local std::string reason;
  const std::optional<sparrow::Device> d = sparrow::parse_device(device ? device : "");
  reason = d ? sparrow::device_unavailable_reason(*d)
             : "unknown device '" + std::string(device ? device : "") + "' (expected cpu or cuda)";
  return reason.empty() ? nullptr : reason.c_str();
}

sparrow_model* sparrow_model_load_with_params(const char* path, sparrow_model_params params) {
  return guarded<sparrow_model*>(nullptr, [&]() -> sparrow_model* {
    if (!path) throw sparrow::Error("model path is NULL");
    const std::string device_name = params.device ? params.device : "cpu";
    const std::optional<sparrow::Device> device = sparrow::parse_device(device_name);
    if (!device) throw sparrow::Error("unknown device '" + device_name + "' (expected cpu or cuda)");
    sparrow::ModelLoadOptions options;
    options.device = *device;
    options.n_gpu_layers = params.n_gpu_layers;
    options.progress = [&](float f) { if (params.progress) params.progress(f, params.progress_user); };
    options.key_transforms = params.key_transforms ? params.key_transforms : "auto";
    auto m = std::make_unique<sparrow_model>();
    m->model = sparrow::Model::load(path, options);
    m->description = m->model->describe();
    m->placement = m->model->store->describe();
    m->key_transforms = m->model->describe_key_transforms();
    return m.release();
  });
}

sparrow_model* sparrow_model_load(const char* path, sparrow_progress_fn progress, void* user) {
  sparrow_model_params params = sparrow_model_default_params();
  params.progress = progress;
  params.progress_user = user;
  return sparrow_model_load_with_params(path, params);
}

void sparrow_model_free(sparrow_model* model) { delete model; }
const char* sparrow_model_describe(const sparrow_model* model) { return model->description.c_str(); }
const char* sparrow_model_placement(const sparrow_model* model) { return model->placement.c_str(); }
const char* sparrow_model_key_transforms(const sparrow_model* model) {
  return model->key_transforms.empty() ? nullptr : model->key_transforms.c_str();
}
size_t sparrow_model_weight_bytes_per_token(const sparrow_model* model) {
  return model->model->weights.bytes_read_per_token();
}
int32_t sparrow_model_n_vocab(const sparrow_model* model) { return model->model->config.n_vocab; }
int32_t sparrow_model_n_ctx_train(const sparrow_model* model) { return model->model->config.n_ctx_train; }

int32_t sparrow_tokenize(const sparrow_model* model, const char* text, int32_t text_len, int add_bos,
                         int parse_special, sparrow_token* out, int32_t capacity) {
  return guarded<int32_t>(INT32_MIN, [&]() -> int32_t {
    std::string_view s(text, text_len < 0 ? std::strlen(text) : size_t(text_len));
    std::vector<int32_t> ids = model->model->tokenizer->encode(s, add_bos, parse_special);
    if (int64_t(ids.size()) > capacity) return -int32_t(ids.size());
    std::copy(ids.begin(), ids.end(), out);
    return int32_t(ids.size());
  });
}

int32_t sparrow_token_to_piece(const sparrow_model* model, sparrow_token token, int render_special, char* out,
                               int32_t capacity) {
  return guarded<int32_t>(INT32_MIN, [&]() -> int32_t {
    if (token < 0 || token >= model->model->tokenizer->n_vocab())
      throw sparrow::Error("token id " + std::to_string(token) + " is outside the vocabulary");
    return copy_out(model->model->tokenizer->token_to_piece(token, render_special), out, capacity);
  });
}

sparrow_token sparrow_token_bos(const sparrow_model* model) { return model->model->tokenizer->bos(); }
int sparrow_token_is_end_of_generation(const sparrow_model* model, sparrow_token token) {
  return model->model->tokenizer->is_end_of_generation(token) ? 1 : 0;
}

int32_t sparrow_chat_format(const sparrow_model* model, const char* const* roles, const char* const* contents,
                            int32_t n_messages, int add_generation_prompt, char* out, int32_t capacity) {
  return guarded<int32_t>(INT32_MIN, [&]() -> int32_t {
    std::vector<sparrow::ChatMessage> messages;
    for (int32_t i = 0; i < n_messages; ++i) messages.push_back({roles[i], contents[i]});
    const sparrow::Model& m = *model->model;
    auto family = sparrow::detect_chat_family(m.tokenizer->chat_template(), m.config.arch);
    return copy_out(sparrow::format_chat(family, messages, add_generation_prompt), out, capacity);
  });
}

sparrow_context_params sparrow_context_default_params(void) {
  sparrow_context_params p{};
  p.n_ctx = 0;
  p.n_threads = 0;
  p.n_batch = 512;
  p.cache_type_k = "auto";
  p.cache_type_v = "auto";
  p.kv_layers = nullptr;
  p.kv_center_keys = -1;
  p.kv_balance_keys = -1;
  p.kv_bits = 0;
  p.kv_sinks = 0;
  p.kv_window = 0;
  p.kv_protected_type = "f16";
  p.decode_graphs = 1;
  return p;
}

sparrow_context* sparrow_context_new(sparrow_model* model, sparrow_context_params params) {
  return guarded<sparrow_context*>(nullptr, [&]() -> sparrow_context* {
    auto ctx = std::make_unique<sparrow_context>();
    ctx->model = model->model.get();
    ctx->session = std::make_unique<sparrow::Session>(*model->model, session_options(params));
    ctx->kv_summary = ctx->session->cache().summary();
    return ctx.release();
  });
}

void sparrow_context_free(sparrow_context* ctx) { delete ctx; }
int32_t sparrow_context_n_ctx(const sparrow_context* ctx) { return ctx->session->n_ctx(); }
int32_t sparrow_context_n_past(const sparrow_context* ctx) { return ctx->session->n_past(); }
void sparrow_context_reset(sparrow_context* ctx) { ctx->session->reset(); }
size_t sparrow_context_kv_bytes(const sparrow_context* ctx) { return ctx->session->cache().bytes(); }
size_t sparrow_context_kv_bytes_read(const sparrow_context* ctx, int32_t n_past) {
  return ctx->session->cache().bytes_read_by_decode(n_past < 0 ? 0 : n_past);
}
const char* sparrow_context_kv_summary(const sparrow_context* ctx) { return ctx->kv_summary.c_str(); }
int sparrow_context_truncate(sparrow_context* ctx, int32_t n_past) {
  return guarded<int>(-1, [&] {
    ctx->session->truncate(n_past);
    return 0;
  });
}

int sparrow_decode(sparrow_context* ctx, const sparrow_token* tokens, int32_t n, int all_logits) {
  return guarded<int>(-1, SPARROW_CANCELLED, [&] {
    ctx->session->decode(tokens, n, all_logits != 0);
    return 0;
  });
}

int sparrow_synchronize(sparrow_context* ctx) {
  return guarded<int>(-1, [&] {
    ctx->session->synchronize();
    return 0;
  });
}

const float* sparrow_get_logits(const sparrow_context* ctx, int32_t i) {
  return guarded<const float*>(nullptr, [&] { return ctx->session->logits(i); });
}

void sparrow_context_set_abort(sparrow_context* ctx, sparrow_abort_fn fn, void* user) {
  ctx->session->set_abort(abort_check(fn, user));
}

int32_t sparrow_generate(sparrow_context* ctx, sparrow_sampler* sampler, int32_t max_tokens, sparrow_token_fn on_token,
                         void* user) {
  return guarded<int32_t>(-1, SPARROW_CANCELLED, [&]() -> int32_t {
    sparrow::Session& session = *ctx->session;
    const sparrow::Tokenizer& tokenizer = *ctx->model->tokenizer;
    int32_t handed = 0;
    while (max_tokens < 0 || handed < max_tokens) {
      const int32_t token = session.sample(sampler->sampler);
      if (tokenizer.is_end_of_generation(token)) break;
      ++handed;
      const std::string piece = tokenizer.token_to_piece(token, false);
      const bool stop = on_token && on_token(token, piece.data(), int32_t(piece.size()), user) != 0;
      if (session.n_past() >= session.n_ctx()) break;
      session.decode(&token, 1, false);
      if (stop) break;
    }
    return handed;
  });
}

int sparrow_context_save(const sparrow_context* ctx, const char* path, const sparrow_token* tokens, int32_t n_tokens) {
  return guarded<int>(-1, [&] {
    if (!path) throw sparrow::Error("state path is NULL");
    ctx->session->save_state(path, token_span(tokens, n_tokens));
    return 0;
  });
}

int32_t sparrow_context_load(sparrow_context* ctx, const char* path, sparrow_token* tokens_out, int32_t capacity,
                             int32_t* n_tokens_out) {
  return guarded<int32_t>(-1, [&] {
    if (!path) throw sparrow::Error("state path is NULL");
    try {
      const std::vector<int32_t> ids = ctx->session->restore_state(path);
      return restored(ids, ctx->session->n_past(), tokens_out, capacity, n_tokens_out);
    } catch (...) {
      ctx->session->reset();
      throw;
    }
  });
}

sparrow_sampler_params sparrow_sampler_default_params(void) {
  sparrow::SamplerOptions o;
  return sparrow_sampler_params{o.temperature, o.top_k, o.top_p, o.min_p, o.seed};
}

sparrow_sampler* sparrow_sampler_new(sparrow_sampler_params p) {
  return new sparrow_sampler{sparrow::Sampler({p.temperature, p.top_k, p.top_p, p.min_p, p.seed})};
}
void sparrow_sampler_free(sparrow_sampler* sampler) { delete sampler; }
sparrow_token sparrow_sample(sparrow_sampler* sampler, const float* logits, int32_t n_vocab) {
  return sampler->sampler.sample(logits, n_vocab);
}

sparrow_token sparrow_sample_next(sparrow_context* ctx, sparrow_sampler* sampler) {
  return guarded<sparrow_token>(-1, [&] { return ctx->session->sample(sampler->sampler); });
}

sparrow_batch* sparrow_batch_new(sparrow_model* model, sparrow_context_params params, int32_t n_seq_max) {
  return guarded<sparrow_batch*>(nullptr, [&]() -> sparrow_batch* {
    auto batch = std::make_unique<sparrow_batch>();
    batch->sequences = std::make_unique<sparrow::MultiSession>(*model->model, session_options(params), n_seq_max);
    return batch.release();
  });
}

void sparrow_batch_free(sparrow_batch* batch) { delete batch; }

sparrow_seq sparrow_seq_open(sparrow_batch* batch) {
  return guarded<sparrow_seq>(-1, [&] { return batch->sequences->open(); });
}

int sparrow_seq_close(sparrow_batch* batch, sparrow_seq seq) {
  return guarded<int>(-1, [&] {
    batch->sequences->close(seq);
    return 0;
  });
}

size_t sparrow_batch_kv_bytes(const sparrow_batch* batch) { return batch->sequences->kv_bytes(); }
int32_t sparrow_batch_n_ctx(const sparrow_batch* batch) { return batch->sequences->n_ctx(); }

int32_t sparrow_seq_n_past(const sparrow_batch* batch, sparrow_seq seq) {
  return guarded<int32_t>(-1, [&] { return batch->sequences->n_past(seq); });
}

int sparrow_batch_decode(sparrow_batch* batch, const sparrow_seq_step* steps, int32_t n_steps) {
  return guarded<int>(-1, SPARROW_CANCELLED, [&] {
    if (n_steps < 0 || (n_steps > 0 && !steps)) throw sparrow::Error("batch decode: no steps");
    std::vector<sparrow::MultiSession::Step> work;
    for (int32_t i = 0; i < n_steps; ++i) {
      if (steps[i].n_tokens < 0 || (steps[i].n_tokens > 0 && !steps[i].tokens))
        throw sparrow::Error("batch decode: step " + std::to_string(i) + " has no tokens");
      work.push_back({steps[i].seq, std::span<const int32_t>(steps[i].tokens, size_t(steps[i].n_tokens))});
    }
    batch->sequences->decode(work);
    return 0;
  });
}

const float* sparrow_seq_logits(sparrow_batch* batch, sparrow_seq seq) {
  return guarded<const float*>(nullptr, [&] { return batch->sequences->logits(seq); });
}

int sparrow_seq_truncate(sparrow_batch* batch, sparrow_seq seq, int32_t n_past) {
  return guarded<int>(-1, [&] {
    batch->sequences->truncate(seq, n_past);
    return 0;
  });
}

void sparrow_batch_set_abort(sparrow_batch* batch, sparrow_abort_fn fn, void* user) {
  batch->sequences->set_abort(abort_check(fn, user));
}

int sparrow_seq_save(const sparrow_batch* batch, sparrow_seq seq, const char* path, const sparrow_token* tokens,
                     int32_t n_tokens) {
  return guarded<int>(-1, [&] {
    if (!path) throw sparrow::Error("state path is NULL");
    batch->sequences->save_state(seq, path, token_span(tokens, n_tokens));
    return 0;
  });
}

int32_t sparrow_seq_load(sparrow_batch* batch, sparrow_seq seq, const char* path, sparrow_token* tokens_out,
                         int32_t capacity, int32_t* n_tokens_out) {
  return guarded<int32_t>(-1, [&] {
    if (!path) throw sparrow::Error("state path is NULL");
    try {
      const std::vector<int32_t> ids = batch->sequences->restore_state(seq, path);
      return restored(ids, batch->sequences->n_past(seq), tokens_out, capacity, n_tokens_out);
    } catch (const sparrow::Error&) {
      if (batch->sequences->is_open(seq)) batch->sequences->reset(seq);
      throw;
    }
  });
}

sparrow_token sparrow_seq_sample(sparrow_batch* batch, sparrow_seq seq, sparrow_sampler* sampler) {
  return guarded<sparrow_token>(-1, [&] { return batch->sequences->sample(seq, sampler->sampler); });
}

sparrow_token sparrow_sample_greedy(const float* logits, int32_t n_vocab) {
  return sparrow::Sampler::argmax(logits, n_vocab);
}

}  // extern "C"
