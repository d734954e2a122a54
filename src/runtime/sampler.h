#pragma once
// A seeded token sampler: each sample takes exactly one uniform draw from its generator and chooses with
// ops/sampling.h's rule, so a backend that samples on its device (given the same draw) picks the same token.
#include <cstdint>
#include <random>
#include <vector>

#include "ops/sampling.h"

namespace sparrow {

struct SamplerOptions {
  float temperature = 0.8f;  // <= 0: greedy (argmax)
  int32_t top_k = 40;        // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  // sample_with(logits, n_vocab, next_uniform()): one draw per sample, greedy included.
  int32_t sample(const float* logits, int32_t n_vocab);
  // The next uniform draw in [0, 1): 24 bits of the generator, so every value is exact in float.
  float next_uniform();
  // The token chosen for draw u (deterministic).
  int32_t sample_with(const float* logits, int32_t n_vocab, float u);
  const SamplerOptions& options() const { return options_; }
  SamplingParams params() const {
    return {options_.temperature, options_.top_k, options_.top_p, options_.min_p};
  }
  static int32_t argmax(const float* logits, int32_t n_vocab);  // lowest id on ties

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<TokenCandidate> candidates_;
};

}  // namespace sparrow
