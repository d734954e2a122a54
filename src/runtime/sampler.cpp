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

int32_t Sampler::argmax(const float* logits, int32_t n_vocab) {
  return int32_t(std::max_element(logits, logits + n_vocab) - logits);
}

float Sampler::next_uniform() { return float(rng_() >> 40) * 0x1.0p-24f; }

int32_t Sampler::sample(const float* logits, int32_t n_vocab) { return sample_with(logits, n_vocab, next_uniform()); }

int32_t Sampler::sample_with(const float* logits, int32_t n_vocab, float u) {
  if (n_vocab <= 0) throw Error("sampler: no logits (vocabulary of " + std::to_string(n_vocab) + ")");
  if (!(u >= 0.0f && u < 1.0f)) throw Error("sampler: uniform draw " + std::to_string(u) + " is not in [0, 1)");
  if (options_.temperature <= 0) return argmax(logits, n_vocab);
  candidates_.resize(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) candidates_[i] = {i, logits[i]};
  auto before = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t keep = candidates_.size();
  if (options_.top_k > 0 && size_t(options_.top_k) < keep) keep = options_.top_k;
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), before);

  // Probabilities at temperature 1 decide top-p and min-p, as in llama.cpp.
  const float top = candidates_[0].logit;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(double(candidates_[i].logit - top));
  if (options_.top_p < 1.0f) {
    // The first prefix holding at least top_p of the probability.
    const double target = double(options_.top_p) * sum;
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i];
      if (cumulative >= target) { keep = i + 1; break; }
    }
  }
  if (options_.min_p > 0) {
    size_t i = 1;
    while (i < keep && probs[i] >= double(options_.min_p)) ++i;
    keep = i;
  }
  // Inverse CDF: the first candidate whose cumulative weight exceeds u times the total.
  std::vector<double> weights(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i)
    total += weights[i] = std::exp(double(candidates_[i].logit - top) / double(options_.temperature));
  const double target = double(u) * total;
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += weights[i];
    if (cumulative > target) return candidates_[i].id;
  }
  return candidates_[keep - 1].id;  // rounding left the target unreached
}

}  // namespace sparrow
