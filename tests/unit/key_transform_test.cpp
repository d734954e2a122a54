// Calibrated key transforms (model/key_transform.h): the matrix powers, the statistics (RoPE undone,
// keys weighted by the attention they receive, couplings averaged over positions), the transform's optimality
// and exactness, its file and loading (errors included), and `sparrow calibrate-keys`.
#include "model/key_transform.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "cli_test_util.h"
#include "key_transform_test_util.h"
#include "runtime/backends.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "util/error.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;
using testing::cplx;
using testing::random_transforms;
using testing::real_layout;

std::vector<double> product(const std::vector<double>& a, const std::vector<double>& b, int n) {
  std::vector<double> c(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j) c[size_t(i) * n + j] += a[size_t(i) * n + k] * b[size_t(k) * n + j];
  return c;
}

double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

std::vector<double> identity(int n) {
  std::vector<double> m(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i) m[size_t(i) * n + i] = 1;
  return m;
}

std::vector<double> random_spd(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> b(size_t(n) * n);
  for (double& x : b) x = normal(rng);
  std::vector<double> s(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < n; ++k) s[size_t(i) * n + j] += b[size_t(i) * n + k] * b[size_t(j) * n + k];
      if (i == j) s[size_t(i) * n + j] += 0.5;
    }
  return s;
}

// A head vector from its pairs z rotated to `position` as RoPE rotates them (pair p: elements p and p + h).
std::vector<float> rotated(const std::vector<cplx>& z, const std::vector<double>& freq, int position) {
  const int h = int(z.size());
  std::vector<float> x(size_t(2 * h));
  for (int p = 0; p < h; ++p) {
    const cplx r = z[size_t(p)] * std::polar(1.0, freq[size_t(p)] * position);
    x[size_t(p)] = float(r.real());
    x[size_t(p + h)] = float(r.imag());
  }
  return x;
}

TEST(KeyTransform, PsdPowerOfAKnownMatrix) {
  // [[2, 1], [1, 2]] = V diag(1, 3) V^T with V's columns (1, -1) / sqrt 2 and (1, 1) / sqrt 2.
  const double r = std::sqrt(3.0);
  const std::vector<double> half = psd_power(std::vector<double>{2, 1, 1, 2}, 2, 0.5);
  EXPECT_LT(max_abs_difference(half, {(1 + r) / 2, (r - 1) / 2, (r - 1) / 2, (1 + r) / 2}), 1e-14);
  // Eigenvalues below zero count as zero: [[0, 1], [1, 0]] (eigenvalues -1, 1) to the power 1 is its PSD part.
  EXPECT_LT(max_abs_difference(psd_power(std::vector<double>{0, 1, 1, 0}, 2, 1.0), {0.5, 0.5, 0.5, 0.5}), 1e-14);
}

TEST(KeyTransform, PsdPowersComposeAsPowers) {
  const int n = 24;
  const std::vector<double> s = random_spd(n, 5);
  const std::vector<double> half = psd_power(s, n, 0.5), inverse_half = psd_power(s, n, -0.5);
  EXPECT_LT(max_abs_difference(product(half, half, n), s), 1e-9);
  EXPECT_LT(max_abs_difference(product(product(inverse_half, s, n), inverse_half, n), identity(n)), 1e-8);
}

TEST(KeyTransform, BadInputIsRefused) {
  EXPECT_THROW(psd_power(std::vector<double>{1, 2, 3, 4}, 2, 0.5), Error);  // not symmetric
  EXPECT_THROW(psd_power(std::vector<double>{1, 2, 3}, 2, 0.5), Error);     // not 2 x 2
  EXPECT_THROW(psd_power(std::vector<double>{1, NAN, NAN, 1}, 2, 0.5), Error);  // not finite
  EXPECT_THROW(psd_power(std::vector<double>{1, 0, 0, 0}, 2, -0.5), Error);  // singular
  EXPECT_THROW(KeyStatistics(4, {1.0}), Error);                              // 2 pairs, 1 frequency
  KeyStatistics stats(4, {1.0, 0.1});
  EXPECT_THROW(solve_key_transform(stats, 64, 1e-2), Error);  // nothing gathered
  stats.begin_sequence();
  EXPECT_THROW(stats.add_keys(std::vector<float>(7), 2, 1, 0), Error);  // too short
  EXPECT_THROW(stats.add_keys(std::vector<float>(8), 2, 1, 3), Error);  // not in order
  stats.add_keys(std::vector<float>(8), 2, 1, 0);
  EXPECT_THROW(stats.add_queries(std::vector<float>(16), 2, 2, 1, 1.0f, 0, 1), Error);  // ahead of the keys
  EXPECT_THROW(rope_pair_frequencies(7, 10000, 1, {}), Error);
}

