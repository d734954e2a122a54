/* The C API's sequence state, generation callback and cancellation, from C as an embedder sees them: a saved
 * sequence restored into another context (or a batch's sequence) continues exactly as the original did, a bad
 * state file is refused with a message and leaves an empty context, generation hands over what step-by-step
 * sampling gives, and an abort callback stops a decode between forward passes.
 * Usage: sparrow_c_state_test MODEL.gguf SCRATCH_DIR (ctest makes a tiny model with a 16-token sliding window).
 * Exits 0 when every check passes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sparrow/sparrow.h"

enum { kPrompt = 40, kVocabUsed = 4000 };
static sparrow_model* model;
static int32_t n_vocab;
static sparrow_token prompt[kPrompt];
static char scratch[4096];

/* A file in the scratch folder, by value: no allocation to free. */
typedef struct {
  char s[4200];
} Path;

static Path path_in_scratch(const char* name) {
  Path p;
  snprintf(p.s, sizeof p.s, "%s/%s", scratch, name);
  return p;
}

/* A context with low-bit, centered keys and 8-token batches: the 40-token prompt wraps the sliding rings. */
static sparrow_context* new_context(int32_t n_ctx, int32_t n_batch, const char* k_codec) {
  sparrow_context_params params = sparrow_context_default_params();
  params.n_ctx = n_ctx;
  params.n_batch = n_batch;
  params.n_threads = 2;
  params.cache_type_k = k_codec;
  params.cache_type_v = "q8_0";
  sparrow_context* ctx = sparrow_context_new(model, params);
  CHECK(ctx != NULL, "%s", sparrow_last_error());
  return ctx;
}

static float* copy_logits(const float* logits) {
  float* out = malloc(sizeof(float) * (size_t)n_vocab);
  memcpy(out, logits, sizeof(float) * (size_t)n_vocab);
  return out;
}

/* The logits after `next`, decoded into ctx. */
static float* logits_after(sparrow_context* ctx, sparrow_token next) {
  CHECK(sparrow_decode(ctx, &next, 1, 0) == 0, "%s", sparrow_last_error());
  return copy_logits(sparrow_get_logits(ctx, -1));
}

static void copy_file(const char* from, const char* to, long n_bytes, long flip_at) {
  FILE* in = fopen(from, "rb");
  FILE* out = fopen(to, "wb");
  for (long i = 0; i < n_bytes; ++i) {
    int c = fgetc(in);
    if (c == EOF) break;
    fputc(i == flip_at ? c ^ 0x5A : c, out);
  }
  fclose(in);
  fclose(out);
}

static long file_size(const char* path) {
  FILE* f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fclose(f);
  return n;
}

/* A load that must fail: -1, a message naming `needle`, and an empty context afterwards. */
static void expect_refused(sparrow_context* ctx, const char* path, const char* needle) {
  CHECK(sparrow_context_load(ctx, path, NULL, 0, NULL) == -1, "loading %s must fail", path);
  CHECK(strstr(sparrow_last_error(), needle) != NULL, "message '%s' should name '%s'", sparrow_last_error(), needle);
  CHECK(sparrow_context_n_past(ctx) == 0, "a refused load leaves an empty context, not %d",
        sparrow_context_n_past(ctx));
}

