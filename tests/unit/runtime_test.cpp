// Sampling and chat formatting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "runtime/chat_format.h"
#include "runtime/sampler.h"
#include "util/error.h"

namespace sparrow {
namespace {

TEST(Sampler, GreedyPicksTheLargestLogit) {
  Sampler s({0.0f, 40, 0.95f, 0.05f, 1});
  std::vector<float> logits = {0.1f, 2.5f, -1.0f, 2.4f};
  EXPECT_EQ(s.sample(logits.data(), 4), 1);
}

// The vocabulary-sized case against a plain reference: every candidate sorted (logit descending, id ascending),
// then top-k, top-p, min-p, temperature and the inverse-CDF draw as ops/sampling.h states them. Logit spreads
// from a handful of tokens near the top to thousands, so that choose_token's shortcuts (the top-k window, the
// argmax scan) and their fallbacks all run; ties and the largest logit at the last index included.
std::vector<int32_t> descending_ids(const std::vector<float>& logits) {
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return order;
}

int32_t reference_choice(const std::vector<float>& logits, const std::vector<int32_t>& order, const SamplingParams& p,
                         float u) {
  if (p.temperature <= 0) return order[0];
  size_t keep = p.top_k > 0 ? std::min(order.size(), size_t(p.top_k)) : order.size();
  const double top = logits[order[0]];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += std::exp(double(logits[order[i]]) - top);
  if (p.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += std::exp(double(logits[order[i]]) - top);
      if (cumulative >= double(p.top_p) * sum) { keep = i + 1; break; }
    }
  }
  if (p.min_p > 0) {
    size_t i = 1;
    while (i < keep && std::exp(double(logits[order[i]]) - top) >= double(p.min_p)) ++i;
    keep = i;
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += std::exp((double(logits[order[i]]) - top) / p.temperature);
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += std::exp((double(logits[order[i]]) - top) / p.temperature);
    if (cumulative > double(u) * total) return order[i];
  }
  return order[keep - 1];
}

TEST(Sampler, VocabularySizedDrawsMatchAPlainReference) {
  std::mt19937 rng(11);
  std::vector<TokenCandidate> scratch;
  for (float spread : {0.5f, 4.0f, 40.0f, 400.0f}) {
    std::vector<float> logits(262144);
    std::normal_distribution<float> gauss(0.0f, spread);
    for (float& l : logits) l = gauss(rng);
    logits[1000] = logits[2000] = 8.0f * spread;  // a tie at the top: the lower id wins
    const std::vector<int32_t> order = descending_ids(logits);
    for (const SamplingParams& p : {SamplingParams{0.0f, 40, 0.95f, 0.05f}, SamplingParams{0.8f, 40, 0.95f, 0.05f},
                                    SamplingParams{1.0f, 5, 1.0f, 0.0f}, SamplingParams{1.2f, 200, 0.9f, 0.0f},
                                    SamplingParams{0.7f, 0, 0.5f, 0.1f}}) {
      for (float u : {0.0f, 0.3f, 0.75f, 0.999f}) {
        EXPECT_EQ(choose_token(logits.data(), int32_t(logits.size()), p, u, scratch), reference_choice(logits, order, p, u))
            << "spread " << spread << " temperature " << p.temperature << " top-k " << p.top_k << " u " << u;
      }
    }
    logits.back() = 10.0f * spread;  // above any of the 262144 Gaussian draws
    EXPECT_EQ(argmax_token(logits.data(), int32_t(logits.size())), int32_t(logits.size()) - 1);
  }
}

TEST(Sampler, TopKOneIsGreedy) {
  Sampler s({1.5f, 1, 1.0f, 0.0f, 7});
  std::vector<float> logits = {0.3f, -2.0f, 1.0f, 0.9f};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits.data(), 4), 2);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // p(1)/p(0) = e^-5 < 0.05: token 1 must never be drawn; tokens 0 and 2 tie and both appear.
  Sampler s({1.0f, 0, 1.0f, 0.05f, 3});
  std::vector<float> logits = {5.0f, 0.0f, 5.0f};
  std::map<int, int> counts;
  for (int i = 0; i < 400; ++i) counts[s.sample(logits.data(), 3)]++;
  EXPECT_EQ(counts[1], 0);
  EXPECT_GT(counts[0], 100);
  EXPECT_GT(counts[2], 100);
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  Sampler s({1.0f, 0, 1.0f, 0.0f, 11});
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // probabilities 1/4, 3/4
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits.data(), 2);
  EXPECT_NEAR(double(ones) / n, 0.75, 0.015);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits = {1.0f, 1.1f, 0.9f, 1.05f, 0.2f};
  Sampler a({0.9f, 0, 1.0f, 0.0f, 42}), b({0.9f, 0, 1.0f, 0.0f, 42});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits.data(), 5), b.sample(logits.data(), 5));
}

