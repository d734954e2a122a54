// MultiSession: sequences decoded together in shared forward passes give what each gives decoded alone (up to
// the summation order of a batched matrix product), a decode step of many sequences multiplies each weight once,
// and misuse is a clear error.
#include "runtime/multi_session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "cli_test_util.h"
#include "forwarding_backend.h"
#include "runtime/session.h"
#include "util/error.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

const fs::path& tiny_model() {
  return testing::mkmodel_once("--arch gemma4 --preset tiny-ple --type f32 --seed 9");
}

const Model& model() {
  static const std::unique_ptr<Model> m = Model::load(tiny_model().string(), ModelLoadOptions{});
  return *m;
}

int32_t argmax(const float* logits, int32_t n) { return int32_t(std::max_element(logits, logits + n) - logits); }

const std::vector<std::vector<int32_t>> kPrompts = {
    {2, 651, 1234, 77, 9}, {2, 18, 4021, 318, 66, 900, 12, 7, 3}, {2, 5}};

// Each prompt alone in a Session, then `steps` greedy tokens: the logits before every greedy choice.
std::vector<std::vector<float>> alone(const std::vector<int32_t>& prompt, int steps) {
  SessionOptions o;
  o.n_ctx = 64;
  Session s(model(), o);
  std::vector<std::vector<float>> rows;
  s.decode(prompt.data(), int32_t(prompt.size()), false);
  for (int i = 0; i < steps; ++i) {
    const float* l = s.logits(-1);
    rows.emplace_back(l, l + model().config.n_vocab);
    const int32_t next = argmax(l, model().config.n_vocab);
    s.decode(&next, 1, false);
  }
  return rows;
}

// max |a - b| / max |a|
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  return diff / scale;
}

TEST(MultiSession, SequencesDecodedTogetherMatchEachDecodedAlone) {
  constexpr int kSteps = 6;
  for (int32_t n_batch : {512, 4}) {  // 4: prompts split over passes that mix sequences
    SessionOptions o;
    o.n_ctx = 64;
    o.n_batch = n_batch;
    MultiSession multi(model(), o, 4);
    std::vector<int32_t> ids;
    std::vector<MultiSession::Step> steps;
    for (const auto& p : kPrompts) {
      ids.push_back(multi.open());
      steps.push_back({ids.back(), p});
    }
    std::vector<std::vector<std::vector<float>>> together(kPrompts.size());
    multi.decode(steps);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<int32_t> next(kPrompts.size());
      for (size_t s = 0; s < kPrompts.size(); ++s) {
        const float* l = multi.logits(ids[s]);
        together[s].emplace_back(l, l + model().config.n_vocab);
        next[s] = argmax(l, model().config.n_vocab);
      }
      std::vector<MultiSession::Step> decode;
      for (size_t s = 0; s < kPrompts.size(); ++s) decode.push_back({ids[s], std::span(&next[s], 1)});
      multi.decode(decode);
    }
    for (size_t s = 0; s < kPrompts.size(); ++s) {
      const auto reference = alone(kPrompts[s], kSteps);
      for (int step = 0; step < kSteps; ++step) {
        // The same model and positions; only batched products sum in another order.
        EXPECT_LT(relative_difference(reference[step], together[s][step]), 1e-4)
            << "n_batch " << n_batch << ", sequence " << s << ", step " << step;
        EXPECT_EQ(argmax(reference[step].data(), model().config.n_vocab),
                  argmax(together[s][step].data(), model().config.n_vocab));
      }
      EXPECT_EQ(multi.n_past(ids[s]), int32_t(kPrompts[s].size()) + kSteps);
    }
  }
}

// Counts the matrix products per weight.
class CountingBackend final : public testing::ForwardingBackend {
 public:
  explicit CountingBackend(std::map<const void*, int>& counts)
      : ForwardingBackend(make_cpu_backend(1)), counts_(counts) {}
  void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) override {
    ++counts_[w.data];
    inner().matmul(w, x, n, y);
  }

 private:
  std::map<const void*, int>& counts_;
};

TEST(MultiSession, ADecodeStepOfManySequencesMultipliesEachWeightOnce) {
  std::map<const void*, int> counts;
  SessionOptions o;
  o.n_ctx = 32;
  o.make_backend = [&] { return std::make_unique<CountingBackend>(counts); };
  MultiSession multi(model(), o, 8);
  std::vector<MultiSession::Step> steps;
  std::vector<int32_t> token(8, 17);
  for (int i = 0; i < 8; ++i) steps.push_back({multi.open(), std::span(&token[size_t(i)], 1)});
  counts.clear();
  multi.decode(steps);
  ASSERT_FALSE(counts.empty());
  for (const auto& [weight, n] : counts) EXPECT_EQ(n, 1) << "a weight was multiplied " << n << " times";
}

TEST(MultiSession, MisuseIsAClearError) {
  SessionOptions o;
  o.n_ctx = 8;
  MultiSession multi(model(), o, 2);
  const int32_t a = multi.open();
  const int32_t b = multi.open();
  EXPECT_THROW(multi.open(), Error);  // both slots taken
  const std::vector<int32_t> two = {2, 5}, nine(9, 5), bad = {2, model().config.n_vocab};
  EXPECT_THROW(multi.decode(std::vector<MultiSession::Step>{{a, two}, {a, two}}), Error);  // a twice
  EXPECT_THROW(multi.decode(std::vector<MultiSession::Step>{{7, two}}), Error);            // not open
  EXPECT_THROW(multi.decode(std::vector<MultiSession::Step>{{a, nine}}), Error);           // past n_ctx
  EXPECT_THROW(multi.decode(std::vector<MultiSession::Step>{{a, bad}}), Error);            // not a token
  EXPECT_THROW(multi.decode(std::vector<MultiSession::Step>{{a, {}}}), Error);             // no tokens
  EXPECT_THROW(multi.logits(a), Error);                                                    // nothing decoded
  EXPECT_EQ(multi.n_past(a), 0);  // a refused step changes nothing

  const size_t two_caches = multi.kv_bytes();
  multi.close(b);
  EXPECT_EQ(multi.kv_bytes(), two_caches / 2);
  EXPECT_THROW(multi.close(b), Error);
  EXPECT_EQ(multi.open(), b);  // the id is reused, with an empty cache
  EXPECT_EQ(multi.n_past(b), 0);
}

}  // namespace
}  // namespace sparrow