static void test_state_round_trip(void) {
  const Path saved_path = path_in_scratch("prompt.state");
  const char* saved = saved_path.s;
  sparrow_context* original = new_context(64, 8, "tbq4");
  CHECK(sparrow_decode(original, prompt, kPrompt, 0) == 0, "%s", sparrow_last_error());
  CHECK(sparrow_context_save(original, saved, prompt, kPrompt - 1) == -1, "ids must cover every token");
  CHECK(sparrow_context_save(original, saved, prompt, kPrompt) == 0, "%s", sparrow_last_error());
  float* expected = logits_after(original, 17);

  /* The same settings: the restored cache holds the same bytes, so the next step is bit for bit the same. */
  sparrow_context* same = new_context(64, 8, "tbq4");
  sparrow_token ids[kPrompt];
  int32_t n_ids = -1;
  CHECK(sparrow_context_load(same, saved, ids, kPrompt, &n_ids) == kPrompt, "%s", sparrow_last_error());
  CHECK(n_ids == kPrompt && memcmp(ids, prompt, sizeof prompt) == 0, "the saved ids come back");
  CHECK(sparrow_context_n_past(same) == kPrompt, "n_past %d", sparrow_context_n_past(same));
  sparrow_sampler_params sp = sparrow_sampler_default_params();
  sp.temperature = 0;
  sparrow_sampler* greedy = sparrow_sampler_new(sp);
  CHECK(sparrow_sample_next(same, greedy) == -1, "no logits are restored: sampling first needs a decode");
  sparrow_sampler_free(greedy);
  float* restored = logits_after(same, 17);
  CHECK(memcmp(expected, restored, sizeof(float) * (size_t)n_vocab) == 0, "restored logits differ");
  free(restored);

  /* A larger context and smaller batches: other ring sizes, the same positions visible. Attention then sums the
   * window in another slot order; the new token's K and V, quantized to 4 and 8 bits, turn that rounding into a
   * few 1e-4 of the logits (as decoding the same tokens in contexts of these two ring sizes does). */
  sparrow_context* other = new_context(128, 4, "tbq4");
  CHECK(sparrow_context_load(other, saved, NULL, 0, NULL) == kPrompt, "%s", sparrow_last_error());
  restored = logits_after(other, 17);
  CHECK(sparrow_sample_greedy(expected, n_vocab) == sparrow_sample_greedy(restored, n_vocab), "greedy token");
  double diff = 0, scale = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    const double d = expected[i] > restored[i] ? expected[i] - restored[i] : restored[i] - expected[i];
    const double m = expected[i] > 0 ? expected[i] : -expected[i];
    if (d > diff) diff = d;
    if (m > scale) scale = m;
  }
  CHECK(diff <= 1e-3 * scale, "with other ring sizes the logits differ by %g of %g", diff, scale);
  free(restored);

  /* Into a batch's sequence: the same file, the same continuation. */
  sparrow_context_params params = sparrow_context_default_params();
  params.n_ctx = 64;
  params.n_batch = 8;
  params.n_threads = 2;
  params.cache_type_k = "tbq4";
  params.cache_type_v = "q8_0";
  sparrow_batch* batch = sparrow_batch_new(model, params, 2);
  const sparrow_seq seq = sparrow_seq_open(batch);
  CHECK(sparrow_seq_load(batch, seq, saved, ids, 3, NULL) == -1, "3 ids do not fit the capacity");
  CHECK(sparrow_seq_n_past(batch, seq) == 0, "a refused load leaves the sequence empty");
  CHECK(sparrow_seq_load(batch, seq, saved, NULL, 0, &n_ids) == kPrompt, "%s", sparrow_last_error());
  const sparrow_token next = 17;
  const sparrow_seq_step step = {seq, &next, 1};
  CHECK(sparrow_batch_decode(batch, &step, 1) == 0, "%s", sparrow_last_error());
  CHECK(memcmp(expected, sparrow_seq_logits(batch, seq), sizeof(float) * (size_t)n_vocab) == 0,
        "a batch sequence restored from the file continues as the context did");
  /* And back: a sequence's state loads into a context. */
  const Path from_seq_path = path_in_scratch("seq.state");
  const char* from_seq = from_seq_path.s;
  CHECK(sparrow_seq_save(batch, seq, from_seq, NULL, 0) == 0, "%s", sparrow_last_error());
  CHECK(sparrow_context_load(same, from_seq, NULL, 0, &n_ids) == kPrompt + 1 && n_ids == 0, "%s",
        sparrow_last_error());
  sparrow_batch_free(batch);

  /* Refusals. */
  sparrow_context* wrong_codec = new_context(64, 8, "q8_0");
  expect_refused(wrong_codec, saved, "tbq4");
  sparrow_context* too_small = new_context(32, 8, "tbq4");
  expect_refused(too_small, saved, "holds 40 tokens");
  expect_refused(same, path_in_scratch("missing.state").s, "cannot open");
  const Path cut_path = path_in_scratch("cut.state");
  const char* cut = cut_path.s;
  copy_file(saved, cut, file_size(saved) - 100, -1);
  expect_refused(same, cut, "file ends inside");
  const Path flipped_path = path_in_scratch("flipped.state");
  const char* flipped = flipped_path.s;
  copy_file(saved, flipped, file_size(saved), 0);
  expect_refused(same, flipped, "not a Sparrow sequence state file");
  copy_file(saved, flipped, file_size(saved), 12); /* inside the model fingerprint */
  expect_refused(same, flipped, "different model");
  CHECK(sparrow_context_save(same, path_in_scratch("no-such-dir/x.state").s, NULL, 0) == -1, "an unwritable path");

  free(expected);
  sparrow_context_free(original);
  sparrow_context_free(same);
  sparrow_context_free(other);
  sparrow_context_free(wrong_codec);
  sparrow_context_free(too_small);
}

