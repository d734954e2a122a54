// TurboQuant KV codecs (tbq2, tbq3, tbq4; tbq3p, tbq4p), the shared Hadamard rotation and the Lloyd-Max
// tables: the tables against the spec and against an independent numerical integration, the layout, and
// unbiasedness and variance of the inner-product codecs. The contract every codec keeps (identities,
// optimized ops against the references on every SIMD target, bad input) and the MSE per bit width against the
// paper's numbers run from the rows below (kv_codec_contract_test.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/codec_registry.h"
#include "formats/kv/lloyd_max.h"
#include "formats/kv/qjl.h"
#include "formats/kv/rotation.h"
#include "formats/kv/turboquant.h"
#include "kv_codec_test_util.h"
#include "util/error.h"

namespace sparrow {
namespace {

using formats::KvCodec;
using formats::KvCodecInfo;
using formats::KvCodecOps;
using formats::LloydMaxCodebook;
using formats::SeededRandom;
using namespace kv_codec_test;

struct TbqCodec {
  const KvCodecInfo& (*info)();
  int mse_bits;     // bits of the MSE part
  bool has_sketch;  // tbq3p / tbq4p
};

const TbqCodec kTbqCodecs[] = {
    {.info = formats::tbq2_codec, .mse_bits = 2, .has_sketch = false},
    {.info = formats::tbq3_codec, .mse_bits = 3, .has_sketch = false},
    {.info = formats::tbq4_codec, .mse_bits = 4, .has_sketch = false},
    {.info = formats::tbq3p_codec, .mse_bits = 2, .has_sketch = true},
    {.info = formats::tbq4p_codec, .mse_bits = 3, .has_sketch = true},
};

// Bits per element from the codec's own entry (kv_bits_per_element goes through the registry of all codecs).
double bits_per_element(const KvCodecInfo& info, int d) { return 8.0 * double(info.block_bytes(d)) / d; }

// ---------------------------------------------------------------------------------------------------------
// Rotation.

// R = D2 H D1 / sqrt(d) written out entry by entry: H_ij = (-1)^popcount(i & j) (Sylvester order).
double rotation_entry(int d, int i, int j) {
  const double h = (std::popcount(unsigned(i & j)) % 2) ? -1.0 : 1.0;
  return formats::hadamard_signs_out(d)[i] * h * formats::hadamard_signs_in(d)[j] / std::sqrt(double(d));
}

TEST(KvRotation, IsTheSignedHadamardMatrixAndItsTranspose) {
  SeededRandom rng(11);
  for (int d : kHeadDims) {
    const std::vector<float> x = gaussian(rng, d);
    std::vector<float> y(d), back(d);
    formats::hadamard_rotate(x.data(), d, y.data());
    formats::hadamard_unrotate(y.data(), d, back.data());
    for (int i = 0; i < d; ++i) {
      double expected = 0, expected_back = 0;
      for (int j = 0; j < d; ++j) {
        expected += rotation_entry(d, i, j) * x[j];
        expected_back += rotation_entry(d, j, i) * y[j];
      }
      ASSERT_NEAR(y[i], expected, 1e-5) << "d=" << d << " i=" << i;
      ASSERT_NEAR(back[i], expected_back, 1e-5) << "d=" << d << " i=" << i;
      ASSERT_NEAR(back[i], x[i], 1e-5) << "R^T R = I, d=" << d;
    }
    std::vector<float> in_place = x;  // aliasing is allowed
    formats::hadamard_rotate(in_place.data(), d, in_place.data());
    EXPECT_EQ(in_place, y);
  }
}

// The sign vectors are part of the stored format: a changed seed would silently misread every cache.
TEST(KvRotation, SignVectorsArePinned) {
  struct Pin { int d; uint64_t in, out; };
  const Pin pins[] = {{.d = 64, .in = 0x0cc7efa449ba2a46ull, .out = 0x6c880aa07353eaf5ull},
                      {.d = 128, .in = 0x1ba751692b7cdbafull, .out = 0x5d9ee36fbc9e28e7ull},
                      {.d = 256, .in = 0x587e7c2d3e068d3dull, .out = 0x8580ccdd220f7438ull},
                      {.d = 512, .in = 0x762b47cbaf2d4f7cull, .out = 0x6fd8e9b0fc58b7c7ull}};
  const auto fnv1a_of_signs = [](const float* s, int d) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < d; ++i) {
      EXPECT_TRUE(s[i] == 1.0f || s[i] == -1.0f);
      h = (h ^ uint64_t(s[i] < 0)) * 1099511628211ull;
    }
    return h;
  };
  for (const Pin& p : pins) {
    EXPECT_EQ(fnv1a_of_signs(formats::hadamard_signs_in(p.d), p.d), p.in) << "D1, d=" << p.d;
    EXPECT_EQ(fnv1a_of_signs(formats::hadamard_signs_out(p.d), p.d), p.out) << "D2, d=" << p.d;
  }
}

