#pragma once
// Token sampling: greedy, or top-k -> top-p -> min-p -> temperature -> draw, in llama.cpp's default order.
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
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}
  int32_t sample(const float* logits, int32_t n_vocab);
  static int32_t argmax(const float* logits, int32_t n_vocab);

 private:
  struct Candidate { int32_t id; float logit; };
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
};

}  // namespace sparrow
