#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

namespace sparrow {

int32_t Sampler::argmax(const float* logits, int32_t n_vocab) {
  return int32_t(std::max_element(logits, logits + n_vocab) - logits);
}

int32_t Sampler::sample(const float* logits, int32_t n_vocab) {
  if (options_.temperature <= 0) return argmax(logits, n_vocab);
  candidates_.resize(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) candidates_[i] = {i, logits[i]};
  auto by_logit = [](const Candidate& a, const Candidate& b) { return a.logit > b.logit; };

  size_t keep = candidates_.size();
  if (options_.top_k > 0 && size_t(options_.top_k) < keep) keep = options_.top_k;
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  candidates_.resize(keep);

  // Probabilities at temperature 1 decide top-p and min-p, as in llama.cpp.
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(double(candidates_[i].logit - candidates_[0].logit));
  if (options_.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / sum;
      if (cumulative >= options_.top_p) { keep = i + 1; break; }
    }
  }
  if (options_.min_p > 0) {
    size_t i = 1;
    while (i < keep && probs[i] >= options_.min_p * probs[0]) ++i;
    keep = i;
  }
  std::vector<double> weights(keep);
  for (size_t i = 0; i < keep; ++i)
    weights[i] = std::exp(double(candidates_[i].logit - candidates_[0].logit) / options_.temperature);
  std::discrete_distribution<size_t> draw(weights.begin(), weights.end());
  return candidates_[draw(rng_)].id;
}

}  // namespace sparrow