TEST(KvRotation, RejectsUnsupportedHeadDims) {
  std::vector<float> x(96, 1.0f);
  EXPECT_THROW(formats::hadamard_rotate(x.data(), 96, x.data()), Error);
  EXPECT_THROW(formats::hadamard_signs_in(32), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Lloyd-Max tables.

std::vector<double> positive_half(const LloydMaxCodebook& book) {
  const int levels = 1 << book.bits;
  return std::vector<double>(book.centroids + levels / 2, book.centroids + levels);
}

TEST(KvLloydMax, TablesMatchTheSpec) {
  // Exact values for n = 128 from the spec (3 and 4 bits), within 1e-5.
  const double b3[] = {0.021604, 0.066586, 0.118140, 0.188397};
  const double b4[] = {0.011302, 0.034152, 0.057772, 0.082828, 0.110288, 0.141805, 0.180836, 0.237664};
  const std::vector<double> got3 = positive_half(formats::lloyd_max_codebook(128, 3));
  const std::vector<double> got4 = positive_half(formats::lloyd_max_codebook(128, 4));
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got3[i], b3[i], 1e-5) << "n=128 b=3 centroid " << i;
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(got4[i], b4[i], 1e-5) << "n=128 b=4 centroid " << i;

  // The Gaussian approximation N(0, 1/n): within 1% at n = 128 for 1 and 2 bits (the spec gives no exact
  // values there), and within 4% at n = 64 for every width (the exact density's tails are lighter).
  const std::vector<std::vector<double>> gaussian_values = {
      {0.7979}, {0.4528, 1.5104}, {0.2451, 0.7560, 1.3439, 2.1519},
      {0.1284, 0.3880, 0.6568, 0.9423, 1.2562, 1.6180, 2.0690, 2.7326}};
  for (int bits = 1; bits <= 4; ++bits) {
    for (int n : {64, 128}) {
      if (n == 128 && bits > 2) continue;
      const std::vector<double> got = positive_half(formats::lloyd_max_codebook(n, bits));
      const double tolerance = n == 128 ? 0.01 : 0.04;
      for (size_t i = 0; i < got.size(); ++i) {
        const double expected = gaussian_values[bits - 1][i] / std::sqrt(double(n));
        EXPECT_NEAR(got[i], expected, tolerance * expected) << "n=" << n << " b=" << bits << " centroid " << i;
      }
    }
  }
}

// The density of one coordinate of a random unit vector in R^n, unnormalised.
double coordinate_density(int n, double t) { return std::pow(1.0 - t * t, (n - 3) / 2.0); }

// Integral of f over [a, b] by composite Simpson (f smooth on the cell).
template <class F>
double simpson(F f, double a, double b, int intervals = 4000) {
  const double h = (b - a) / intervals;
  double s = f(a) + f(b);
  for (int i = 1; i < intervals; ++i) s += f(a + i * h) * (i % 2 ? 4 : 2);
  return s * h / 3;
}

// Independent of the generator: every centroid is its cell's conditional mean, every boundary the midpoint of
// its neighbours, the codebook symmetric, and the stored MSE the integrated distortion.
TEST(KvLloydMax, TablesAreFixedPointsOfLloydForTheExactDensity) {
  for (int n : {64, 128}) {
    const double total = simpson([&](double t) { return coordinate_density(n, t); }, -1, 1, 200000);
    for (int bits = 1; bits <= 4; ++bits) {
      const LloydMaxCodebook& book = formats::lloyd_max_codebook(n, bits);
      const int levels = 1 << bits;
      double distortion = 0;
      for (int c = 0; c < levels; ++c) {
        const double lo = c == 0 ? -1.0 : book.boundaries[c - 1], hi = c == levels - 1 ? 1.0 : book.boundaries[c];
        const double mass = simpson([&](double t) { return coordinate_density(n, t); }, lo, hi);
        const double moment = simpson([&](double t) { return t * coordinate_density(n, t); }, lo, hi);
        EXPECT_NEAR(book.centroids[c], moment / mass, 2e-6) << "n=" << n << " b=" << bits << " cell " << c;
        EXPECT_FLOAT_EQ(book.centroids[c], -book.centroids[levels - 1 - c]);
        if (c + 1 < levels) {
          EXPECT_FLOAT_EQ(book.boundaries[c], 0.5f * (book.centroids[c] + book.centroids[c + 1]));
        }
        const double centroid = book.centroids[c];
        distortion += simpson([&](double t) { return (t - centroid) * (t - centroid) * coordinate_density(n, t); }, lo, hi);
      }
      EXPECT_NEAR(book.unit_mse, n * distortion / total, 1e-4 * book.unit_mse) << "n=" << n << " b=" << bits;
    }
  }
  EXPECT_THROW(formats::lloyd_max_codebook(256, 4), Error);
  EXPECT_THROW(formats::lloyd_max_codebook(128, 5), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Layout.

TEST(KvTurboQuant, BitsPerElementAndSizesOfBadHeadDims) {
  // tbqN: N bits + one fp16 norm per 128-element sub-block (per head at d = 64). tbqNp: the (N-1)-bit MSE
  // part, one sign bit per element and one fp16 residual norm per head vector.
  for (int d : {128, 256, 512}) {
    EXPECT_DOUBLE_EQ(bits_per_element(formats::tbq2_codec(), d), 2.125) << d;
    EXPECT_DOUBLE_EQ(bits_per_element(formats::tbq3_codec(), d), 3.125) << d;
    EXPECT_DOUBLE_EQ(bits_per_element(formats::tbq4_codec(), d), 4.125) << d;
    EXPECT_DOUBLE_EQ(bits_per_element(formats::tbq3p_codec(), d), 3.125 + 16.0 / d) << d;
    EXPECT_DOUBLE_EQ(bits_per_element(formats::tbq4p_codec(), d), 4.125 + 16.0 / d) << d;
  }
  EXPECT_DOUBLE_EQ(bits_per_element(formats::tbq2_codec(), 64), 2.25);
  EXPECT_DOUBLE_EQ(bits_per_element(formats::tbq4_codec(), 64), 4.25);
  EXPECT_DOUBLE_EQ(bits_per_element(formats::tbq4p_codec(), 64), 4.5);
  for (const TbqCodec& c : kTbqCodecs) {
    EXPECT_THROW(c.info().block_bytes(96), Error) << c.info().name;
    EXPECT_THROW(c.info().query_floats(1024), Error) << c.info().name;
  }
}

// The byte layout of turboquant.h, checked on hand-made codes: nibbles j / j + n/2, quarters j + k n/4, and
// for 3 bits the quarters of code & 3 followed by a little-endian plane of code >> 2.
TEST(KvTurboQuant, CodePackingIsTheDocumentedLayout) {
  const int n = 64;
  uint8_t codes[n], packed[32], back[n];
  for (int i = 0; i < n; ++i) codes[i] = uint8_t((i * 7 + 3) % 16);
  formats::turboquant::pack_codes(codes, n, 4, packed);
  EXPECT_EQ(packed[5], uint8_t(codes[5] | codes[37] << 4));
  for (int i = 0; i < n; ++i) codes[i] &= 3;
  formats::turboquant::pack_codes(codes, n, 2, packed);
  EXPECT_EQ(packed[3], uint8_t(codes[3] | codes[19] << 2 | codes[35] << 4 | codes[51] << 6));
  for (int i = 0; i < n; ++i) codes[i] = uint8_t((i * 5 + 1) % 8);
  formats::turboquant::pack_codes(codes, n, 3, packed);
  EXPECT_EQ(packed[2], uint8_t((codes[2] & 3) | (codes[18] & 3) << 2 | (codes[34] & 3) << 4 | (codes[50] & 3) << 6));
  uint8_t plane_byte = 0;
  for (int b = 0; b < 8; ++b) plane_byte |= uint8_t((codes[8 + b] >> 2) << b);
  EXPECT_EQ(packed[16 + 1], plane_byte);
  for (int bits : {2, 3, 4}) {
    for (int i = 0; i < n; ++i) codes[i] = uint8_t((i * 11 + bits) % (1 << bits));
    formats::turboquant::pack_codes(codes, n, bits, packed);
    formats::turboquant::unpack_codes(packed, n, bits, back);
    EXPECT_EQ(std::memcmp(codes, back, n), 0) << bits << " bits";
  }
}

// ---------------------------------------------------------------------------------------------------------
// MSE.

// The paper's targets (E||x - x^||^2 for unit x): within 5% at d >= 128. At d = 64 the sub-block is the
// whole head (n = 64) and the error must not exceed the target by more than 5% (it is lower: the n = 64
// codebook fits a wider density). Heavy-tailed vectors with outlier channels: at most 5% above the target
// too, thanks to the rotation, which spreads each outlier over all coordinates.
INSTANTIATE_TEST_SUITE_P(
    TurboQuant, KvCodecRoundTrip,
    testing::Values(RoundTripCase{.codec = KvCodec::TBQ2, .name = "tbq2", .target = 0.117, .gaussian_below = 0.05,
                                  .lower_bound_from = 128},
                    RoundTripCase{.codec = KvCodec::TBQ3, .name = "tbq3", .target = 0.0340, .gaussian_below = 0.05,
                                  .lower_bound_from = 128},
                    RoundTripCase{.codec = KvCodec::TBQ4, .name = "tbq4", .target = 0.0093, .gaussian_below = 0.05,
                                  .lower_bound_from = 128}),
    round_trip_name);

// The plain codebook (no rotation, no norm correction) on uniformly random unit vectors of R^128 gives the
// table's MSE, and 1 bit gives the paper's 0.36 (tbq has no 1-bit codec; this pins the 1-bit table).
TEST(KvTurboQuant, PlainCodebookMseOnRandomUnitVectors) {
  SeededRandom rng(5);
  const int n = 128, count = 2000;
  for (int bits = 1; bits <= 4; ++bits) {
    const LloydMaxCodebook& book = formats::lloyd_max_codebook(n, bits);
    double sum = 0;
    for (int t = 0; t < count; ++t) {
      std::vector<float> u = gaussian(rng, n);
      const double len = norm(u);
      for (float& v : u) v = float(v / len);
      for (float v : u) {
        const double e = v - book.centroids[formats::lloyd_max_index(book, v)];
        sum += e * e;
      }
    }
    EXPECT_NEAR(sum / count, book.unit_mse, 0.03 * book.unit_mse) << bits << " bits";
    if (bits == 1) {
      EXPECT_NEAR(sum / count, 0.36, 0.05 * 0.36);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Inner-product codecs: unbiased, with the variance the papers predict.

struct InnerProductStats {
  ErrorStats error;
  double normalised_by_residual = 0;  // mean of err^2 / (||q||^2 ||r||^2)
  double normalised_by_key = 0;       // mean of err^2 / (||q||^2 ||k||^2)
};

// Pairs (q, k) as for_each_correlated_pair makes them; ||r|| is read from the block (the stored residual
// norm) for the sketch codecs.
InnerProductStats inner_product_errors(const TbqCodec& c, int d, int pairs, uint64_t seed) {
  const KvCodecInfo& info = c.info();
  const KvCodecOps& ops = cpu::kv_codec_ops(info.codec);  // agrees with the reference (KvCodecContract)
  InnerProductStats stats;
  const size_t residual_norm_at = formats::turboquant::mse_block_bytes("test", d, c.mse_bits);
  for_each_correlated_pair(info, ops, d, pairs, seed,
                           [&](double err, const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<uint8_t>& block) {
                             const double qq = dot(q.data(), q.data(), d), kk = dot(k.data(), k.data(), d);
                             stats.error.add(err);
                             stats.normalised_by_key += err * err / (qq * kk) / pairs;
                             if (c.has_sketch) {
                               const double r = formats::turboquant::load_norm(block.data() + residual_norm_at);
                               stats.normalised_by_residual += err * err / (qq * r * r) / pairs;
                             }
                           });
  return stats;
}

// Unbiased: the mean error is within 3 standard errors of 0 over 100000 pairs at d = 128; the other head dims
// run fewer pairs (to keep the suite fast) and allow 3.5 standard errors (12 such checks in this file and
// kv_qjl_test.cpp; see there). Variance: the QJL lemma bounds the residual sketch's error by
// pi/(2m) ||q||^2 ||r||^2 with m = d rows, and TurboQuant's theorem 2 puts D_prod at about 0.18/d (3 bits) and
// 0.047/d (4 bits) for unit vectors; both must hold (orthogonal rows make ours smaller).
TEST(KvTurboQuant, InnerProductCodecsAreUnbiasedWithThePredictedVariance) {
  struct Case {
    int codec;            // index in kTbqCodecs
    double paper_d_prod;  // TurboQuant's D_prod * d for unit vectors
  };
  const Case cases[] = {{.codec = 3, .paper_d_prod = 0.18}, {.codec = 4, .paper_d_prod = 0.047}};
  for (const Case& cs : cases) {
    const TbqCodec& c = kTbqCodecs[cs.codec];
    for (int d : kHeadDims) {
      const int pairs = d == 128 ? 100000 : d == 64 ? 20000 : d == 256 ? 8000 : 3000;
      const InnerProductStats s = inner_product_errors(c, d, pairs, 500 + d);
      const double z = s.error.mean() / s.error.standard_error();
      std::printf("  %s d=%3d: mean error %+.5f (z %+.2f over %d pairs), E[err^2/(|q|^2|r|^2)] = %.3f/d (bound "
                  "pi/2 = 1.571/d), D_prod = %.4f/d (paper %.3f/d)\n",
                  c.info().name.data(), d, s.error.mean(), z, pairs, s.normalised_by_residual * d,
                  s.normalised_by_key * d, cs.paper_d_prod);
      EXPECT_LT(std::fabs(z), d == 128 ? 3.0 : 3.5) << c.info().name << " d=" << d;
      EXPECT_LE(s.normalised_by_residual, M_PI / (2 * d)) << c.info().name << " d=" << d;
      EXPECT_LE(s.normalised_by_key, cs.paper_d_prod / d) << c.info().name << " d=" << d;
    }
  }
}

// The same test has the power to see a bias: tbq3 (MSE only) shrinks inner products.
TEST(KvTurboQuant, MseCodecInnerProductsAreVisiblyBiased) {
  const InnerProductStats s = inner_product_errors(kTbqCodecs[1], 128, 20000, 77);
  EXPECT_LT(s.error.mean() / s.error.standard_error(), -10.0);
}

// ---------------------------------------------------------------------------------------------------------
// Optimized vs reference.

// Encodes agree byte for byte except where a coordinate lies within rounding of a Lloyd-Max boundary (then the
// codes are neighbours and the value is within 1e-5 of the boundary between them) or an fp16 norm rounds the
// other way; for the sketch codecs, a sign may differ only where the projection is within rounding of 0.
void expect_same_mse_part(const std::vector<float>& x, const std::vector<uint8_t>& ref,
                          const std::vector<uint8_t>& opt, int d, int bits, bool* identical) {
  const int n = formats::turboquant::sub_block_size(d);
  const LloydMaxCodebook& book = formats::lloyd_max_codebook(n, bits);
  std::vector<float> y(d);
  formats::hadamard_rotate(x.data(), d, y.data());
  *identical = true;
  for (int s = 0; s < d / n; ++s) {
    const uint8_t* a = ref.data() + s * formats::turboquant::sub_block_bytes(n, bits);
    const uint8_t* b = opt.data() + s * formats::turboquant::sub_block_bytes(n, bits);
    const float norm_a = formats::turboquant::load_norm(a), norm_b = formats::turboquant::load_norm(b);
    EXPECT_NEAR(norm_a, norm_b, 1e-3 * norm_a) << "sub-block " << s;
    uint8_t ca[128], cb[128];
    formats::turboquant::unpack_codes(a + 2, n, bits, ca);
    formats::turboquant::unpack_codes(b + 2, n, bits, cb);
    const double sub_norm = std::sqrt(dot(y.data() + s * n, y.data() + s * n, n));
    for (int i = 0; i < n; ++i) {
      if (ca[i] == cb[i]) continue;
      *identical = false;
      ASSERT_EQ(std::abs(ca[i] - cb[i]), 1) << "sub-block " << s << " element " << i;
      const double boundary = book.boundaries[std::min(ca[i], cb[i])];
      EXPECT_NEAR(y[s * n + i] / sub_norm, boundary, 1e-5) << "sub-block " << s << " element " << i;
    }
  }
}

template <int kMseBits, bool kHasSketch>
void expect_encodes_agree(const std::vector<float>& x, const std::vector<uint8_t>& ref,
                          const std::vector<uint8_t>& opt) {
  if (ref == opt) return;
  const int d = int(x.size());
  bool mse_identical = false;
  expect_same_mse_part(x, ref, opt, d, kMseBits, &mse_identical);
  if (!kHasSketch || !mse_identical) return;  // a different MSE code changes the whole residual
  const size_t at = formats::turboquant::mse_block_bytes("test", d, kMseBits);
  const float r = formats::turboquant::load_norm(ref.data() + at);
  EXPECT_NEAR(formats::turboquant::load_norm(opt.data() + at), r, 1e-3 * r);
  std::vector<float> y(d), y_mse(d), residual(d), sketch(d);
  formats::hadamard_rotate(x.data(), d, y.data());
  formats::turboquant::decode_rotated(ref.data(), d, kMseBits, y_mse.data());
  for (int i = 0; i < d; ++i) residual[i] = y[i] - y_mse[i];
  formats::qjl::project(residual.data(), d, d, sketch.data());
  for (int i = 0; i < d; ++i) {
    if (formats::qjl::sign_at(ref.data() + at + 2, i) != formats::qjl::sign_at(opt.data() + at + 2, i)) {
      EXPECT_LT(std::fabs(sketch[i]), 1e-4 * formats::qjl::row_norm(d) * r) << "sign " << i;
    }
  }
}

// The contract: scores and finishes within 1e-4 (float sums of rotated values), encode agreeing up to boundary
// cases (expect_encodes_agree), the other optimized ops within float summation order of the reference.
CodecCase tbq_case(KvCodec codec, const char* name, EncodeAgreement encodes_agree, int query_floats_per_dim) {
  return {.codec = codec,
          .name = name,
          .query_floats_per_dim = query_floats_per_dim,  // [R q] or [R q, S R q]
          .score_tolerance = 1e-4,
          .agreement_vectors = 12,
          .encodes_agree = encodes_agree,
          .prepared_tolerance = 1e-5,
          .score_agreement = 1e-4,
          .accumulate_agreement = 1e-4,
          .finish_agreement = 1e-4};
}

INSTANTIATE_TEST_SUITE_P(TurboQuant, KvCodecContract,
                         testing::Values(tbq_case(KvCodec::TBQ2, "tbq2", expect_encodes_agree<2, false>, 1),
                                         tbq_case(KvCodec::TBQ3, "tbq3", expect_encodes_agree<3, false>, 1),
                                         tbq_case(KvCodec::TBQ4, "tbq4", expect_encodes_agree<4, false>, 1),
                                         tbq_case(KvCodec::TBQ3P, "tbq3p", expect_encodes_agree<2, true>, 2),
                                         tbq_case(KvCodec::TBQ4P, "tbq4p", expect_encodes_agree<3, true>, 2)),
                         case_name);

}  // namespace
}  // namespace sparrow
