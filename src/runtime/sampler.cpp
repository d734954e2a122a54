#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "util/error.h"

namespace sparrow {

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {
  if (std::isnan(options.temperature) || std::isnan(options.top_p) || std::isnan(options.min_p))
    throw Error("sampler: temperature, top-p and min-p must be numbers");
}

int32_t Sampler::argmax(const float* logits, int32_t n_vocab) { return argmax_token(logits, n_vocab); }

float Sampler::next_uniform() { return float(rng_() >> 40) * 0x1.0p-24f; }

int32_t Sampler::sample(const float* logits, int32_t n_vocab) { return sample_with(logits, n_vocab, next_uniform()); }

int32_t Sampler::sample_with(const float* logits, int32_t n_vocab, float u) {
  return choose_token(logits, n_vocab, params(), u, candidates_);
}

}  // namespace sparrow
