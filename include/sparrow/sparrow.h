/* Sparrow C API: load a Gemma GGUF, tokenize, run the model, sample. Every tool and server uses this.
 * Functions that can fail return NULL or a negative value; sparrow_last_error() then says why, in one line
 * naming the file and field where that applies. The message stays valid until the next call on the thread. */
#ifndef SPARROW_H
#define SPARROW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sparrow_model sparrow_model;
typedef struct sparrow_context sparrow_context;
typedef struct sparrow_sampler sparrow_sampler;
typedef int32_t sparrow_token;

/* What the int-returning calls that run the model return besides 0 and -1 (an error). */
enum { SPARROW_CANCELLED = -2 /* the abort callback stopped it (see sparrow_context_set_abort) */ };

const char* sparrow_last_error(void);
const char* sparrow_version(void);

/* ---- model ---- */
/* progress(fraction in [0,1], user) is called while weights are bound; may be NULL. */
typedef void (*sparrow_progress_fn)(float fraction, void* user);
typedef struct sparrow_model_params {
  const char* device;          /* "cpu" (default) or "cuda": where weights live and every context computes */
  int32_t n_gpu_layers;        /* layers whose weights go to device memory (llama.cpp's -ngl; 99: all). The
                                  other layers' weights stay in the file mapping, read by the device over the bus */
  sparrow_progress_fn progress;
  void* progress_user;
  const char* key_transforms;  /* calibrated key transforms (`sparrow calibrate-keys`, docs/kv-cache.md) that the
                                  low-bit K codecs store keys through: a file; NULL or "auto" (default) the file
                                  MODEL.key-transforms.gguf beside the model when there is one; "off" none. A file
                                  calibrated on another model is an error */
} sparrow_model_params;

sparrow_model_params sparrow_model_default_params(void);
/* NULL when this build and machine can run on `device` ("cpu", "cuda"); otherwise one line saying why (no GPU,
 * a build without CUDA, an unknown device). The string is static or thread-local. */
const char* sparrow_device_unavailable_reason(const char* device);
/* NULL on error: unreadable or invalid file, unknown device, or a device this build or machine cannot use. */
sparrow_model* sparrow_model_load_with_params(const char* path, sparrow_model_params params);
/* sparrow_model_load_with_params with the default params (CPU) and this progress callback. */
sparrow_model* sparrow_model_load(const char* path, sparrow_progress_fn progress, void* user);
void sparrow_model_free(sparrow_model* model);
/* One line: architecture, layers, embedding size, weight types, file size. */
const char* sparrow_model_describe(const sparrow_model* model);
/* One line: the device, its memory, and the bytes of weights placed on it. */
const char* sparrow_model_placement(const sparrow_model* model);
/* One line on the key transforms loaded (their file, layers, calibration text), or NULL without them. */
const char* sparrow_model_key_transforms(const sparrow_model* model);
/* Bytes of weights one decoded token reads (every matrix multiplied, one row of each table gathered). With
 * sparrow_context_kv_bytes_read, what a decode step must move: its time at the memory bandwidth is the floor. */
size_t sparrow_model_weight_bytes_per_token(const sparrow_model* model);
int32_t sparrow_model_n_vocab(const sparrow_model* model);
int32_t sparrow_model_n_ctx_train(const sparrow_model* model);

/* ---- tokens ---- */
/* Writes up to capacity ids; returns the count, -(count needed) if capacity is too small, or INT32_MIN on
 * error (see sparrow_last_error). */
int32_t sparrow_tokenize(const sparrow_model* model, const char* text, int32_t text_len, int add_bos,
                         int parse_special, sparrow_token* out, int32_t capacity);
/* Writes the token's bytes (not NUL-terminated); returns the length, -(length needed), or INT32_MIN. */
int32_t sparrow_token_to_piece(const sparrow_model* model, sparrow_token token, int render_special, char* out,
                               int32_t capacity);
sparrow_token sparrow_token_bos(const sparrow_model* model);
int sparrow_token_is_end_of_generation(const sparrow_model* model, sparrow_token token);