// The frequencies are those the rope op turns each pair by: rotate (1, 0) pairs on the CPU backend and read the
// angles back.
TEST(KeyTransform, PairFrequenciesAreTheRopeOpsOwn) {
  const int d = 16, h = 8, position = 37;
  const std::vector<float> divisors = {1, 1, 2, 3, 1e30f, 1, 5, 1};
  for (bool proportional : {false, true}) {
    std::unique_ptr<Backend> cpu = make_backend(Device::Cpu, 1);
    std::vector<float> x(size_t(d), 0.0f);
    for (int p = 0; p < h; ++p) x[size_t(p)] = 1.0f;
    RopeParams rope;
    rope.n_rot = d;
    rope.freq_base = 10000.0f;
    rope.freq_scale = 0.5f;
    rope.freq_divisors = proportional ? divisors.data() : nullptr;
    cpu->rope(x.data(), 1, 1, d, position, rope);
    const std::vector<double> w =
        rope_pair_frequencies(d, 10000.0, 0.5, proportional ? std::span<const float>(divisors) : std::span<const float>());
    for (int p = 0; p < h; ++p) {
      EXPECT_NEAR(x[size_t(p)], std::cos(w[size_t(p)] * position), 2e-5) << "pair " << p;
      EXPECT_NEAR(x[size_t(p + h)], std::sin(w[size_t(p)] * position), 2e-5) << "pair " << p;
    }
  }
}

// One pair that does not rotate (frequency 0), two tokens, one head, no centering (fewer than
// kKeyCenterMinTokens): query 0 sees key 0 alone, query 1 both, with softmax weights worked out by hand.
TEST(KeyTransform, KeysAreWeightedByTheAttentionTheyReceive) {
  const std::vector<float> q = {1, 0, 0, 2};  // q0 = (1, 0), q1 = (0, 2)
  const std::vector<float> k = {1, 1, 0, 1};  // k0 = (1, 1), k1 = (0, 1): |z|^2 = 2 and 1
  for (int window : {0, 1}) {
    KeyStatistics stats(2, {0.0});
    stats.begin_sequence();
    stats.add_keys(k, 2, 1, 0);
    stats.add_queries(q, 2, 1, 0, 0.5f, window, 1);
    stats.end_sequence();
    // Query 1's scores are 0.5 * 2 = 1 for both keys: 1/2 each, so key 0 receives 1.5 and key 1 0.5; with a
    // window of 1 each key receives 1. The pair's moment is then the weighted mean of |z|^2.
    const double key_moment = window == 0 ? (1.5 * 2 + 0.5 * 1) / 2 : (2.0 + 1.0) / 2;
    EXPECT_LT(max_abs_difference(averaged_key_moments(stats, 8), {key_moment, 0, 0, key_moment}), 1e-12);
    EXPECT_LT(max_abs_difference(averaged_query_moments(stats, 8), {2.5, 0, 0, 2.5}), 1e-12);
    EXPECT_EQ(stats.n_queries(), 2);
  }
}

