// The qjl key codec and the QJL projection it shares with tbq3p/tbq4p: the projection pinned by checksums
// and checked for its construction (orthogonal rows within each block of d, row norm E[chi_d]), the score
// against the estimator's formula, and unbiasedness and the variance bound of the QJL paper. The contract every
// codec keeps (identities, optimized ops against the reference on every SIMD target, bad input) runs from the
// row below (kv_codec_contract_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/codec_registry.h"
#include "formats/kv/qjl.h"
#include "formats/kv/turboquant.h"
#include "kv_codec_test_util.h"
#include "util/error.h"

namespace sparrow {
namespace {

using formats::KvCodecInfo;
using formats::KvCodecOps;
using formats::SeededRandom;
using namespace kv_codec_test;
namespace qjl = formats::qjl;

// ---------------------------------------------------------------------------------------------------------
// The projection.

// S is part of the stored format (it decides every sign bit): these pins catch any change of seed, order of
// draws or construction. Checksums are double sums of float entries, compared to 1e-3 (a changed matrix
// moves them by O(1)), so ulp-level differences of libm between platforms do not trip them.
TEST(KvQjlProjection, IsPinnedByChecksums) {
  struct Pin {
    int m, d;                   // rows and columns of S
    double sum, weighted;       // sum of the entries, and weighted by ((31 i + 17 j) mod 101 - 50) / 50
    float first, second, last;  // S[0], S[1] and the last entry, row-major
  };
  const Pin pins[] = {
      {.m = 64, .d = 64, .sum = -3.248187546e+01, .weighted = 6.414707468e+01,
       .first = -7.2182256e-01f, .second = -1.2968458e+00f, .last = 6.4660370e-01f},
      {.m = 128, .d = 64, .sum = 2.105169386e+01, .weighted = -8.068589188e+00,
       .first = 7.2507471e-01f, .second = -2.9370809e-02f, .last = -3.2248172e-01f},
      {.m = 128, .d = 128, .sum = 1.573968524e+02, .weighted = 1.165246329e+02,
       .first = 1.2075621e+00f, .second = -5.4992956e-01f, .last = -1.5234777e-01f},
      {.m = 256, .d = 128, .sum = 9.639414638e+01, .weighted = -1.623687175e+01,
       .first = -1.5908922e+00f, .second = 1.3119700e+00f, .last = -1.0323541e+00f},
      {.m = 256, .d = 256, .sum = -1.626323262e+02, .weighted = -1.906433986e+02,
       .first = 3.0107641e-01f, .second = 1.2658703e+00f, .last = 6.5488711e-02f},
      {.m = 512, .d = 256, .sum = -2.490440912e+02, .weighted = 3.923723149e+02,
       .first = 2.4171944e-01f, .second = 3.2732704e-01f, .last = -5.4432023e-01f},
      {.m = 512, .d = 512, .sum = -3.035290189e+02, .weighted = -8.668384271e+01,
       .first = -5.8710450e-01f, .second = 2.3560496e-01f, .last = 1.8559818e-01f},
      {.m = 1024, .d = 512, .sum = -1.005546996e+03, .weighted = -1.328409632e+02,
       .first = -8.0387044e-01f, .second = 1.3501077e+00f, .last = -4.6494547e-02f},
  };

  for (const Pin& p : pins) {
    const float* s = qjl::projection(p.m, p.d);
    double sum = 0, weighted = 0;
    for (int i = 0; i < p.m; ++i)
      for (int j = 0; j < p.d; ++j) {
        const double v = s[size_t(i) * p.d + j];
        sum += v;
        weighted += v * (((i * 31 + j * 17) % 101) - 50) / 50.0;
      }
    EXPECT_NEAR(sum, p.sum, 1e-3) << p.m << " x " << p.d;
    EXPECT_NEAR(weighted, p.weighted, 1e-3) << p.m << " x " << p.d;
    EXPECT_NEAR(s[0], p.first, 1e-6) << p.m << " x " << p.d;
    EXPECT_NEAR(s[1], p.second, 1e-6) << p.m << " x " << p.d;
    EXPECT_NEAR(s[size_t(p.m) * p.d - 1], p.last, 1e-6) << p.m << " x " << p.d;
  }
}

// Rows within each block of d are orthogonal with norm E[chi_d]; rows of different blocks are independent
// Gaussian directions (not orthogonal).
TEST(KvQjlProjection, HasOrthogonalBlocksOfChiNormRows) {
  for (int d : {64, 128}) {
    const double rho = qjl::row_norm(d);
    EXPECT_NEAR(rho, std::sqrt(d - 0.5), 0.01) << "E[chi_d] ~ sqrt(d - 1/2)";
    const int m = 2 * d;
    const float* s = qjl::projection(m, d);
    double largest_cross_block = 0;
    for (int i = 0; i < m; ++i) {
      for (int k = i; k < m; ++k) {
        const double g = dot(s + size_t(i) * d, s + size_t(k) * d, d) / (rho * rho);
        if (i == k) {
          ASSERT_NEAR(g, 1.0, 1e-5) << "row " << i;
        } else if (i / d == k / d) {
          ASSERT_NEAR(g, 0.0, 1e-5) << "rows " << i << ", " << k;
        } else {
          largest_cross_block = std::max(largest_cross_block, std::fabs(g));
        }
      }
    }
    EXPECT_GT(largest_cross_block, 0.1) << "blocks must be independent, not copies";
  }
  EXPECT_THROW(qjl::projection(3 * 128, 128), Error);
  EXPECT_THROW(qjl::projection(96, 96), Error);
}

// ---------------------------------------------------------------------------------------------------------
// The codec.

const KvCodecInfo& info() { return formats::qjl_codec(); }

TEST(KvQjl, Layout) {
  for (int d : kHeadDims) EXPECT_EQ(info().block_bytes(d), 2 + size_t(2 * d) / 8) << "fp16 norm + 2d sign bits";
  EXPECT_DOUBLE_EQ(8.0 * info().block_bytes(128) / 128, 2.125);
  EXPECT_DOUBLE_EQ(8.0 * info().block_bytes(64) / 64, 2.25);
  EXPECT_THROW(info().block_bytes(100), Error);
}

// The score is sqrt(pi/2) / m * ||k|| * <S q, sign(S k)>, computed here from the matrix in double.
TEST(KvQjl, ScoreIsTheQjlEstimator) {
  SeededRandom rng(21);
  for (int d : kHeadDims) {
    const int m = 2 * d;
    const float* s = qjl::projection(m, d);
    for (int t = 0; t < 4; ++t) {
      const std::vector<float> k = gaussian(rng, d), q = gaussian(rng, d);
      const std::vector<uint8_t> block = encode(info(), *info().reference, k);
      EXPECT_NEAR(formats::turboquant::load_norm(block.data()), norm(k), 1e-3 * norm(k));
      double sum = 0;
      for (int i = 0; i < m; ++i) {
        const double sq = dot(s + size_t(i) * d, q.data(), d), sk = dot(s + size_t(i) * d, k.data(), d);
        EXPECT_EQ(qjl::sign_at(block.data() + 2, i), sk < 0 ? -1.0f : 1.0f) << "d=" << d << " row " << i;
        sum += sq * (sk < 0 ? -1 : 1);
      }
      const double expected = std::sqrt(M_PI / 2) / m * formats::turboquant::load_norm(block.data()) * sum;
      const std::vector<float> prepared = prepare(info(), *info().reference, q);
      EXPECT_NEAR(info().reference->score(prepared.data(), block.data(), d), expected, 1e-5 * norm(q) * norm(k));
    }
  }
}

// Unbiased: over 100000 pairs at d = 128 the mean error of the score is within 3 standard errors of 0; the
// other head dims run fewer pairs (to stay fast) and allow 3.5 standard errors, since the two test files make
// 12 such checks and a fixed seed lands beyond 3 with probability 0.27% each (3.5 keeps the family-wise false
// alarm rate under 0.6%). Pairs are k Gaussian and q = 0.8 k + 0.6 z, correlated so that a
// shrinking estimate would show. Variance: QJL's lemma bounds it by pi/(2m) ||q||^2 ||k||^2 for i.i.d.
// Gaussian rows; we check that the mean of err^2 / (||q||^2 ||k||^2) stays below pi/(2m) (orthogonal rows
// make it smaller still).
TEST(KvQjl, InnerProductsAreUnbiasedWithinTheVarianceBound) {
  const KvCodecOps& ops = cpu::kv_codec_ops(info().codec);  // agrees with the reference (KvCodecContract)
  for (int d : kHeadDims) {
    const int m = 2 * d, pairs = d == 128 ? 100000 : d == 64 ? 20000 : d == 256 ? 6000 : 2000;
    ErrorStats error;
    double normalised = 0;
    for_each_correlated_pair(info(), ops, d, pairs, 50 + d,
                             [&](double err, const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<uint8_t>&) {
                               error.add(err);
                               normalised += err * err / (dot(q.data(), q.data(), d) * dot(k.data(), k.data(), d)) /
                                             pairs;
                             });
    const double z = error.mean() / error.standard_error();
    std::printf("  qjl d=%3d: mean error %+.5f (z %+.2f over %d pairs), E[err^2/(|q|^2|k|^2)] = %.3f/m (bound "
                "pi/2 = 1.571/m)\n", d, error.mean(), z, pairs, normalised * m);
    EXPECT_LT(std::fabs(z), d == 128 ? 3.0 : 3.5) << "d=" << d;
    EXPECT_LE(normalised, M_PI / (2 * m)) << "d=" << d;
  }
}

// The optimized encode may flip a sign only where the projection is within float rounding of 0, and its fp16
// norm may round the other way.
void expect_encodes_agree(const std::vector<float>& k, const std::vector<uint8_t>& block,
                          const std::vector<uint8_t>& fast) {
  const int d = int(k.size()), m = 2 * d;
  EXPECT_NEAR(formats::turboquant::load_norm(fast.data()), formats::turboquant::load_norm(block.data()),
              1e-3 * norm(k));
  std::vector<float> sk(m);
  qjl::project(k.data(), m, d, sk.data());
  for (int i = 0; i < m; ++i) {
    if (qjl::sign_at(block.data() + 2, i) != qjl::sign_at(fast.data() + 2, i)) {
      EXPECT_LT(std::fabs(sk[i]), 1e-4 * qjl::row_norm(d) * norm(k)) << "sign " << i;
    }
  }
}

// Prepared queries agree within 1e-5 row_norm(64) ||q|| = 7.9e-5 ||q|| per element (float and double sums of
// d products with rows of norm row_norm(d) >= row_norm(64)); accumulators, holding 0.5 -+ 0.75 sqrt(pi/2)/m
// ||k|| < 0.6, within 6e-7 (1 + |a|), under 1e-6 absolute.
INSTANTIATE_TEST_SUITE_P(Qjl, KvCodecContract,
                         testing::Values(CodecCase{.codec = formats::KvCodec::QJL,
                                                   .name = "qjl",
                                                   .keys_only = true,
                                                   .query_floats_per_dim = 2,  // S q: m = 2d rows
                                                   .score_tolerance = 1e-4,
                                                   .encodes_agree = expect_encodes_agree,
                                                   .prepared_tolerance = 7.9e-5,
                                                   .score_agreement = 1e-4,
                                                   .accumulate_agreement = 6e-7,
                                                   .finish_agreement = 1e-4}),
                         case_name);

}  // namespace
}  // namespace sparrow