/* Formats a conversation with the model's chat template (Gemma 3 or Gemma 4 turn markers). roles are
 * "system", "user" or "assistant". Returns the length written, -(length needed), or INT32_MIN. */
int32_t sparrow_chat_format(const sparrow_model* model, const char* const* roles, const char* const* contents,
                            int32_t n_messages, int add_generation_prompt, char* out, int32_t capacity);

/* ---- context: one sequence, its KV cache and scratch ---- */
typedef struct sparrow_context_params {
  int32_t n_ctx;          /* tokens the KV cache holds; 0: min(model's training context, 4096) */
  int32_t n_threads;      /* 0: all cores */
  int32_t n_batch;        /* tokens per forward pass during prefill; 0: 512 */
  const char* cache_type_k; /* KV codec for K: "auto" (default, or NULL: per layer the pair docs/kernel-decisions.md
                               chose for the backend and head dim), f32, f16, bf16, q8_0, q4_0, tbq2/3/4, tbq3p/4p,
                               tcq2/3/4, qjl, polar4 (`sparrow verify` lists them) */
  const char* cache_type_v; /* KV codec for V: the same list except qjl (keys only) */
  const char* kv_layers;    /* per-layer overrides, e.g. "0-3:q8_0/tbq4,7:f16" (layers:K/V, or layers:C for both;
                               layers "sliding" or "global" for every layer of that kind); NULL or "": none */
  int32_t kv_center_keys;   /* -1 (default): center keys for Sparrow's low-bit K codecs, not for f32/f16/bf16/q8_0/
                               q4_0; 1: always; 0: never (docs/kv-cache.md) */
  int32_t decode_graphs;    /* 1 (default): on a GPU each decode step is recorded and replayed as one CUDA graph;
                               0: its kernels are launched one by one. No effect on the CPU. */
  float kv_bits;            /* > 0: the best measured KV configuration of at most this many bits per cached element
                               on this model, in place of cache_type_k/v and kv_layers (the KV summary says which);
                               0 (default): those fields */
  int32_t kv_balance_keys;  /* -1 (default): keys stored scaled per RoPE pair and queries divided alike (scores
                               unchanged, low-bit key error where queries look less) for Sparrow's low-bit K
                               codecs, not for f32/f16/bf16/q8_0/q4_0; 1: always; 0: never (docs/kv-cache.md) */
  int32_t kv_sinks;         /* protected positions (docs/kv-cache.md): the first kv_sinks positions and each token's */
  int32_t kv_window;        /* kv_window most recent ones kept in kv_protected_type beside every layer whose K or V
                               codec has fewer bits; 0 and 0 (default): off */
  const char* kv_protected_type; /* "f16" (default, or NULL) or any V codec, e.g. "q8_0" */
} sparrow_context_params;

sparrow_context_params sparrow_context_default_params(void);
sparrow_context* sparrow_context_new(sparrow_model* model, sparrow_context_params params);
void sparrow_context_free(sparrow_context* ctx);
int32_t sparrow_context_n_ctx(const sparrow_context* ctx);
int32_t sparrow_context_n_past(const sparrow_context* ctx);
/* Forgets every token: the next decode starts at position 0. */
void sparrow_context_reset(sparrow_context* ctx);
/* Bytes of KV cache this context holds, for all layers. */
size_t sparrow_context_kv_bytes(const sparrow_context* ctx);
/* Bytes of KV cache a decode step at position n_past reads (each layer's visible keys and values). */
size_t sparrow_context_kv_bytes_read(const sparrow_context* ctx, int32_t n_past);
/* Several lines: per layer kind (sliding, global, shared) the codecs, KV bytes per token and the total for the
 * context. Owned by ctx. */
const char* sparrow_context_kv_summary(const sparrow_context* ctx);
/* Forgets the tokens after the first n_past (going back at most n_batch tokens from the furthest position
 * decoded since the last reset, so sliding-window rings still hold what the next token sees). Returns 0, or -1. */
