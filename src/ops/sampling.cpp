#include "ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "util/error.h"

namespace sparrow {

namespace {

// Independent per-lane maxima and per-block tests, which the compiler keeps in vector registers: a scan of
// 262144 logits is then a few dozen microseconds, where std::max_element's branch per element took ~0.3 ms.
constexpr int32_t kLanes = 16;

float largest(const float* x, int32_t n) {
  float lane_max[kLanes];
  for (float& m : lane_max) m = -std::numeric_limits<float>::infinity();
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int32_t l = 0; l < kLanes; ++l) lane_max[l] = x[i + l] > lane_max[l] ? x[i + l] : lane_max[l];
  float m = *std::max_element(lane_max, lane_max + kLanes);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Logits within this distance below the largest are the only ones top-k can keep when at least k of them are:
// exp(-30) of the largest weight is below anything a draw can pick.
constexpr float kTopKWindow = 30.0f;

}  // namespace

int32_t argmax_token(const float* logits, int32_t n_vocab) {
  const float m = largest(logits, n_vocab);
  for (int32_t i = 0; i < n_vocab; i += kLanes) {
    const int32_t end = std::min(n_vocab, i + kLanes);
    bool found = false;
    for (int32_t j = i; j < end; ++j) found |= logits[j] == m;
    if (!found) continue;
    for (int32_t j = i; j < end; ++j)
      if (logits[j] == m) return j;
  }
  // Only NaN logits: the first one, as std::max_element would answer.
  return int32_t(std::max_element(logits, logits + n_vocab) - logits);
}

int32_t choose_token(const float* logits, int32_t n_vocab, const SamplingParams& params, float u,
                     std::vector<TokenCandidate>& candidates) {
  if (n_vocab <= 0) throw Error("sampler: no logits (vocabulary of " + std::to_string(n_vocab) + ")");
  if (!(u >= 0.0f && u < 1.0f)) throw Error("sampler: uniform draw " + std::to_string(u) + " is not in [0, 1)");
  if (params.temperature <= 0) return argmax_token(logits, n_vocab);
  candidates.clear();
  if (params.top_k > 0 && params.top_k < n_vocab) {
    // Top-k keeps the k largest logits: when k of them lie within the window below the largest, the others
    // cannot be among them, and the sort below sees a few hundred candidates instead of the vocabulary.
    const float floor = largest(logits, n_vocab) - kTopKWindow;
    for (int32_t i = 0; i < n_vocab; ++i)
      if (logits[i] >= floor) candidates.push_back({i, logits[i]});
    if (candidates.size() < size_t(params.top_k)) candidates.clear();
  }
  if (candidates.empty()) {
    candidates.resize(n_vocab);
    for (int32_t i = 0; i < n_vocab; ++i) candidates[i] = {i, logits[i]};
  }
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