// Keys that are one vector before RoPE, seen at positions 0..11 after it: the statistics undo the rotation and
// average each coupling over the positions of the context, (exp(i D L) - 1) / (i D L) for frequencies D apart.
TEST(KeyTransform, MomentsAreThoseBeforeRopeAveragedOverTheContext) {
  const int h = 3, d = 2 * h;
  const std::vector<double> freq = {0.9, 0.2, 0.2};
  const std::vector<cplx> z = {{1, 2}, {0.5, -1}, {-0.3, 0.4}};
  KeyStatistics stats(d, freq);
  stats.begin_sequence();
  for (int first = 0; first < 12; first += 4) {  // batches of 4: below kKeyCenterMinTokens, so no centering
    std::vector<float> k, q;
    for (int t = first; t < first + 4; ++t) {
      const std::vector<float> x = rotated(z, freq, t);
      k.insert(k.end(), x.begin(), x.end());
      q.insert(q.end(), x.begin(), x.end());
    }
    stats.add_keys(k, 4, 1, first);
    stats.add_queries(q, 4, 1, first, 0.1f, 0, 1);
  }
  stats.end_sequence();
  for (double context : {1.0, 50.0, 4096.0}) {
    std::vector<cplx> expected(size_t(h) * h);
    for (int p = 0; p < h; ++p)
      for (int r = 0; r < h; ++r) {
        const double x = (freq[size_t(p)] - freq[size_t(r)]) * context;
        const cplx mean = x == 0 ? cplx(1, 0) : (std::exp(cplx(0, x)) - 1.0) / cplx(0, x);
        expected[size_t(p) * h + r] = z[size_t(p)] * std::conj(z[size_t(r)]) * mean;
      }
    EXPECT_LT(max_abs_difference(averaged_key_moments(stats, context), real_layout(expected, h)), 1e-5)
        << "context " << context;
    EXPECT_LT(max_abs_difference(averaged_query_moments(stats, context), real_layout(expected, h)), 1e-5);
  }
  // Pairs 1 and 2 turn together: their coupling survives any context; pairs 0 and 1 part within a few positions.
  const std::vector<double> long_context = averaged_key_moments(stats, 4096);
  EXPECT_NEAR(long_context[size_t(1) * d + 2], (z[1] * std::conj(z[2])).real(), 1e-5);
  EXPECT_LT(std::abs(long_context[size_t(0) * d + 1]), 1e-3 * std::norm(z[0]));
}

// Random queries and keys, anisotropic and coupled across pairs, in batches of 16 at positions 0..127.
KeyStatistics random_statistics(int d, uint32_t seed) {
  const int h = d / 2, n_heads = 2;
  const std::vector<double> freq = rope_pair_frequencies(d, 10000.0, 1.0, {});
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<cplx> mix(size_t(h) * h);  // keys: a fixed complex mixing of independent pairs
  for (cplx& m : mix) m = cplx(normal(rng), normal(rng)) * 0.3;
  KeyStatistics stats(d, freq);
  stats.begin_sequence();
  for (int first = 0; first < 128; first += 16) {
    std::vector<float> k, q;
    for (int t = first; t < first + 16; ++t) {
      std::vector<cplx> zk(static_cast<size_t>(h)), zq(static_cast<size_t>(h));
      for (int p = 0; p < h; ++p) zk[size_t(p)] = cplx(normal(rng), normal(rng)) * std::exp(-0.4 * p);
      for (int p = 0; p < h; ++p)
        for (int r = 0; r < h; ++r) zk[size_t(p)] += mix[size_t(p) * h + r] * zk[size_t(r)] * 0.5;
      const std::vector<float> xk = rotated(zk, freq, t);
      k.insert(k.end(), xk.begin(), xk.end());
      for (int head = 0; head < n_heads; ++head) {
        for (int p = 0; p < h; ++p) zq[size_t(p)] = cplx(normal(rng), normal(rng)) * (1.0 + p);
        const std::vector<float> xq = rotated(zq, freq, t);
        q.insert(q.end(), xq.begin(), xq.end());
      }
    }
    stats.add_keys(k, 16, 1, first);
    stats.add_queries(q, 16, n_heads, first, 0.2f, 0, 1);
  }
  stats.end_sequence();
  return stats;
}

// tr(M^-1 Sq) tr(M Sk), the cost of a key transform with A^T A = M, on the solver's regularized moments.
double cost_of(const std::vector<double>& m, const std::vector<double>& sq, const std::vector<double>& sk, int d) {
  const std::vector<double> m_inv = psd_power(m, d, -1.0);
  double a = 0, b = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      a += m_inv[size_t(i) * d + j] * sq[size_t(j) * d + i];
      b += m[size_t(i) * d + j] * sk[size_t(j) * d + i];
    }
  return a * b;
}

