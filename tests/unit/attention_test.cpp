// CPU attention over the KV cache against a plain double-precision softmax attention written here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/attention.h"
#include "formats/weight_formats.h"

namespace sparrow {
namespace {

struct Case {
  int n_heads, n_kv_heads, head_dim, n_past, n_tokens, window, capacity;
  TensorType type;
};

// What the cache holds for a float vector: f16 rounds each element.
float stored(float x, TensorType type) {
  return type == TensorType::F16 ? formats::f16_to_f32(formats::f32_to_f16(x)) : x;
}

void run_case(const Case& c) {
  std::mt19937 rng(1234 + c.head_dim + c.n_tokens);
  std::normal_distribution<float> normal;
  const int n_total = c.n_past + c.n_tokens;
  const int kv_row = c.n_kv_heads * c.head_dim;
  std::vector<float> k(size_t(n_total) * kv_row), v(k.size()), q(size_t(c.n_tokens) * c.n_heads * c.head_dim);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (float& x : q) x = normal(rng);

  const size_t row_bytes = tensor_row_bytes(c.type, c.head_dim);
  std::vector<uint8_t> k_cache(size_t(c.capacity) * c.n_kv_heads * row_bytes);
  std::vector<uint8_t> v_cache(k_cache.size());
  KvLayerView kv{c.type, k_cache.data(), v_cache.data(), c.capacity, c.n_kv_heads, c.head_dim};
  // Write the history in one store and the new tokens in another, as prefill then decode would.
  if (c.n_past > 0) cpu::kv_store(kv, k.data(), v.data(), c.n_past, 0);
  cpu::kv_store(kv, k.data() + size_t(c.n_past) * kv_row, v.data() + size_t(c.n_past) * kv_row, c.n_tokens,
                c.n_past);

  std::vector<float> out(q.size());
  AttentionArgs a;
  a.q = q.data();
  a.out = out.data();
  a.n_tokens = c.n_tokens;
  a.n_heads = c.n_heads;
  a.first_position = c.n_past;
  a.sliding_window = c.window;
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.kv = kv;
  cpu::ThreadPool pool(2);
  cpu::attention(pool, a);

  const int group = c.n_heads / c.n_kv_heads;
  for (int t = 0; t < c.n_tokens; ++t) {
    const int pos = c.n_past + t;
    for (int h = 0; h < c.n_heads; ++h) {
      const float* qh = &q[(size_t(t) * c.n_heads + h) * c.head_dim];
      const int kvh = h / group;
      std::vector<double> scores;
      std::vector<int> keys;
      for (int p = 0; p <= pos; ++p) {
        if (c.window > 0 && pos - p >= c.window) continue;
        double s = 0;
        for (int i = 0; i < c.head_dim; ++i)
          s += double(qh[i]) * stored(k[size_t(p) * kv_row + kvh * c.head_dim + i], c.type);
        scores.push_back(s * a.scale);
        keys.push_back(p);
      }
      double mx = *std::max_element(scores.begin(), scores.end()), sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - mx));
      for (int i = 0; i < c.head_dim; ++i) {
        double expect = 0;
        for (size_t j = 0; j < keys.size(); ++j)
          expect += scores[j] / sum * stored(v[size_t(keys[j]) * kv_row + kvh * c.head_dim + i], c.type);
        const float got = out[(size_t(t) * c.n_heads + h) * c.head_dim + i];
        ASSERT_NEAR(got, expect, 1e-4 * (1 + std::fabs(expect)))
            << "token " << t << " head " << h << " dim " << i;
      }
    }
  }
}

TEST(Attention, CausalMultiHeadF32) { run_case({4, 4, 64, 0, 9, 0, 9, TensorType::F32}); }
TEST(Attention, GroupedQueryF16Decode) { run_case({8, 2, 128, 40, 1, 0, 41, TensorType::F16}); }
TEST(Attention, MultiQueryHeadDim256Prefill) { run_case({4, 1, 256, 5, 12, 0, 17, TensorType::F16}); }
TEST(Attention, HeadDim512) { run_case({2, 1, 512, 3, 4, 0, 7, TensorType::F32}); }
TEST(Attention, SlidingWindowMasksOldKeys) { run_case({4, 2, 64, 20, 6, 8, 26, TensorType::F32}); }
// A sliding layer's cache is a ring of window + batch slots: positions wrap around it.
TEST(Attention, SlidingWindowRingWraps) { run_case({4, 1, 64, 37, 3, 8, 11, TensorType::F16}); }

}  // namespace
}  // namespace sparrow
