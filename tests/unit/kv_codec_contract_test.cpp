// The contract every KV codec keeps, checked once here for the codecs each codec test file lists
// (INSTANTIATE_TEST_SUITE_P with its CodecCase and RoundTripCase rows; kv_codec_test_util.h): its registry
// entry, score and finish acting on decoded values, the optimized ops agreeing with the reference on every SIMD
// target, unsupported head dims rejected by every op, zero, huge and NaN vectors contained, and the round-trip
// error within the codec's bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/kv_codec.h"
#include "kv_codec_test_util.h"
#include "util/error.h"

namespace sparrow::kv_codec_test {
namespace {

TEST_P(KvCodecContract, RegistryEntryIsTheCodecs) {
  EXPECT_EQ(info().codec, codec().codec);
  EXPECT_EQ(info().name, codec().name);
  EXPECT_EQ(formats::parse_kv_codec(codec().name), codec().codec);
  EXPECT_EQ(info().keys_only, codec().keys_only);
  EXPECT_EQ(&formats::kv_codecs()[size_t(codec().codec)], &info()) << "kv_codecs() lists codecs in enum order";
  for (int d : kHeadDims) {
    EXPECT_GT(info().block_bytes(d), 0u) << "d=" << d;
    EXPECT_EQ(info().query_floats(d), size_t(codec().query_floats_per_dim * d)) << "d=" << d;
    EXPECT_EQ(info().accumulator_floats(d), info().query_floats(d)) << "one basis row serves both, d=" << d;
  }
}

TEST_P(KvCodecContract, ScoreAndFinishActOnDecodedValues) {
  for (const auto& [label, ops] : both()) {
    for (int d : kHeadDims) {
      SCOPED_TRACE(std::string(label) + " d=" + std::to_string(d));
      expect_ops_act_on_decoded_values(codec(), info(), *ops, d, 300 + d);
    }
  }
}

TEST_P(KvCodecContract, OptimizedOpsMatchTheReferenceOnEverySimdTarget) {
  for_each_simd_target([&] {
    for (int d : kHeadDims) {
      SCOPED_TRACE("d=" + std::to_string(d));
      expect_optimized_matches_reference(codec(), info(), d, 600 + d);
    }
  });
}

TEST_P(KvCodecContract, EveryOpRejectsUnsupportedHeadDims) {
  for (const auto& [label, ops] : both()) {
    for (int d : {0, 32, 96, 100, 1024}) {
      SCOPED_TRACE(std::string(label) + " d=" + std::to_string(d));
      expect_ops_reject_head_dim(*ops, d);
    }
    // The message names the codec and the head dim.
    std::vector<float> x(96, 1.0f);
    std::vector<uint8_t> block(1024);
    try {
      ops->encode(x.data(), 96, block.data());
      ADD_FAILURE() << label << " encode accepted head dim 96";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(codec().name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("96"), std::string::npos) << e.what();
    }
  }
}

// Zero stays zero; a vector of the largest magnitude the codec takes stays finite; NaN neither crashes nor
// writes past the block.
TEST_P(KvCodecContract, ZeroHugeAndNanVectorsAreContained) {
  const int d = 128;
  for (const auto& [label, ops] : both()) {
    SCOPED_TRACE(label);
    const std::vector<float> zero(d, 0.0f);
    for (float v : decode(*ops, encode(info(), *ops, zero), d)) ASSERT_EQ(v, 0.0f);
    std::vector<float> huge(d);
    for (int i = 0; i < d; ++i) huge[i] = (i % 3 ? 1.0f : -0.3f) * codec().finite_magnitude;
    for (float v : decode(*ops, encode(info(), *ops, huge), d)) ASSERT_TRUE(std::isfinite(v));
    std::vector<float> with_nan(d, 1.0f);
    with_nan[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint8_t> guarded(info().block_bytes(d) + 16, 0xA5);
    ops->encode(with_nan.data(), d, guarded.data());
    for (size_t i = info().block_bytes(d); i < guarded.size(); ++i) ASSERT_EQ(guarded[i], 0xA5) << "byte " << i;
    std::vector<float> y(d);
    ops->decode(guarded.data(), d, y.data());
  }
}

TEST_P(KvCodecRoundTrip, ErrorIsWithinTheCodecsBounds) {
  const RoundTripCase& c = GetParam();
  const formats::KvCodecInfo& info = formats::kv_codec_info(c.codec);
  const formats::KvCodecOps& ops = c.optimized_encoder ? cpu::kv_codec_ops(c.codec) : *info.reference;
  for (int d : kHeadDims) {
    const int vectors = c.elements / d;
    const double gaussian = relative_mse(info, ops, d, VectorShape::Gaussian, vectors, 100 + d);
    const double heavy = relative_mse(info, ops, d, VectorShape::HeavyTailed, vectors, 200 + d);
    std::printf("  %s d=%3d: MSE %.5f (target %.4f, %+.1f%%), heavy-tailed %.5f (%+.1f%%)\n", c.name.c_str(), d,
                gaussian, c.target, 100 * (gaussian / c.target - 1), heavy, 100 * (heavy / c.target - 1));
    EXPECT_LE(gaussian, (1 + c.gaussian_above) * c.target) << "d=" << d;
    if (c.gaussian_below < 1 && d >= c.lower_bound_from) {
      EXPECT_GE(gaussian, (1 - c.gaussian_below) * c.target) << "d=" << d;
    }
    EXPECT_LE(heavy, (1 + c.heavy_above) * c.target) << "d=" << d << " (heavy-tailed)";
  }
}

}  // namespace
}  // namespace sparrow::kv_codec_test
