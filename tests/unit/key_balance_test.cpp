// Key balancing (model/key_balance.h): scaled gains leave every RoPE'd score unchanged and give each pair of
// the query and the key the same magnitude.
#include "model/key_balance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "util/error.h"

namespace sparrow {
namespace {

// NEOX RoPE as the Gemma models apply it, written here on its own: element i and i + d/2 rotated together by
// position * theta^(-2i/d).
std::vector<double> rope(const std::vector<double>& x, int position) {
  const size_t half = x.size() / 2;
  std::vector<double> y(x.size());
  for (size_t i = 0; i < half; ++i) {
    const double angle = position * std::pow(10000.0, -2.0 * double(i) / double(x.size()));
    y[i] = x[i] * std::cos(angle) - x[i + half] * std::sin(angle);
    y[i + half] = x[i] * std::sin(angle) + x[i + half] * std::cos(angle);
  }
  return y;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(KeyBalance, ScoresAreUnchangedAndPairsEqualized) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> gain(0.1f, 20.0f);
  std::normal_distribution<double> normal;
  for (int d : {64, 256, 512}) {
    std::vector<float> gq(static_cast<size_t>(d)), gk(static_cast<size_t>(d));
    for (int i = 0; i < d; ++i) gq[size_t(i)] = gain(rng), gk[size_t(i)] = gain(rng);
    const std::vector<float> s = key_balance(gq, gk);
    const std::vector<float> bq = scaled_gain(gq, s, true), bk = scaled_gain(gk, s, false);
    for (int trial = 0; trial < 8; ++trial) {
      const size_t n = static_cast<size_t>(d);
      std::vector<double> q(n), k(n), q1(n), k1(n), q2(n), k2(n);
      for (int i = 0; i < d; ++i) q[size_t(i)] = normal(rng), k[size_t(i)] = normal(rng);
      for (int i = 0; i < d; ++i) {
        q1[size_t(i)] = q[size_t(i)] * gq[size_t(i)], k1[size_t(i)] = k[size_t(i)] * gk[size_t(i)];
        q2[size_t(i)] = q[size_t(i)] * bq[size_t(i)], k2[size_t(i)] = k[size_t(i)] * bk[size_t(i)];
      }
      const int qpos = 37 * trial + 5, kpos = 11 * trial;
      const double plain = dot(rope(q1, qpos), rope(k1, kpos)), balanced = dot(rope(q2, qpos), rope(k2, kpos));
      EXPECT_NEAR(balanced, plain, 1e-5 * (std::fabs(plain) + dot(q1, q1)))  << "d " << d << " trial " << trial;
    }
    for (int p = 0; p < d / 2; ++p) {  // each pair's query and key gains now have the same magnitude
      const double q_pair = std::hypot(double(bq[size_t(p)]), double(bq[size_t(p + d / 2)]));
      const double k_pair = std::hypot(double(bk[size_t(p)]), double(bk[size_t(p + d / 2)]));
      EXPECT_NEAR(q_pair, k_pair, 1e-5 * q_pair) << "d " << d << " pair " << p;
      EXPECT_EQ(s[size_t(p)], s[size_t(p + d / 2)]);  // one scale per pair, which commutes with RoPE
    }
  }
}

TEST(KeyBalance, IgnoredPairsShrinkZeroGainsStayAndBadShapesThrow) {
  std::vector<float> gq(8, 2.0f), gk(8, 2.0f);
  gq[1] = gq[5] = 0.0f;  // pair 1 is never looked at by queries
  const std::vector<float> s = key_balance(gq, gk);
  EXPECT_FLOAT_EQ(s[0], 1.0f);
  EXPECT_LT(s[1], 0.05f);  // its keys take little of the codec's budget
  EXPECT_GT(s[1], 0.0f);
  for (float x : key_balance(std::vector<float>(8, 0.0f), gk)) EXPECT_EQ(x, 1.0f);
  EXPECT_THROW(key_balance(std::vector<float>(8, 1.0f), std::vector<float>(6, 1.0f)), Error);
  EXPECT_THROW(key_balance(std::vector<float>(7, 1.0f), std::vector<float>(7, 1.0f)), Error);
  EXPECT_THROW(scaled_gain(gq, std::vector<float>(4, 1.0f), false), Error);
}

}  // namespace
}  // namespace sparrow
