// Device sampling against the CPU sampler (src/runtime/sampler.cpp): for the same logits and the same uniform
// draw both must pick the same token, over many seeds, vocabulary sizes and settings, including ties and
// masked (-inf) logits; greedy against the CPU's argmax.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "runtime/sampler.h"
#include "util/error.h"

namespace sparrow {
namespace {

// Logits ~ N(0, spread); with `step` > 0 rounded to multiples of it, so that many logits are equal.
std::vector<float> random_logits(int32_t n, uint32_t seed, float spread, float step = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> logits(n);
  for (float& x : logits) {
    x = dist(rng);
    if (step > 0) x = std::round(x / step) * step;
  }
  return logits;
}

class CudaSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    SPARROW_REQUIRE_GPU();
    backend_ = std::make_unique<CudaBackend>(0);
  }
  const float* upload(const std::vector<float>& logits) {
    float* p = backend_->alloc(logits.size());
    backend_->write(p, logits.data(), logits.size());
    return p;
  }
  // Samples `draws` times with fresh draws from a CPU sampler seeded `seed`; the GPU must agree every time.
  void expect_agreement(const std::vector<float>& logits, const SamplerOptions& options, int draws) {
    const float* device_logits = upload(logits);
    Sampler cpu(options);
    const SamplingParams params{options.temperature, options.top_k, options.top_p, options.min_p};
    const int32_t n = int32_t(logits.size());
    for (int d = 0; d < draws; ++d) {
      const float u = cpu.next_uniform();
      const int32_t want = cpu.sample_with(logits.data(), n, u);
      ASSERT_EQ(backend_->sample(device_logits, n, params, u), want)
          << "u " << u << ", temperature " << options.temperature << ", top-k " << options.top_k << ", top-p "
          << options.top_p << ", min-p " << options.min_p << ", vocabulary " << n;
    }
    backend_->free_buffer(const_cast<float*>(device_logits));
  }
  std::unique_ptr<CudaBackend> backend_;
};

TEST_F(CudaSampling, GreedyIsTheArgmaxWithTheLowestIdOnTies) {
  const SamplingParams greedy{0.0f, 40, 0.95f, 0.05f};
  for (int32_t n : {1, 1000, 262144}) {
    std::vector<float> logits = random_logits(n, uint32_t(n), 3.0f);
    EXPECT_EQ(backend_->sample(upload(logits), n, greedy, 0.5f), Sampler::argmax(logits.data(), n));
    if (n < 1000) continue;
    logits[n / 3] = logits[n - 1] = 100.0f;  // a tie for the top: the lower id wins
    EXPECT_EQ(backend_->sample(upload(logits), n, greedy, 0.5f), n / 3);
  }
  std::vector<float> equal(5000, -1.5f);
  EXPECT_EQ(backend_->sample(upload(equal), 5000, greedy, 0.0f), 0);
  std::vector<float> signed_zeros = {-1.0f, -0.0f, 0.0f};  // -0 and +0 are equal logits: the lower id
  EXPECT_EQ(backend_->sample(upload(signed_zeros), 3, greedy, 0.0f), 1);
}

TEST_F(CudaSampling, AgreesWithTheCpuSamplerAcrossSettings) {
  const std::vector<SamplerOptions> settings = {
      {0.8f, 40, 0.95f, 0.05f, 1},    // the defaults
      {1.0f, 1, 1.0f, 0.0f, 2},       // top-k 1
      {1.5f, 100, 1.0f, 0.0f, 3},     // top-k only, hot
      {0.5f, 4096, 0.9f, 0.0f, 4},    // the largest top-k radix selection takes
      {1.0f, 4097, 0.99f, 0.01f, 5},  // one more: the whole-vocabulary sort
      {1.0f, 0, 0.5f, 0.0f, 6},       // no top-k, top-p
      {0.7f, 0, 1.0f, 0.1f, 7},       // no top-k, min-p
      {2.0f, 0, 1.0f, 0.0f, 8},       // plain temperature over everything
  };
  for (int32_t n : {50, 5000, 262144}) {
    for (const SamplerOptions& options : settings) {
      for (uint32_t seed = 0; seed < (n > 100000 ? 3u : 8u); ++seed) {
        SamplerOptions seeded = options;
        seeded.seed = options.seed * 1000 + seed;
        expect_agreement(random_logits(n, seed * 7 + uint32_t(n), seed % 2 ? 1.0f : 4.0f), seeded, 12);
      }
    }
  }
}

TEST_F(CudaSampling, AgreesOnTiesAtTheTopKBoundary) {
  // Coarse logits: thousands of equal values around the k-th largest, so selection must order equal logits by
  // id; the last case has more equal logits at the boundary than radix selection gathers at once.
  for (float step : {0.5f, 0.25f}) {
    for (int32_t k : {10, 40, 1000}) {
      expect_agreement(random_logits(262144, uint32_t(k), 1.0f, step), {1.0f, k, 0.95f, 0.0f, uint64_t(k)}, 10);
    }
  }
  std::vector<float> flat(20000, 0.25f);
  expect_agreement(flat, {1.0f, 100, 1.0f, 0.0f, 9}, 20);
  // All equal, uniform over ids 0..99: u = 0.5 lands on id 50.
  const SamplingParams params{1.0f, 100, 1.0f, 0.0f};
  EXPECT_EQ(backend_->sample(upload(flat), 20000, params, 0.5f), 50);
}

TEST_F(CudaSampling, NeverPicksMaskedLogits) {
  std::vector<float> logits = random_logits(262144, 77, 2.0f);
  for (size_t i = 0; i < logits.size(); i += 2) logits[i] = -std::numeric_limits<float>::infinity();
  expect_agreement(logits, {1.0f, 0, 1.0f, 0.0f, 10}, 10);
  expect_agreement(logits, {1.0f, 40, 0.95f, 0.05f, 11}, 10);
  const float* device_logits = upload(logits);
  Sampler draws({1.0f, 0, 1.0f, 0.0f, 12});
  for (int d = 0; d < 20; ++d)
    EXPECT_EQ(backend_->sample(device_logits, 262144, {3.0f, 0, 1.0f, 0.0f}, draws.next_uniform()) % 2, 1);
}

TEST_F(CudaSampling, BadArgumentsAreErrors) {
  const float* logits = upload(random_logits(100, 1, 1.0f));
  const SamplingParams params{1.0f, 40, 0.95f, 0.05f};
  EXPECT_THROW(backend_->sample(logits, 100, params, 1.0f), Error);
  EXPECT_THROW(backend_->sample(logits, 100, params, -0.5f), Error);
  EXPECT_THROW(backend_->sample(logits, 0, params, 0.5f), Error);
  const SamplingParams not_a_number{std::nanf(""), 40, 0.95f, 0.05f};
  EXPECT_THROW(backend_->sample(logits, 100, not_a_number, 0.5f), Error);
}

}  // namespace
}  // namespace sparrow
