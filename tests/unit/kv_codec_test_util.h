#pragma once
// Shared parts of the KV codec tests: random vectors (Gaussian and heavy-tailed), a loop over the compiled SIMD
// targets, and the contract every codec must keep, written once over a table of codecs. A codec's test file
// lists its codecs as CodecCase rows (named fields: which codec, its name, its basis size, its tolerances) and
// instantiates the KvCodecContract suite with them (kv_codec_contract_test.cpp holds its tests); round-trip
// error bounds go in RoundTripCase rows of the KvCodecRoundTrip suite. Codec-specific tests stay in the files.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/kv_codec.h"
#include "formats/kv/seeded_random.h"
#include "util/error.h"

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

// Head vector t of a test's sequence: heavy-tailed for even t, Gaussian for odd t.
inline std::vector<float> head_vector(formats::SeededRandom& rng, int d, int t) {
  return t % 2 ? gaussian(rng, d) : heavy_tailed(rng, d, {1, d / 3, d / 2 + 5, d - 2});
}

// ||x - x^||^2 / ||x||^2 averaged over `vectors` random head vectors encoded and decoded by ops: the MSE of unit
// vectors.
enum class VectorShape { Gaussian, HeavyTailed };
inline double relative_mse(const formats::KvCodecInfo& info, const formats::KvCodecOps& ops, int d,
                           VectorShape shape, int vectors, uint64_t seed) {
  formats::SeededRandom rng(seed);
  double total = 0;
  for (int v = 0; v < vectors; ++v) {
    const std::vector<float> x = shape == VectorShape::HeavyTailed ? head_vector(rng, d, 0) : gaussian(rng, d);
    const std::vector<float> xh = decode(ops, encode(info, ops, x), d);
    double err = 0;
    for (int i = 0; i < d; ++i) err += (double(x[i]) - xh[i]) * (double(x[i]) - xh[i]);
    total += err / dot(x.data(), x.data(), d);
  }
  return total / vectors;
}