TEST(Sampler, UniformDrawsAreInTheUnitIntervalAndSpreadOverIt) {
  Sampler s({1.0f, 0, 1.0f, 0.0f, 5});
  int low = 0;
  const int n = 10000;
  for (int i = 0; i < n; ++i) {
    const float u = s.next_uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    low += u < 0.25f;
  }
  EXPECT_NEAR(double(low) / n, 0.25, 0.02);
}

TEST(Sampler, EachSampleTakesOneDrawAndPicksItsInverseCdf) {
  const std::vector<float> logits = {0.3f, 1.2f, -0.4f, 1.0f, 0.9f, -2.0f};
  const SamplerOptions options{0.7f, 4, 0.9f, 0.02f, 99};
  Sampler drawing(options), replaying(options);
  for (int i = 0; i < 200; ++i) {
    const int32_t expected = replaying.sample_with(logits.data(), 6, replaying.next_uniform());
    EXPECT_EQ(drawing.sample(logits.data(), 6), expected);
  }
}

TEST(Sampler, InverseCdfWalksCandidatesFromTheLargestLogit) {
  // Probabilities 3/4 (id 1, first in descending order) and 1/4 (id 0): u below 3/4 picks id 1.
  Sampler s({1.0f, 0, 1.0f, 0.0f, 0});
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  EXPECT_EQ(s.sample_with(logits.data(), 2, 0.0f), 1);
  EXPECT_EQ(s.sample_with(logits.data(), 2, 0.74f), 1);
  EXPECT_EQ(s.sample_with(logits.data(), 2, 0.76f), 0);
  EXPECT_EQ(s.sample_with(logits.data(), 2, 0.999f), 0);
}

TEST(Sampler, EqualLogitsAreOrderedByIdForTheDraw) {
  Sampler s({1.0f, 0, 1.0f, 0.0f, 0});
  const std::vector<float> logits = {2.0f, 5.0f, 5.0f, 5.0f};  // ids 1, 2, 3 share (almost) all the mass
  EXPECT_EQ(s.sample_with(logits.data(), 4, 0.01f), 1);
  EXPECT_EQ(s.sample_with(logits.data(), 4, 0.5f), 2);
  EXPECT_EQ(s.sample_with(logits.data(), 4, 0.98f), 3);
}

TEST(Sampler, TopPKeepsTheFirstPrefixReachingIt) {
  // Probabilities 0.5, 0.3, 0.2 in id order 0, 1, 2: top-p 0.7 keeps ids 0 and 1 (0.8 of the mass), so the
  // largest draw lands on id 1 (weights renormalized over the kept two), never on id 2.
  Sampler s({1.0f, 0, 0.7f, 0.0f, 0});
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  EXPECT_EQ(s.sample_with(logits.data(), 3, 0.6f), 0);   // 0.5 / 0.8 = 0.625 of the kept mass is id 0
  EXPECT_EQ(s.sample_with(logits.data(), 3, 0.65f), 1);
  EXPECT_EQ(s.sample_with(logits.data(), 3, 0.999f), 1);
}

TEST(Sampler, BadDrawIsAnError) {
  Sampler s({1.0f, 0, 1.0f, 0.0f, 0});
  const std::vector<float> logits = {1.0f, 2.0f};
  EXPECT_THROW(s.sample_with(logits.data(), 2, 1.0f), Error);
  EXPECT_THROW(s.sample_with(logits.data(), 2, -0.1f), Error);
  EXPECT_THROW(s.sample_with(logits.data(), 0, 0.5f), Error);
}

TEST(ChatFormat, Gemma3TurnsWithSystemFoldedIntoFirstUserTurn) {
  std::string s = format_chat(ChatFamily::Gemma3,
                              {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}},
                              true);
  EXPECT_EQ(s,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatFormat, Gemma4TurnsWithSystemTurn) {
  std::string s = format_chat(ChatFamily::Gemma4, {{"system", "S"}, {"user", "U"}}, true);
  EXPECT_EQ(s, "<bos><|turn>system\nS<turn|>\n<|turn>user\nU<turn|>\n<|turn>model\n");
}

TEST(ChatFormat, FamilyFromTemplateMarkersOrArchitecture) {
  EXPECT_EQ(detect_chat_family("{{ '<|turn>' + role }}", Architecture::Gemma3), ChatFamily::Gemma4);
  EXPECT_EQ(detect_chat_family("{{ '<start_of_turn>' }}", Architecture::Gemma4), ChatFamily::Gemma3);
  EXPECT_EQ(detect_chat_family("", Architecture::Gemma4), ChatFamily::Gemma4);
  EXPECT_EQ(detect_chat_family("", Architecture::Gemma3), ChatFamily::Gemma3);
}

TEST(ChatFormat, UnknownRoleIsAnError) {
  EXPECT_THROW(format_chat(ChatFamily::Gemma3, {{"robot", "x"}}, true), Error);
}

}  // namespace
}  // namespace sparrow
