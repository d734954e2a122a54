// CPU fused attention over the KV cache against a plain double-precision softmax attention written here, over
// the values the cache holds (each codec's reference encode then decode).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/attention.h"
#include "formats/kv/kv_codec.h"

namespace sparrow {
namespace {

struct Case {
  int n_heads, n_kv_heads, head_dim, n_past, n_tokens, window, capacity;
  formats::KvCodec k_codec, v_codec = k_codec;
  bool center_keys = false;
};

// What the cache holds for head vectors x[n][d]: the codec's reference encode then decode.
std::vector<float> stored(const std::vector<float>& x, int d, formats::KvCodec codec) {
  const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
  std::vector<uint8_t> block(info.block_bytes(d));
  std::vector<float> out(x.size());
  for (size_t r = 0; r < x.size() / d; ++r) {
    info.reference->encode(x.data() + r * d, d, block.data());
    info.reference->decode(block.data(), d, out.data() + r * d);
  }
  return out;
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

  const size_t slots = size_t(c.capacity) * c.n_kv_heads;
  std::vector<uint8_t> k_cache(slots * formats::kv_codec_info(c.k_codec).block_bytes(c.head_dim));
  std::vector<uint8_t> v_cache(slots * formats::kv_codec_info(c.v_codec).block_bytes(c.head_dim));
  // The KV cache sets the key center (kv_cache_test checks how); kv_store only subtracts it.
  std::vector<float> center(size_t(c.n_kv_heads) * c.head_dim, 0.0f);
  if (c.center_keys)
    for (float& x : center) x = 3.0f * normal(rng);
  KvLayerView kv{c.k_codec, c.v_codec, k_cache.data(), v_cache.data(), c.capacity, c.n_kv_heads, c.head_dim,
                 c.center_keys ? center.data() : nullptr};
  cpu::ThreadPool pool(2);
  // Write the history in one store and the new tokens in another, as prefill then decode would.
  if (c.n_past > 0) cpu::kv_store(pool, kv, k.data(), v.data(), c.n_past, 0);
  cpu::kv_store(pool, kv, k.data() + size_t(c.n_past) * kv_row, v.data() + size_t(c.n_past) * kv_row, c.n_tokens,
                c.n_past);
  // Centered keys are held as k - center (the expected scores use the uncentered keys: the shift is the same for
  // every key of a query, so the softmax must not change).
  std::vector<float> k_shifted = k;
  for (size_t r = 0; r < k.size() / c.head_dim; ++r)
    for (int i = 0; i < c.head_dim; ++i) k_shifted[r * c.head_dim + i] -= center[(r % c.n_kv_heads) * c.head_dim + i];
  std::vector<float> k_held = stored(k_shifted, c.head_dim, c.k_codec);
  for (size_t r = 0; r < k.size() / c.head_dim; ++r)
    for (int i = 0; i < c.head_dim; ++i) k_held[r * c.head_dim + i] += center[(r % c.n_kv_heads) * c.head_dim + i];
  const std::vector<float> v_held = stored(v, c.head_dim, c.v_codec);

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
          s += double(qh[i]) * k_held[size_t(p) * kv_row + kvh * c.head_dim + i];
        scores.push_back(s * a.scale);
        keys.push_back(p);
      }
      double mx = *std::max_element(scores.begin(), scores.end()), sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - mx));
      for (int i = 0; i < c.head_dim; ++i) {
        double expect = 0;
        for (size_t j = 0; j < keys.size(); ++j)
          expect += scores[j] / sum * v_held[size_t(keys[j]) * kv_row + kvh * c.head_dim + i];
        const float got = out[(size_t(t) * c.n_heads + h) * c.head_dim + i];
        ASSERT_NEAR(got, expect, 2e-4 * (1 + std::fabs(expect)))
            << "token " << t << " head " << h << " dim " << i;
      }
    }
  }
}

using formats::KvCodec;

TEST(Attention, CausalMultiHeadF32) { run_case({4, 4, 64, 0, 9, 0, 9, KvCodec::F32}); }
TEST(Attention, GroupedQueryF16Decode) { run_case({8, 2, 128, 40, 1, 0, 41, KvCodec::F16}); }
TEST(Attention, MultiQueryHeadDim256Prefill) { run_case({4, 1, 256, 5, 12, 0, 17, KvCodec::F16}); }
TEST(Attention, HeadDim512) { run_case({2, 1, 512, 3, 4, 0, 7, KvCodec::F32}); }
TEST(Attention, SlidingWindowMasksOldKeys) { run_case({4, 2, 64, 20, 6, 8, 26, KvCodec::F32}); }
// A sliding layer's cache is a ring of window + batch slots: positions wrap around it.
TEST(Attention, SlidingWindowRingWraps) { run_case({4, 1, 64, 37, 3, 8, 11, KvCodec::F16}); }
// Decode over a long context: the key range is split across threads and the partial softmaxes merged.
TEST(Attention, LongDecodeSplitsKeysTbq4) { run_case({4, 1, 256, 2000, 1, 0, 2001, KvCodec::TBQ4}); }
TEST(Attention, LongDecodeWindowedRing) { run_case({8, 2, 128, 1500, 1, 300, 333, KvCodec::Q8_0, KvCodec::Q4_0}); }
// K and V in different codecs and bases: a rotated K, a sketched K, an inner-product V.
TEST(Attention, MixedCodecsPrefill) { run_case({4, 2, 128, 30, 20, 0, 50, KvCodec::TBQ4, KvCodec::TBQ3}); }
TEST(Attention, QjlKeysPolarValues) { run_case({2, 1, 64, 70, 5, 0, 75, KvCodec::QJL, KvCodec::POLAR4}); }
// Key centering: keys stored minus a center give the attention output of the uncentered keys.
TEST(Attention, CenteredKeysLeaveTheOutputUnchanged) {
  Case c{4, 2, 128, 30, 3, 0, 33, KvCodec::F32};
  c.center_keys = true;
  run_case(c);
}
TEST(Attention, CenteredCompressedKeys) {
  Case c{4, 1, 256, 200, 1, 0, 201, KvCodec::TBQ4, KvCodec::F16};
  c.center_keys = true;
  run_case(c);
}

TEST(Attention, TrellisKeysInnerProductValues) {
  run_case({4, 4, 256, 10, 3, 0, 13, KvCodec::TCQ3, KvCodec::TBQ4P});
}

}  // namespace
}  // namespace sparrow