// Calls visit(error, block) for `pairs` pairs (q, k), k Gaussian and q = 0.8 k + 0.6 z: correlated, so that a
// shrinking (biased) estimate shows. error = score(prepare(q), encode(k)) - <q, k>; visit also gets q and k.
template <class Visit>
void for_each_correlated_pair(const formats::KvCodecInfo& info, const formats::KvCodecOps& ops, int d, int pairs,
                              uint64_t seed, const Visit& visit) {
  formats::SeededRandom rng(seed);
  std::vector<float> q(d), k(d), prepared(info.query_floats(d));
  std::vector<uint8_t> block(info.block_bytes(d));
  for (int t = 0; t < pairs; ++t) {
    for (int i = 0; i < d; ++i) {
      k[i] = float(rng.normal());
      q[i] = float(0.8 * k[i] + 0.6 * rng.normal());
    }
    ops.encode(k.data(), d, block.data());
    ops.prepare_query(q.data(), d, prepared.data());
    visit(ops.score(prepared.data(), block.data(), d) - dot(q.data(), k.data(), d), q, k, block);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The contract of every codec (KvCodecContract, tests in kv_codec_contract_test.cpp).

// Checks the optimized encode of x against the reference one where the two may legitimately differ (a value
// within float rounding of a quantizer boundary); without one, they must agree byte for byte.
using EncodeAgreement = void (*)(const std::vector<float>& x, const std::vector<uint8_t>& reference,
                                 const std::vector<uint8_t>& optimized);

struct CodecCase {
  formats::KvCodec codec;
  std::string name;              // the -ctk spelling, written out: checked against the registry
  bool keys_only = false;        // usable for K only
  int query_floats_per_dim = 1;  // floats of a prepared query (and of an accumulator) per head-dim element

  // score(prepare(q), b) against <q, decode(b)>, in units of ||q|| ||x^||; finish(sum of accumulate(w_t, b_t))
  // against sum w_t decode(b_t) per element, in units of 1 + |expected element|.
  double score_tolerance = 1e-5;
  double finish_tolerance = 1e-4;

  // Optimized ops against the reference on every SIMD target, on `agreement_vectors` vectors per head dim.
  int agreement_vectors = 8;
  EncodeAgreement encodes_agree = nullptr;  // null: byte for byte
  double prepared_tolerance = 0;            // per element, in units of ||q|| (0: identical)
  double score_agreement = 1e-5;            // in units of ||q'|| ||x^||
  double accumulate_agreement = 1e-6;       // per element, in units of 1 + |reference element|
  double finish_agreement = 1e-6;           // per element, in units of ||reference output||

  // A magnitude of head-vector elements the codec must round-trip to finite values: the compressed codecs'
  // fp16 norms saturate, so any float; f16 and the fp16 scales of q8_0 and q4_0 hold a bounded range.
  float finite_magnitude = 1e30f;
};

// The test name of a case: its codec's name.
inline std::string case_name(const testing::TestParamInfo<CodecCase>& info) { return info.param.name; }

class KvCodecContract : public testing::TestWithParam<CodecCase> {
 protected:
  const CodecCase& codec() const { return GetParam(); }
  const formats::KvCodecInfo& info() const { return formats::kv_codec_info(GetParam().codec); }
  const formats::KvCodecOps& reference() const { return *info().reference; }
  const formats::KvCodecOps& optimized() const { return cpu::kv_codec_ops(GetParam().codec); }
  // Both implementations of the ops, labelled for failure messages.
  std::vector<std::pair<const char*, const formats::KvCodecOps*>> both() const {
    return {{"reference", &reference()}, {"optimized", &optimized()}};
  }
};

// score is the inner product with decode's reconstruction, and finish of a sum of accumulates the weighted sum
// of reconstructions: accumulation in the codec's basis and one finish equal working on decoded values.
inline void expect_ops_act_on_decoded_values(const CodecCase& c, const formats::KvCodecInfo& info,
                                             const formats::KvCodecOps& ops, int d, uint64_t seed) {
  formats::SeededRandom rng(seed);
  std::vector<float> acc(info.accumulator_floats(d), 0.0f), expected(d, 0.0f), out(d);
  for (int t = 0; t < 16; ++t) {
    const std::vector<float> x = head_vector(rng, d, t), q = gaussian(rng, d);
    const std::vector<uint8_t> block = encode(info, ops, x);
    const std::vector<float> xh = decode(ops, block, d), prepared = prepare(info, ops, q);
    EXPECT_NEAR(ops.score(prepared.data(), block.data(), d), dot(q.data(), xh.data(), d),
                c.score_tolerance * norm(q) * norm(xh))
        << "vector " << t;
    const float w = float(rng.uniform() - 0.25);
    ops.accumulate(w, block.data(), d, acc.data());
    for (int i = 0; i < d; ++i) expected[i] += w * xh[i];
  }
  ops.finish(acc.data(), d, out.data());
  for (int i = 0; i < d; ++i)
    ASSERT_NEAR(out[i], expected[i], c.finish_tolerance * (1 + std::fabs(expected[i]))) << "element " << i;
}

// The optimized ops on the reference's bytes: decode bit for bit (sparrow verify compares decode exactly),
// prepare_query, score, accumulate and finish within float summation order.
inline void expect_optimized_matches_reference(const CodecCase& c, const formats::KvCodecInfo& info, int d,
                                               uint64_t seed) {
  const formats::KvCodecOps &ref = *info.reference, &opt = cpu::kv_codec_ops(c.codec);
  formats::SeededRandom rng(seed);
  for (int t = 0; t < c.agreement_vectors; ++t) {
    SCOPED_TRACE("vector " + std::to_string(t));
    const std::vector<float> x = head_vector(rng, d, t), q = gaussian(rng, d);
    const std::vector<uint8_t> block = encode(info, ref, x), fast = encode(info, opt, x);
    if (c.encodes_agree) {
      c.encodes_agree(x, block, fast);
    } else {
      ASSERT_EQ(fast, block) << "encode";
    }
    const std::vector<float> pr = prepare(info, ref, q), po = prepare(info, opt, q);
    for (size_t i = 0; i < pr.size(); ++i)
      ASSERT_NEAR(po[i], pr[i], c.prepared_tolerance * norm(q)) << "prepared " << i;
    const std::vector<float> xr = decode(ref, block, d), xo = decode(opt, block, d);
    ASSERT_EQ(std::memcmp(xo.data(), xr.data(), sizeof(float) * size_t(d)), 0) << "decode differs";
    EXPECT_NEAR(opt.score(pr.data(), block.data(), d), ref.score(pr.data(), block.data(), d),
                c.score_agreement * norm(pr) * norm(xr));
    std::vector<float> acc_r(info.accumulator_floats(d), 0.5f), acc_o = acc_r, out_r(d), out_o(d);
    ref.accumulate(0.75f, block.data(), d, acc_r.data());
    opt.accumulate(0.75f, block.data(), d, acc_o.data());
    for (size_t i = 0; i < acc_r.size(); ++i)
      ASSERT_NEAR(acc_o[i], acc_r[i], c.accumulate_agreement * (1 + std::fabs(acc_r[i]))) << "acc " << i;
    ref.finish(acc_r.data(), d, out_r.data());
    opt.finish(acc_r.data(), d, out_o.data());
    for (int i = 0; i < d; ++i) ASSERT_NEAR(out_o[i], out_r[i], c.finish_agreement * norm(out_r)) << "finish " << i;
  }
}

// Every op of ops throws sparrow::Error for head dim d before touching a buffer (each sized for d = 1024).
inline void expect_ops_reject_head_dim(const formats::KvCodecOps& ops, int d) {
  std::vector<float> x(2048, 1.0f), acc(2048, 0.0f);
  std::vector<uint8_t> block(4096);
  EXPECT_THROW(ops.encode(x.data(), d, block.data()), Error) << "encode";
  EXPECT_THROW(ops.decode(block.data(), d, x.data()), Error) << "decode";
  EXPECT_THROW(ops.prepare_query(x.data(), d, acc.data()), Error) << "prepare_query";
  EXPECT_THROW(ops.score(x.data(), block.data(), d), Error) << "score";
  EXPECT_THROW(ops.accumulate(1.0f, block.data(), d, acc.data()), Error) << "accumulate";
  EXPECT_THROW(ops.finish(acc.data(), d, x.data()), Error) << "finish";
}

// ---------------------------------------------------------------------------------------------------------
// Round-trip error bounds (KvCodecRoundTrip): E||x - x^||^2 / ||x||^2 over random vectors, which is the MSE of
// unit vectors, within bounds around a target from the codec's paper or its measured value.

struct RoundTripCase {
  formats::KvCodec codec;
  std::string name;
  bool optimized_encoder = false;  // measure the optimized ops (a slow reference encoder is checked elsewhere)
  int elements = 1 << 18;          // per head dim and vector shape: elements / d vectors
  double target;                   // the MSE the codec is held to
  // Gaussian vectors: at most gaussian_above above the target, and, from head dim lower_bound_from on, at
  // most gaussian_below below it (1: no lower bound); heavy-tailed ones at most heavy_above above it.
  double gaussian_above = 0.05;
  double gaussian_below = 1;
  int lower_bound_from = 64;
  double heavy_above = 0.05;
};

inline std::string round_trip_name(const testing::TestParamInfo<RoundTripCase>& info) { return info.param.name; }

class KvCodecRoundTrip : public testing::TestWithParam<RoundTripCase> {};

}  // namespace sparrow::kv_codec_test