std::vector<double> regularized(std::vector<double> s, int d, double ridge) {
  double trace = 0;
  for (int i = 0; i < d; ++i) trace += s[size_t(i) * d + i];
  for (double& x : s) x *= d / trace;
  for (int i = 0; i < d; ++i) s[size_t(i) * d + i] += ridge;
  return s;
}

TEST(KeyTransform, SolvedTransformIsAnExactComplexLinearMapThatMinimizesTheCost) {
  const int d = 16, h = 8;
  const double context = 128, ridge = 1e-2;
  const KeyStatistics stats = random_statistics(d, 11);
  const KeyTransform t = solve_key_transform(stats, context, ridge);
  ASSERT_EQ(t.head_dim, d);
  std::vector<double> key(t.key.begin(), t.key.end()), query(t.query.begin(), t.query.end());
  EXPECT_LT(max_abs_difference(product(key, query, d), identity(d)), 1e-4);  // scores unchanged
  for (int p = 0; p < h; ++p)
    for (int r = 0; r < h; ++r) {  // [[Re, -Im], [Im, Re]], and symmetric
      EXPECT_NEAR(key[size_t(p) * d + r], key[size_t(p + h) * d + r + h], 1e-5);
      EXPECT_NEAR(key[size_t(p) * d + r + h], -key[size_t(p + h) * d + r], 1e-5);
      EXPECT_NEAR(key[size_t(p) * d + r], key[size_t(r) * d + p], 1e-5);
    }
  const std::vector<double> sq = regularized(averaged_query_moments(stats, context), d, ridge);
  const std::vector<double> sk = regularized(averaged_key_moments(stats, context), d, ridge);
  const std::vector<double> m = product(key, key, d);  // A^T A with A symmetric
  const double best = cost_of(m, sq, sk, d);
  EXPECT_LT(best, 0.9 * cost_of(identity(d), sq, sk, d));
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  for (int trial = 0; trial < 20; ++trial) {  // M + e P for random small symmetric P costs more
    std::vector<double> p = random_spd(d, uint32_t(100 + trial)), n(size_t(d) * d);
    const double e = 0.02 * (trial % 2 ? 1 : -1) / 16;
    for (size_t i = 0; i < n.size(); ++i) n[i] = m[i] + e * (p[i] - (i % (d + 1) == 0 ? 8.0 : 0.0));
    EXPECT_GE(cost_of(n, sq, sk, d), best * (1 - 1e-9)) << "trial " << trial;
  }
  // The gain the solver reports is that cost's, against no transform.
  EXPECT_NEAR(t.predicted_gain, cost_of(identity(d), sq, sk, d) / best, 1e-4 * t.predicted_gain);
}

// ---- the transforms in the model ----

const fs::path& tiny_model() {
  return testing::mkmodel_once("--arch gemma4 --preset tiny-ple --type f32 --seed 21");
}

std::unique_ptr<Model> load(const fs::path& model, const std::string& transforms) {
  ModelLoadOptions o;
  o.key_transforms = transforms;
  return Model::load(model.string(), o);
}

std::vector<float> logits(const Model& model, formats::KvCodec k_codec, KeyBalancing balance) {
  SessionOptions o;
  o.n_ctx = 64;
  o.n_batch = 8;  // a prompt of several batches: decode steps read keys stored through the transform
  o.n_threads = 1;
  o.k_codec = k_codec;
  o.v_codec = formats::KvCodec::F32;
  o.balance_keys = balance;
  Session s(model, o);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back(2 + (i * 37) % 200);
  s.decode(tokens.data(), int32_t(tokens.size()), true);
  const int32_t n_vocab = model.config.n_vocab;
  return std::vector<float>(s.logits(0), s.logits(0) + size_t(tokens.size()) * n_vocab);
}

fs::path transforms_for(const fs::path& model_path, const std::string& name, uint64_t fingerprint_offset = 0) {
  const std::unique_ptr<Model> model = load(model_path, "off");
  const fs::path out = testing::scratch_dir() / name;
  write_key_transform_file(out.string(), random_transforms(*model, model->fingerprint() + fingerprint_offset));
  return out;
}