int sparrow_context_truncate(sparrow_context* ctx, int32_t n_past);

/* Appends n tokens at the current position and runs the model. With all_logits, logits for every one of the
 * n positions are kept; otherwise only for the last. Returns 0, or -1 (context full, bad token id, ...). */
int sparrow_decode(sparrow_context* ctx, const sparrow_token* tokens, int32_t n, int all_logits);
/* sparrow_decode may return once its work is queued on a GPU (reading logits or sampling waits for it): this
 * waits until that work has finished, as timing a decode needs. Immediate on the CPU. Returns 0, or -1. */
int sparrow_synchronize(sparrow_context* ctx);
/* Logits of position i of the last decode (i = -1: the last position); n_vocab floats, owned by ctx. */
const float* sparrow_get_logits(const sparrow_context* ctx, int32_t i);

/* Asked before every forward pass of a decode (each n_batch tokens of a prompt, each generated token), on the
 * decoding thread: a nonzero return stops the decode, which then returns SPARROW_CANCELLED; the passes before
 * it stay decoded (sparrow_context_n_past says how far it got). fn NULL: never stop. How a host cancels a long
 * prompt, e.g. when its client has gone. */
typedef int (*sparrow_abort_fn)(void* user);
void sparrow_context_set_abort(sparrow_context* ctx, sparrow_abort_fn fn, void* user);

/* Called with each generated token and its text (the bytes of sparrow_token_to_piece, not NUL-terminated; a
 * multi-byte character may be split across tokens). A nonzero return stops the generation after this token. */
typedef int (*sparrow_token_fn)(sparrow_token token, const char* piece, int32_t piece_len, void* user);
/* Generates after what the context holds (its last decode must have kept logits, e.g. the prompt's): samples a
 * token, hands it to on_token (may be NULL), decodes it, and repeats; it stops at an end-of-generation token (not
 * handed over, not decoded), after max_tokens (< 0: no limit), or when on_token returns nonzero. Every token
 * handed over is decoded into the context, except one sampled when the context is full, which ends the
 * generation. Returns the number of tokens handed over, -1 on error, or SPARROW_CANCELLED (the abort callback;
 * sparrow_context_n_past then says what the context holds). */
int32_t sparrow_generate(sparrow_context* ctx, sparrow_sampler* sampler, int32_t max_tokens, sparrow_token_fn on_token,
                         void* user);

/* ---- saving and restoring a sequence: continue it later without decoding its tokens again ---- */
/* Writes the context's KV cache and token count to a file (docs/state-files.md), with the ids of those tokens
 * when tokens is not NULL (n_tokens must then equal sparrow_context_n_past). The file appears whole or not at
 * all. Returns 0, or -1. */
int sparrow_context_save(const sparrow_context* ctx, const char* path, const sparrow_token* tokens, int32_t n_tokens);
/* Replaces the context's tokens by a saved state of the same model file with the same KV codecs (the context size
 * may differ if it holds the tokens). Writes the saved ids, if any, to tokens_out (up to capacity; may be NULL)
 * and their count to *n_tokens_out (may be NULL). No logits are saved: decode the next token before sampling.
 * Returns the restored n_past, or -1 with the context reset (not that model, other codecs, a corrupt file...). */
int32_t sparrow_context_load(sparrow_context* ctx, const char* path, sparrow_token* tokens_out, int32_t capacity,
                             int32_t* n_tokens_out);

/* ---- many sequences: one forward pass serves them all ---- */
/* A batch holds up to n_seq_max sequences of one model, each with its own KV cache of params.n_ctx tokens (the
 * other context params apply to each), and decodes steps of several sequences in shared forward passes: a
 * decode step of N sequences reads the weights once, not N times. What a server's parallel slots run on. */
typedef struct sparrow_batch sparrow_batch;
typedef int32_t sparrow_seq;
typedef struct sparrow_seq_step {
  sparrow_seq seq;              /* an open sequence; at most one step per sequence in a decode */
  const sparrow_token* tokens;  /* appended to it */
  int32_t n_tokens;             /* at least 1 */
} sparrow_seq_step;