struct Collected {
  sparrow_token tokens[16];
  int32_t n;
  int32_t stop_after;
};

static int collect(sparrow_token token, const char* piece, int32_t piece_len, void* user) {
  struct Collected* c = user;
  char expected[64];
  const int32_t n = sparrow_token_to_piece(model, token, 0, expected, sizeof expected);
  CHECK(n == piece_len && memcmp(expected, piece, (size_t)n) == 0, "token %d's piece", token);
  c->tokens[c->n++] = token;
  return c->n == c->stop_after;
}

static void test_generate(void) {
  sparrow_sampler_params sp = sparrow_sampler_default_params();
  sp.temperature = 0;
  sparrow_sampler* greedy = sparrow_sampler_new(sp);
  /* Step by step, as the callback-free API does it. */
  sparrow_context* by_hand = new_context(64, 8, "f16");
  CHECK(sparrow_decode(by_hand, prompt, 10, 0) == 0, "%s", sparrow_last_error());
  CHECK(sparrow_synchronize(by_hand) == 0, "%s", sparrow_last_error());
  sparrow_token expected[6];
  for (int i = 0; i < 6; ++i) {
    expected[i] = sparrow_sample_next(by_hand, greedy);
    CHECK(sparrow_decode(by_hand, &expected[i], 1, 0) == 0, "%s", sparrow_last_error());
  }
  struct Collected all = {{0}, 0, -1};
  sparrow_context* ctx = new_context(64, 8, "f16");
  CHECK(sparrow_decode(ctx, prompt, 10, 0) == 0, "%s", sparrow_last_error());
  const int32_t n = sparrow_generate(ctx, greedy, 6, collect, &all);
  CHECK(n == 6 && all.n == 6, "6 tokens handed over, not %d (%d)", n, all.n);
  CHECK(memcmp(all.tokens, expected, sizeof expected) == 0, "generate gives what step-by-step sampling gives");
  CHECK(sparrow_context_n_past(ctx) == 16, "every token handed over is decoded: n_past %d", sparrow_context_n_past(ctx));

  struct Collected two = {{0}, 0, 2};
  sparrow_context_reset(ctx);
  CHECK(sparrow_decode(ctx, prompt, 10, 0) == 0, "%s", sparrow_last_error());
  CHECK(sparrow_generate(ctx, greedy, -1, collect, &two) == 2, "a nonzero callback return stops after its token");
  CHECK(sparrow_context_n_past(ctx) == 12, "n_past %d", sparrow_context_n_past(ctx));
  CHECK(memcmp(two.tokens, expected, 2 * sizeof(sparrow_token)) == 0, "the same first tokens");

  sparrow_context_reset(ctx);
  CHECK(sparrow_generate(ctx, greedy, 4, NULL, NULL) == -1, "generating before any decode is an error");
  sparrow_context_free(ctx);
  sparrow_context_free(by_hand);
  sparrow_sampler_free(greedy);
}

static int calls;
static int stop_on_second_pass(void* user) {
  (void)user;
  return ++calls == 2;
}

