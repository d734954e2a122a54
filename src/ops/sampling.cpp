#include "ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "util/error.h"

namespace sparrow {

int32_t choose_token(const float* logits, int32_t n_vocab, const SamplingParams& params, float u,
                     std::vector<TokenCandidate>& candidates) {
  if (n_vocab <= 0) throw Error("sampler: no logits (vocabulary of " + std::to_string(n_vocab) + ")");
  if (!(u >= 0.0f && u < 1.0f)) throw Error("sampler: uniform draw " + std::to_string(u) + " is not in [0, 1)");
  if (params.temperature <= 0) return int32_t(std::max_element(logits, logits + n_vocab) - logits);
  candidates.resize(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) candidates[i] = {i, logits[i]};
  auto before = [](const TokenCandidate& a, const TokenCandidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t keep = candidates.size();
  if (params.top_k > 0 && size_t(params.top_k) < keep) keep = params.top_k;
  std::partial_sort(candidates.begin(), candidates.begin() + keep, candidates.end(), before);

  // Probabilities at temperature 1 decide top-p and min-p, as in llama.cpp.
  const float top = candidates[0].logit;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(double(candidates[i].logit - top));
  if (params.top_p < 1.0f) {
    // The first prefix holding at least top_p of the probability.
    const double target = double(params.top_p) * sum;
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i];
      if (cumulative >= target) { keep = i + 1; break; }
    }
  }
  if (params.min_p > 0) {
    size_t i = 1;
    while (i < keep && probs[i] >= double(params.min_p)) ++i;
    keep = i;
  }
  // Inverse CDF: the first candidate whose cumulative weight exceeds u times the total.
  std::vector<double> weights(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i)
    total += weights[i] = std::exp(double(candidates[i].logit - top) / double(params.temperature));
  const double target = double(u) * total;
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += weights[i];
    if (cumulative > target) return candidates[i].id;
  }
  return candidates[keep - 1].id;  // rounding left the target unreached
}

}  // namespace sparrow
