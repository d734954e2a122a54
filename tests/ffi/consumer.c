/* A program of an embedder, built against an installed libsparrow.so alone (its header and its pkg-config file
 * or CMake package; tests/ffi/installed_test.py builds it both ways). It prints what `sparrow logits -p PROMPT -n N`
 * prints for the same model and prompt, so that the test can compare the two line by line:
 *
 *   version: 0.1.0
 *   tokens: 2 818 5279 ...      (the prompt, with BOS, special tokens parsed)
 *   greedy: 126919 37105 ...    (N greedy tokens: argmax, the lowest id on ties)
 *
 * Usage: consumer MODEL.gguf PROMPT N. Exits 0, or 1 with sparrow_last_error() on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sparrow/sparrow.h>

static int fail(const char* what) {
  fprintf(stderr, "consumer: %s: %s\n", what, sparrow_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s MODEL.gguf PROMPT N\n", argv[0]);
    return 2;
  }
  const char* prompt = argv[2];
  const int32_t n_greedy = atoi(argv[3]);
  printf("version: %s\n", sparrow_version());

  sparrow_model* model = sparrow_model_load(argv[1], NULL, NULL);
  if (!model) return fail("load");
  /* The count first (capacity 0 gives -(count needed)), then the ids. */
  const int32_t prompt_len = (int32_t)strlen(prompt);
  const int32_t needed = -sparrow_tokenize(model, prompt, prompt_len, 1, 1, NULL, 0);
  if (needed <= 0) return fail("tokenize");
  sparrow_token* tokens = malloc(sizeof(sparrow_token) * (size_t)needed);
  if (sparrow_tokenize(model, prompt, prompt_len, 1, 1, tokens, needed) != needed) return fail("tokenize");
  printf("tokens:");
  for (int32_t i = 0; i < needed; ++i) printf(" %d", tokens[i]);
  printf("\n");

  /* As `sparrow logits` runs it: a context just large enough, every prompt position's logits kept. */
  sparrow_context_params params = sparrow_context_default_params();
  params.n_ctx = needed + n_greedy + 1;
  sparrow_context* ctx = sparrow_context_new(model, params);
  if (!ctx) return fail("context");
  if (sparrow_decode(ctx, tokens, needed, 1) != 0) return fail("decode");
  const int32_t n_vocab = sparrow_model_n_vocab(model);
  printf("greedy:");
  for (int32_t step = 0; step < n_greedy; ++step) {
    sparrow_token next = sparrow_sample_greedy(sparrow_get_logits(ctx, -1), n_vocab);
    printf(" %d", next);
    if (step + 1 < n_greedy && sparrow_decode(ctx, &next, 1, 0) != 0) return fail("decode");
  }
  printf("\n");

  free(tokens);
  sparrow_context_free(ctx);
  sparrow_model_free(model);
  return 0;
}
