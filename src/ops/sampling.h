#pragma once
// Choosing the next token from logits: greedy, or top-k -> top-p -> min-p -> temperature -> draw, in llama.cpp's
// default order. The draw is one uniform u in [0, 1), picked by inverse CDF over the kept candidates in
// descending-logit order (lowest id first among equal logits). This is the reference every Backend::sample
// follows: given the same logits and u, the CPU and a GPU pick the same token.
#include <cstdint>
#include <vector>

namespace sparrow {

struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 40;        // <= 0 or >= n_vocab: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
};

struct TokenCandidate {
  int32_t id;
  float logit;
};

// The lowest id of the largest logit (what greedy sampling picks).
int32_t argmax_token(const float* logits, int32_t n_vocab);

// The token chosen for draw u; `candidates` is scratch, reused across calls to spare an allocation per token.
// Throws sparrow::Error for an empty vocabulary or u outside [0, 1).
int32_t choose_token(const float* logits, int32_t n_vocab, const SamplingParams& params, float u,
                     std::vector<TokenCandidate>& candidates);

}  // namespace sparrow