TEST(KeyTransformModel, TransformsLeaveTheModelsOutputUnchanged) {
  const fs::path transforms = transforms_for(tiny_model(), "exact.key-transforms.gguf");
  const std::unique_ptr<Model> plain = load(tiny_model(), "off");
  const std::unique_ptr<Model> transformed = load(tiny_model(), transforms.string());
  EXPECT_NE(transformed->describe_key_transforms().find("layers, calibrated on 64 tokens of random"), std::string::npos)
      << transformed->describe_key_transforms();
  EXPECT_TRUE(plain->describe_key_transforms().empty());
  const std::vector<float> reference = logits(*plain, formats::KvCodec::F32, KeyBalancing::Off);
  // f32 keys stored through the transforms (balancing forced on, which the transforms take the place of): every
  // score is the same up to float rounding. This random model amplifies rounding (the balanced gains, an exact
  // rescaling too, move its logits by about 4e-4 of their peak), so that is the yardstick; a wrong transform
  // moves them by the order of the logits themselves.
  const std::vector<float> through = logits(*transformed, formats::KvCodec::F32, KeyBalancing::On);
  const std::vector<float> gains = logits(*plain, formats::KvCodec::F32, KeyBalancing::On);
  float peak = 0, worst = 0, gains_worst = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    peak = std::max(peak, std::abs(reference[i]));
    worst = std::max(worst, std::abs(reference[i] - through[i]));
    gains_worst = std::max(gains_worst, std::abs(reference[i] - gains[i]));
  }
  EXPECT_LT(worst, 2 * gains_worst + 1e-4f * peak) << "max|diff| " << worst << ", balanced gains' " << gains_worst;
  EXPECT_LT(worst, 2e-3f * peak) << "max|diff| " << worst << " of max|logit| " << peak;
  EXPECT_GT(worst, 0.0f) << "the transforms were not applied";
  // Without balancing the transforms are not used at all: the same bits as the model without them.
  EXPECT_EQ(logits(*transformed, formats::KvCodec::F32, KeyBalancing::Off), reference);
  // A low-bit K codec stores the transformed keys: another rounding, so other logits than the balanced gains'.
  EXPECT_NE(logits(*transformed, formats::KvCodec::TBQ4, KeyBalancing::Auto),
            logits(*plain, formats::KvCodec::TBQ4, KeyBalancing::Auto));
}

TEST(KeyTransformModel, FileBesideTheModelIsFoundAndOffTurnsItOff) {
  const fs::path dir = testing::scratch_dir() / "beside";
  fs::create_directories(dir);
  const fs::path model = dir / "tiny.gguf";
  fs::copy_file(tiny_model(), model, fs::copy_options::overwrite_existing);
  EXPECT_EQ(key_transform_path_beside(model.string()), (dir / "tiny.key-transforms.gguf").string());
  EXPECT_TRUE(load(model, "auto")->describe_key_transforms().empty());  // none there yet
  fs::copy_file(transforms_for(tiny_model(), "beside.key-transforms.gguf"), dir / "tiny.key-transforms.gguf",
                fs::copy_options::overwrite_existing);
  EXPECT_FALSE(load(model, "auto")->describe_key_transforms().empty());
  EXPECT_TRUE(load(model, "off")->describe_key_transforms().empty());
}

