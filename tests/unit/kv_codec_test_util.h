#pragma once
// Shared helpers of the KV codec tests: random vectors (Gaussian and heavy-tailed), the identities every codec
// must satisfy, and a loop over the compiled SIMD targets.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "formats/kv/seeded_random.h"

namespace sparrow::kv_codec_test {

inline constexpr int kHeadDims[] = {64, 128, 256, 512};

inline std::vector<float> gaussian(formats::SeededRandom& rng, int d) {
  std::vector<float> x(d);
  for (float& v : x) v = float(rng.normal());
  return x;
}

// Student-t entries (4 degrees of freedom) plus outlier channels 20x larger: the shape of real K/V heads.
inline std::vector<float> heavy_tailed(formats::SeededRandom& rng, int d,
                                       std::initializer_list<int> outlier_channels = {3, 17, 40, 61}) {
  std::vector<float> x(d);
  for (float& v : x) {
    double chi2 = 0;
    for (int k = 0; k < 4; ++k) {
      const double z = rng.normal();
      chi2 += z * z;
    }
    v = float(rng.normal() / std::sqrt(chi2 / 4));
  }
  for (int c : outlier_channels) x[c] *= 20.0f;
  return x;
}

inline double dot(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return s;
}
inline double norm(const std::vector<float>& x) { return std::sqrt(dot(x.data(), x.data(), int(x.size()))); }

inline std::vector<uint8_t> encode(const formats::KvCodecInfo& info, const formats::KvCodecOps& ops,
                                   const std::vector<float>& x) {
  const int d = int(x.size());
  std::vector<uint8_t> block(info.block_bytes(d));
  ops.encode(x.data(), d, block.data());
  return block;
}
inline std::vector<float> decode(const formats::KvCodecOps& ops, const std::vector<uint8_t>& block, int d) {
  std::vector<float> x(d);
  ops.decode(block.data(), d, x.data());
  return x;
}
inline std::vector<float> prepare(const formats::KvCodecInfo& info, const formats::KvCodecOps& ops,
                                  const std::vector<float>& q) {
  const int d = int(q.size());
  std::vector<float> prepared(info.query_floats(d));
  ops.prepare_query(q.data(), d, prepared.data());
  return prepared;
}

// score(prepare(q), encode(x)) == <q, decode(encode(x))>: the score is the inner product with the very
// reconstruction decode returns (float rounding: 1e-4 of ||q|| ||x^||).
inline void expect_score_is_dot_with_decode(const formats::KvCodecInfo& info, const formats::KvCodecOps& ops,
                                            int d, uint64_t seed) {
  formats::SeededRandom rng(seed);
  for (int t = 0; t < 8; ++t) {
    const std::vector<float> x = gaussian(rng, d), q = gaussian(rng, d);
    const std::vector<uint8_t> block = encode(info, ops, x);
    const std::vector<float> xh = decode(ops, block, d), prepared = prepare(info, ops, q);
    const double expected = dot(q.data(), xh.data(), d);
    EXPECT_NEAR(ops.score(prepared.data(), block.data(), d), expected, 1e-4 * norm(q) * norm(xh))
        << info.name << " d=" << d << " vector " << t;
  }
}

// finish(sum of accumulate(w_t, block_t)) == sum w_t decode(block_t): accumulation in the codec's basis
// and one finish equal the weighted sum of reconstructions.
inline void expect_finish_is_weighted_decode(const formats::KvCodecInfo& info, const formats::KvCodecOps& ops,
                                             int d, uint64_t seed) {
  formats::SeededRandom rng(seed);
  std::vector<float> acc(info.accumulator_floats(d), 0.0f), expected(d, 0.0f), out(d);
  double scale = 0;
  for (int t = 0; t < 16; ++t) {
    const float w = float(rng.uniform() - 0.25);
    const std::vector<uint8_t> block = encode(info, ops, gaussian(rng, d));
    const std::vector<float> xh = decode(ops, block, d);
    ops.accumulate(w, block.data(), d, acc.data());
    for (int i = 0; i < d; ++i) expected[i] += w * xh[i];
    scale += std::fabs(w) * norm(xh);
  }
  ops.finish(acc.data(), d, out.data());
  for (int i = 0; i < d; ++i) ASSERT_NEAR(out[i], expected[i], 1e-4 * scale) << info.name << " d=" << d << " i=" << i;
}

// Runs fn once per SIMD target compiled in and supported here (the scalar/emulated ones stand in for targets
// this machine cannot run, like NEON), then restores dynamic dispatch.
inline void for_each_simd_target(const std::function<void()>& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    SCOPED_TRACE(hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

// Mean error of an estimator and its standard error over a sample.
struct ErrorStats {
  double sum = 0, sum_sq = 0;
  long count = 0;
  void add(double e) { sum += e; sum_sq += e * e; ++count; }
  double mean() const { return sum / count; }
  double standard_error() const { return std::sqrt((sum_sq / count - mean() * mean()) / count); }
};

}  // namespace sparrow::kv_codec_test
