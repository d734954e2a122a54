/* The many-sequence C API from C, as an embedder (FFI, another language's runtime) sees it: sequences decoded
 * together give what each gives alone, and misuse returns an error code with a message, never a crash.
 * Usage: sparrow_c_api_test MODEL.gguf (ctest makes a tiny model first). Exits 0 when every check passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sparrow/sparrow.h"

/* max |a - b| / max |a| */
static double relative_difference(const float* a, const float* b, int32_t n) {
  double diff = 0, scale = 0;
  for (int32_t i = 0; i < n; ++i) {
    const double d = fabs((double)a[i] - (double)b[i]), m = fabs((double)a[i]);
    if (d > diff) diff = d;
    if (m > scale) scale = m;
  }
  return diff / scale;
}

/* The logits of the last prompt token, the prompt alone in a one-sequence context. */
static float* alone(sparrow_model* model, const sparrow_token* prompt, int32_t n, int32_t n_vocab) {
  sparrow_context_params params = sparrow_context_default_params();
  params.n_ctx = 64;
  sparrow_context* ctx = sparrow_context_new(model, params);
  CHECK(ctx != NULL, "%s", sparrow_last_error());
  float* out = malloc(sizeof(float) * (size_t)n_vocab);
  CHECK(sparrow_decode(ctx, prompt, n, 0) == 0, "%s", sparrow_last_error());
  memcpy(out, sparrow_get_logits(ctx, -1), sizeof(float) * (size_t)n_vocab);
  sparrow_context_free(ctx);
  return out;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  sparrow_model* model = sparrow_model_load(argv[1], NULL, NULL);
  if (!model) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], sparrow_last_error());
    return 1;
  }
  const int32_t n_vocab = sparrow_model_n_vocab(model);
  const sparrow_token prompts[3][6] = {{2, 651, 1234, 77, 9, 5}, {2, 18, 4021, 318, 0, 0}, {2, 5, 0, 0, 0, 0}};
  const int32_t lengths[3] = {6, 4, 2};

  sparrow_context_params params = sparrow_context_default_params();
  params.n_ctx = 64;
  CHECK(sparrow_batch_new(model, params, 0) == NULL, "n_seq_max 0 must be refused");
  CHECK(strlen(sparrow_last_error()) > 0, "a refusal says why");
  sparrow_batch* batch = sparrow_batch_new(model, params, 3);
  CHECK(batch != NULL, "%s", sparrow_last_error());
  if (!batch) return 1;

  sparrow_seq seqs[3];
  sparrow_seq_step steps[3];
  for (int s = 0; s < 3; ++s) {
    seqs[s] = sparrow_seq_open(batch);
    CHECK(seqs[s] >= 0, "%s", sparrow_last_error());
    steps[s].seq = seqs[s];
    steps[s].tokens = prompts[s];
    steps[s].n_tokens = lengths[s];
  }
  CHECK(sparrow_seq_open(batch) == -1, "a fourth sequence must be refused");
  CHECK(sparrow_batch_n_ctx(batch) == 64, "each sequence holds n_ctx tokens, not %d", sparrow_batch_n_ctx(batch));
  CHECK(sparrow_batch_decode(batch, steps, 3) == 0, "%s", sparrow_last_error());
  for (int s = 0; s < 3; ++s) {
    CHECK(sparrow_seq_n_past(batch, seqs[s]) == lengths[s], "sequence %d holds %d tokens", s,
          sparrow_seq_n_past(batch, seqs[s]));
    const float* together = sparrow_seq_logits(batch, seqs[s]);
    CHECK(together != NULL, "%s", sparrow_last_error());
    float* reference = alone(model, prompts[s], lengths[s], n_vocab);
    if (together) {
      /* Only the summation order of batched products differs. */
      CHECK(relative_difference(reference, together, n_vocab) < 1e-4, "sequence %d differs by %g", s,
            relative_difference(reference, together, n_vocab));
      CHECK(sparrow_sample_greedy(reference, n_vocab) == sparrow_sample_greedy(together, n_vocab),
            "sequence %d's greedy token", s);
    }
    free(reference);
  }

  /* One greedy step for two sequences, drawn on the device. */
  sparrow_sampler_params sp = sparrow_sampler_default_params();
  sp.temperature = 0;
  sparrow_sampler* greedy = sparrow_sampler_new(sp);
  sparrow_token next[2];
  for (int s = 0; s < 2; ++s) {
    next[s] = sparrow_seq_sample(batch, seqs[s], greedy);
    CHECK(next[s] == sparrow_sample_greedy(sparrow_seq_logits(batch, seqs[s]), n_vocab), "sampled greedy token");
    steps[s].tokens = &next[s];
    steps[s].n_tokens = 1;
  }
  CHECK(sparrow_batch_decode(batch, steps, 2) == 0, "%s", sparrow_last_error());
  CHECK(sparrow_seq_logits(batch, seqs[2]) == NULL, "sequence 2 was not in the last decode");

  /* Misuse: an error code and a message, nothing changed. */
  const sparrow_token bad = n_vocab;
  sparrow_seq_step wrong = {seqs[0], &bad, 1};
  CHECK(sparrow_batch_decode(batch, &wrong, 1) == -1, "a token outside the vocabulary");
  CHECK(sparrow_seq_n_past(batch, seqs[0]) == lengths[0] + 1, "a refused step changes nothing");
  sparrow_seq_step twice[2] = {{seqs[1], &next[1], 1}, {seqs[1], &next[1], 1}};
  CHECK(sparrow_batch_decode(batch, twice, 2) == -1, "one sequence twice in a decode");
  CHECK(sparrow_seq_close(batch, seqs[2]) == 0, "%s", sparrow_last_error());
  CHECK(sparrow_seq_close(batch, seqs[2]) == -1, "closing twice");
  CHECK(sparrow_seq_n_past(batch, seqs[2]) == -1, "a closed sequence");
  sparrow_seq_step closed = {seqs[2], &next[0], 1};
  CHECK(sparrow_batch_decode(batch, &closed, 1) == -1, "a closed sequence cannot decode");
  CHECK(sparrow_seq_open(batch) == seqs[2], "the closed id is reused");
  CHECK(sparrow_batch_decode(batch, NULL, 1) == -1, "no steps");

  sparrow_sampler_free(greedy);
  sparrow_batch_free(batch);
  sparrow_model_free(model);
  if (failures) fprintf(stderr, "%d checks failed\n", failures);
  else printf("every check passed\n");
  return failures ? 1 : 0;
}