void expect_load_error(const fs::path& transforms, const std::string& message) {
  try {
    load(tiny_model(), transforms.string());
    ADD_FAILURE() << transforms << " loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(KeyTransformModel, WrongOrBrokenFilesAreClearErrors) {
  expect_load_error(transforms_for(tiny_model(), "other.key-transforms.gguf", 1), "calibrated on another model");
  expect_load_error(tiny_model(), "not a key-transform file");  // a model, not transforms
  expect_load_error(testing::scratch_dir() / "missing.gguf", "missing.gguf");
  // A layer's tensor missing, or of the wrong size.
  const std::unique_ptr<Model> model = load(tiny_model(), "off");
  KeyTransformFile f = random_transforms(*model, model->fingerprint());
  for (KeyTransform& t : f.layers)
    if (t.head_dim) {
      t = {};
      break;
    }
  const fs::path missing_layer = testing::scratch_dir() / "missing-layer.key-transforms.gguf";
  write_key_transform_file(missing_layer.string(), f);
  expect_load_error(missing_layer, "key_transform");
  const fs::path garbage = testing::scratch_dir() / "garbage.key-transforms.gguf";
  std::ofstream(garbage) << "GGUF but not really";
  expect_load_error(garbage, "garbage.key-transforms.gguf");
}

TEST(KeyTransformModel, SavedStateIsRefusedWithOtherTransforms) {
  const fs::path transforms = transforms_for(tiny_model(), "state.key-transforms.gguf");
  const std::unique_ptr<Model> transformed = load(tiny_model(), transforms.string());
  const std::unique_ptr<Model> plain = load(tiny_model(), "off");
  SessionOptions o;
  o.n_ctx = 32;
  o.n_threads = 1;
  o.k_codec = formats::KvCodec::TBQ4;
  o.v_codec = formats::KvCodec::F16;
  const std::vector<int32_t> tokens = {2, 40, 41, 42, 43, 44, 45, 46, 47, 48};
  const fs::path state = testing::scratch_dir() / "transformed.state";
  {
    Session s(*transformed, o);
    s.decode(tokens.data(), int32_t(tokens.size()), false);
    s.save_state(state.string(), tokens);
  }
  Session again(*transformed, o);
  EXPECT_EQ(again.restore_state(state.string()), tokens);
  Session other(*plain, o);
  try {
    other.restore_state(state.string());
    ADD_FAILURE() << "a state stored through key transforms loaded without them";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key transforms"), std::string::npos) << e.what();
  }
}

// ---- sparrow calibrate-keys ----

fs::path calibration_text() {
  const fs::path p = testing::scratch_dir() / "calibration.txt";
  std::ofstream out(p);
  for (int i = 0; i < 60; ++i)
    out << "The quick brown fox " << i << " jumps over the lazy dog, and the river runs past the old mill.\n";
  return p;
}

TEST(CalibrateKeys, WritesTransformsTheModelLoads) {
  const fs::path out = testing::scratch_dir() / "calibrated.key-transforms.gguf";
  const testing::CommandResult r =
      testing::run_sparrow("calibrate-keys -m " + tiny_model().string() + " -f " + calibration_text().string() +
                           " -c 64 --chunks 2 -t 1 --from 0.25 -o " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("predicted score-error variance"), std::string::npos) << r.out;
  const std::unique_ptr<Model> model = load(tiny_model(), out.string());
  EXPECT_NE(model->describe_key_transforms().find("128 tokens of calibration.txt from 0.25"), std::string::npos)
      << model->describe_key_transforms();
  // The tools load it too, and say so.
  const testing::CommandResult run = testing::run_sparrow("run -m " + tiny_model().string() + " --key-transforms " +
                                                          out.string() + " -p hello -n 3 -ctk tbq4 -t 1");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("key transforms: "), std::string::npos) << run.err;
}

TEST(CalibrateKeys, BadArgumentsAreClearErrors) {
  const std::string model = " -m " + tiny_model().string();
  const testing::CommandResult from = testing::run_sparrow("calibrate-keys" + model + " -f " +
                                                           calibration_text().string() + " --from 1.5");
  EXPECT_NE(from.exit_code, 0);
  EXPECT_NE(from.err.find("--from"), std::string::npos) << from.err;
  const testing::CommandResult short_text = testing::run_sparrow("calibrate-keys" + model + " -f " +
                                                                 calibration_text().string() + " -c 100000");
  EXPECT_NE(short_text.exit_code, 0);
  EXPECT_NE(short_text.err.find("fewer than one chunk"), std::string::npos) << short_text.err;
  const testing::CommandResult no_file =
      testing::run_sparrow("calibrate-keys" + model + " -f " + (testing::scratch_dir() / "none.txt").string());
  EXPECT_NE(no_file.exit_code, 0);
  EXPECT_NE(no_file.err.find("cannot open"), std::string::npos) << no_file.err;
}

}  // namespace
}  // namespace sparrow
