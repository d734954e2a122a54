#pragma once
// Token sampling: greedy, or top-k -> top-p -> min-p -> temperature -> draw, in llama.cpp's default order.
// A draw takes exactly one uniform u in [0, 1) from the seeded generator and picks by inverse CDF over the kept
// candidates in descending-logit order (lowest id first among equal logits), so that a backend that samples on
// its device (given the same u) picks the same token.
#include <cstdint>
#include <random>
#include <vector>

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
  static int32_t argmax(const float* logits, int32_t n_vocab);  // lowest id on ties

 private:
  struct Candidate { int32_t id; float logit; };
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
};

}  // namespace sparrow