static void test_abort(void) {
  sparrow_context* ctx = new_context(64, 8, "f16");
  calls = 0;
  sparrow_context_set_abort(ctx, stop_on_second_pass, NULL);
  CHECK(sparrow_decode(ctx, prompt, kPrompt, 0) == SPARROW_CANCELLED, "the second pass is cancelled");
  CHECK(sparrow_context_n_past(ctx) == 8, "the first 8-token pass stays decoded: n_past %d",
        sparrow_context_n_past(ctx));
  sparrow_context_set_abort(ctx, NULL, NULL);
  CHECK(sparrow_decode(ctx, prompt + 8, kPrompt - 8, 0) == 0, "%s", sparrow_last_error());
  float* resumed = copy_logits(sparrow_get_logits(ctx, -1));
  sparrow_context* straight = new_context(64, 8, "f16");
  CHECK(sparrow_decode(straight, prompt, kPrompt, 0) == 0, "%s", sparrow_last_error());
  CHECK(memcmp(resumed, sparrow_get_logits(straight, -1), sizeof(float) * (size_t)n_vocab) == 0,
        "a cancelled prompt resumed where it stopped gives the uncancelled logits");
  free(resumed);

  sparrow_context_params params = sparrow_context_default_params();
  params.n_ctx = 64;
  params.n_batch = 8;
  sparrow_batch* batch = sparrow_batch_new(model, params, 2);
  const sparrow_seq seq = sparrow_seq_open(batch);
  const sparrow_seq_step step = {seq, prompt, kPrompt};
  calls = 0;
  sparrow_batch_set_abort(batch, stop_on_second_pass, NULL);
  CHECK(sparrow_batch_decode(batch, &step, 1) == SPARROW_CANCELLED, "the batch's second pass is cancelled");
  CHECK(sparrow_seq_n_past(batch, seq) == 8, "n_past %d", sparrow_seq_n_past(batch, seq));

  /* Truncation of one sequence: decoding the forgotten tokens again gives the same logits. */
  sparrow_batch_set_abort(batch, NULL, NULL);
  const sparrow_seq_step rest = {seq, prompt + 8, kPrompt - 8};
  CHECK(sparrow_batch_decode(batch, &rest, 1) == 0, "%s", sparrow_last_error());
  CHECK(sparrow_seq_truncate(batch, seq, kPrompt - 5) == 0, "%s", sparrow_last_error());
  CHECK(sparrow_seq_n_past(batch, seq) == kPrompt - 5, "n_past after truncate");
  CHECK(sparrow_seq_truncate(batch, seq, 0) == -1, "further back than the rings keep");
  CHECK(sparrow_seq_truncate(batch, seq, kPrompt) == -1, "forward is not a truncation");
  const sparrow_seq_step again = {seq, prompt + kPrompt - 5, 5};
  CHECK(sparrow_batch_decode(batch, &again, 1) == 0, "%s", sparrow_last_error());
  const float* after = sparrow_seq_logits(batch, seq);
  CHECK(sparrow_sample_greedy(after, n_vocab) == sparrow_sample_greedy(sparrow_get_logits(straight, -1), n_vocab),
        "the truncated and re-decoded sequence's greedy token");
  sparrow_batch_free(batch);
  sparrow_context_free(straight);
  sparrow_context_free(ctx);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  snprintf(scratch, sizeof scratch, "%s", argv[2]);
  model = sparrow_model_load(argv[1], NULL, NULL);
  if (!model) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], sparrow_last_error());
    return 1;
  }
  n_vocab = sparrow_model_n_vocab(model);
  prompt[0] = sparrow_token_bos(model);
  for (int i = 1; i < kPrompt; ++i) prompt[i] = 3 + (i * 7919) % kVocabUsed;
  test_state_round_trip();
  test_generate();
  test_abort();
  sparrow_model_free(model);
  if (failures) fprintf(stderr, "%d checks failed\n", failures);
  else printf("every check passed\n");
  return failures ? 1 : 0;
}