/* NULL on error (bad params, n_seq_max outside 1..4096). */
sparrow_batch* sparrow_batch_new(sparrow_model* model, sparrow_context_params params, int32_t n_seq_max);
void sparrow_batch_free(sparrow_batch* batch);
/* A new, empty sequence with its KV cache allocated (ids of closed sequences are reused), or -1 (all n_seq_max
 * are open, or the cache does not fit). */
sparrow_seq sparrow_seq_open(sparrow_batch* batch);
/* Frees the sequence's KV cache. Returns 0, or -1 (not open). */
int sparrow_seq_close(sparrow_batch* batch, sparrow_seq seq);
/* Bytes of KV cache the open sequences hold. */
size_t sparrow_batch_kv_bytes(const sparrow_batch* batch);
/* Tokens each sequence's KV cache holds (params.n_ctx, or its default). */
int32_t sparrow_batch_n_ctx(const sparrow_batch* batch);
/* Tokens in the sequence's cache, or -1 (not open). */
int32_t sparrow_seq_n_past(const sparrow_batch* batch, sparrow_seq seq);
/* Appends each step's tokens to its sequence and keeps the logits of each step's last token. Returns 0, or -1
 * with no sequence changed when a step is invalid (not open, twice, no tokens, past the context, bad token). */
int sparrow_batch_decode(sparrow_batch* batch, const sparrow_seq_step* steps, int32_t n_steps);
/* The kept logits of the sequence's step in the last decode (n_vocab floats, owned by the batch), or NULL. */
const float* sparrow_seq_logits(sparrow_batch* batch, sparrow_seq seq);
/* Forgets the sequence's tokens after the first n_past, as sparrow_context_truncate. Returns 0, or -1. */
int sparrow_seq_truncate(sparrow_batch* batch, sparrow_seq seq, int32_t n_past);
/* As sparrow_context_set_abort, for the batch's decodes (sparrow_batch_decode returns SPARROW_CANCELLED). */
void sparrow_batch_set_abort(sparrow_batch* batch, sparrow_abort_fn fn, void* user);
/* As sparrow_context_save / sparrow_context_load, for one open sequence of the batch; a state saved from a
 * context loads into a sequence and the other way round when the model and codecs agree. */
int sparrow_seq_save(const sparrow_batch* batch, sparrow_seq seq, const char* path, const sparrow_token* tokens,
                     int32_t n_tokens);
int32_t sparrow_seq_load(sparrow_batch* batch, sparrow_seq seq, const char* path, sparrow_token* tokens_out,
                         int32_t capacity, int32_t* n_tokens_out);

/* ---- sampling ---- */
typedef struct sparrow_sampler_params {
  float temperature; /* <= 0: greedy */
  int32_t top_k;     /* <= 0: off */
  float top_p;       /* >= 1: off */
  float min_p;       /* <= 0: off */
  uint64_t seed;
} sparrow_sampler_params;

sparrow_sampler_params sparrow_sampler_default_params(void);
sparrow_sampler* sparrow_sampler_new(sparrow_sampler_params params);
void sparrow_sampler_free(sparrow_sampler* sampler);
sparrow_token sparrow_sample(sparrow_sampler* sampler, const float* logits, int32_t n_vocab);
/* The next token from the last position of the context's last decode, drawn with the sampler on the context's
 * device: on a GPU only the token id is copied back, not the logits. The same draw as sparrow_sample on those
 * logits. Returns the id, or -1 (nothing decoded yet). */
sparrow_token sparrow_sample_next(sparrow_context* ctx, sparrow_sampler* sampler);
/* The next token of the sequence from its kept logits, drawn on the batch's device; or -1. */
sparrow_token sparrow_seq_sample(sparrow_batch* batch, sparrow_seq seq, sparrow_sampler* sampler);
/* argmax, the lowest id on ties. */
sparrow_token sparrow_sample_greedy(const float* logits, int32_t n_vocab);

#ifdef __cplusplus
}
#endif
#endif /* SPARROW_H */
