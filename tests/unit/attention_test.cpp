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
  int n_heads, n_kv_heads, head_dim;
  int n_past, n_tokens;  // tokens already cached, tokens stored and attended now
  int window = 0;        // sliding window in tokens (0: global attention)
  int capacity;          // cache slots per KV head
  formats::KvCodec k_codec, v_codec = k_codec;
  bool center_keys = false;
  // Protected positions (KvLayerView::protects): the first `sinks` and each query's `recent` most recent ones
  // in protected_codec; off when both are 0. The window ring holds recent + n_tokens slots.
  int sinks = 0, recent = 0;
  formats::KvCodec protected_codec = formats::KvCodec::F16;
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
  KvLayerView kv{.k_codec = c.k_codec,
                 .v_codec = c.v_codec,
                 .k = k_cache.data(),
                 .v = v_cache.data(),
                 .capacity = c.capacity,
                 .n_kv_heads = c.n_kv_heads,
                 .head_dim = c.head_dim,
                 .k_center = c.center_keys ? center.data() : nullptr};
  const bool protects = c.sinks > 0 || c.recent > 0;
  const int64_t window_capacity = c.recent + c.n_tokens;
  const size_t protected_bytes = size_t(c.sinks + window_capacity) * c.n_kv_heads *
                                 formats::kv_codec_info(c.protected_codec).block_bytes(c.head_dim);
  std::vector<uint8_t> protected_k(protected_bytes), protected_v(protected_bytes);
  if (protects) {
    kv.sinks = c.sinks;
    kv.window = c.recent;
    kv.protected_codec = c.protected_codec;
    kv.protected_k = protected_k.data();
    kv.protected_v = protected_v.data();
    kv.window_capacity = window_capacity;
  }
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
  // The protected positions' copies: the same centered keys and the values through the protected codec.
  std::vector<float> k_protected = stored(k_shifted, c.head_dim, c.protected_codec);
  for (size_t r = 0; r < k.size() / c.head_dim; ++r)
    for (int i = 0; i < c.head_dim; ++i)
      k_protected[r * c.head_dim + i] += center[(r % c.n_kv_heads) * c.head_dim + i];
  const std::vector<float> v_protected = stored(v, c.head_dim, c.protected_codec);

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
      std::vector<bool> from_protected;
      for (int p = 0; p <= pos; ++p) {
        if (c.window > 0 && pos - p >= c.window) continue;
        from_protected.push_back(protects && (p < c.sinks || pos - p < c.recent));
        const std::vector<float>& kh = from_protected.back() ? k_protected : k_held;
        double s = 0;
        for (int i = 0; i < c.head_dim; ++i)
          s += double(qh[i]) * kh[size_t(p) * kv_row + kvh * c.head_dim + i];
        scores.push_back(s * a.scale);
        keys.push_back(p);
      }
      double mx = *std::max_element(scores.begin(), scores.end()), sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - mx));
      for (int i = 0; i < c.head_dim; ++i) {
        double expect = 0;
        for (size_t j = 0; j < keys.size(); ++j)
          expect += scores[j] / sum *
                    (from_protected[j] ? v_protected : v_held)[size_t(keys[j]) * kv_row + kvh * c.head_dim + i];
        const float got = out[(size_t(t) * c.n_heads + h) * c.head_dim + i];
        ASSERT_NEAR(got, expect, 2e-4 * (1 + std::fabs(expect)))
            << "token " << t << " head " << h << " dim " << i;
      }
    }
  }
}

using formats::KvCodec;

TEST(Attention, CausalMultiHeadF32) {
  run_case({.n_heads = 4, .n_kv_heads = 4, .head_dim = 64, .n_past = 0,
            .n_tokens = 9, .capacity = 9, .k_codec = KvCodec::F32});
}
TEST(Attention, GroupedQueryF16Decode) {
  run_case({.n_heads = 8, .n_kv_heads = 2, .head_dim = 128, .n_past = 40,
            .n_tokens = 1, .capacity = 41, .k_codec = KvCodec::F16});
}
TEST(Attention, MultiQueryHeadDim256Prefill) {
  run_case({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .n_past = 5,
            .n_tokens = 12, .capacity = 17, .k_codec = KvCodec::F16});
}
TEST(Attention, HeadDim512) {
  run_case({.n_heads = 2, .n_kv_heads = 1, .head_dim = 512, .n_past = 3,
            .n_tokens = 4, .capacity = 7, .k_codec = KvCodec::F32});
}
TEST(Attention, SlidingWindowMasksOldKeys) {
  run_case({.n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .n_past = 20, .n_tokens = 6,
            .window = 8, .capacity = 26, .k_codec = KvCodec::F32});
}
// A sliding layer's cache is a ring of window + batch slots: positions wrap around it.
TEST(Attention, SlidingWindowRingWraps) {
  run_case({.n_heads = 4, .n_kv_heads = 1, .head_dim = 64, .n_past = 37, .n_tokens = 3,
            .window = 8, .capacity = 11, .k_codec = KvCodec::F16});
}
// Decode over a long context: the key range is split across threads and the partial softmaxes merged.
TEST(Attention, LongDecodeSplitsKeysTbq4) {
  run_case({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .n_past = 2000,
            .n_tokens = 1, .capacity = 2001, .k_codec = KvCodec::TBQ4});
}
TEST(Attention, LongDecodeWindowedRing) {
  run_case({.n_heads = 8, .n_kv_heads = 2, .head_dim = 128, .n_past = 1500, .n_tokens = 1,
            .window = 300, .capacity = 333, .k_codec = KvCodec::Q8_0, .v_codec = KvCodec::Q4_0});
}
// K and V in different codecs and bases: a rotated K, a sketched K, an inner-product V.
TEST(Attention, MixedCodecsPrefill) {
  run_case({.n_heads = 4, .n_kv_heads = 2, .head_dim = 128, .n_past = 30, .n_tokens = 20,
            .capacity = 50, .k_codec = KvCodec::TBQ4, .v_codec = KvCodec::TBQ3});
}
TEST(Attention, QjlKeysPolarValues) {
  run_case({.n_heads = 2, .n_kv_heads = 1, .head_dim = 64, .n_past = 70, .n_tokens = 5,
            .capacity = 75, .k_codec = KvCodec::QJL, .v_codec = KvCodec::POLAR4});
}
// Key centering: keys stored minus a center give the attention output of the uncentered keys.
TEST(Attention, CenteredKeysLeaveTheOutputUnchanged) {
  run_case({.n_heads = 4, .n_kv_heads = 2, .head_dim = 128, .n_past = 30, .n_tokens = 3,
            .capacity = 33, .k_codec = KvCodec::F32, .center_keys = true});
}
TEST(Attention, CenteredCompressedKeys) {
  run_case({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .n_past = 200, .n_tokens = 1,
            .capacity = 201, .k_codec = KvCodec::TBQ4, .v_codec = KvCodec::F16, .center_keys = true});
}

TEST(Attention, TrellisKeysInnerProductValues) {
  run_case({.n_heads = 4, .n_kv_heads = 4, .head_dim = 256, .n_past = 10, .n_tokens = 3,
            .capacity = 13, .k_codec = KvCodec::TCQ3, .v_codec = KvCodec::TBQ4P});
}

// Protected positions: sinks and each query's recent keys read from their own f16 or q8_0 blocks, the rest from
// the low-bit ones, in one softmax.
TEST(Attention, ProtectedSinkAndWindowDecode) {
  run_case({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .n_past = 100, .n_tokens = 1, .capacity = 101,
            .k_codec = KvCodec::TCQ4, .center_keys = true, .sinks = 1, .recent = 8});
}
// A prefill whose window ring wraps, sinks past the first batch, different K and V codecs.
TEST(Attention, ProtectedPositionsPrefill) {
  run_case({.n_heads = 4, .n_kv_heads = 2, .head_dim = 128, .n_past = 30, .n_tokens = 20, .capacity = 50,
            .k_codec = KvCodec::TBQ4, .v_codec = KvCodec::TBQ3, .sinks = 2, .recent = 5,
            .protected_codec = KvCodec::Q8_0});
}
// Queries whose window reaches past position 0, and sinks that a sliding window hides from later queries.
TEST(Attention, ProtectedPositionsUnderASlidingWindow) {
  run_case({.n_heads = 2, .n_kv_heads = 1, .head_dim = 64, .n_past = 0, .n_tokens = 24, .window = 8, .capacity = 24,
            .k_codec = KvCodec::Q4_0, .sinks = 3, .recent = 4});
}
// A long decode: the main key range split across threads, merged with the protected part.
TEST(Attention, ProtectedPositionsLongDecode) {
  run_case({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .n_past = 2000, .n_tokens = 1, .capacity = 2001,
            .k_codec = KvCodec::TBQ4, .sinks = 1, .recent = 32});
}
// Only a window, only sinks.
TEST(Attention, ProtectedWindowOnlyAndSinksOnly) {
  run_case({.n_heads = 2, .n_kv_heads = 1, .head_dim = 64, .n_past = 40, .n_tokens = 3, .capacity = 43,
            .k_codec = KvCodec::TCQ3, .recent = 6});
  run_case({.n_heads = 2, .n_kv_heads = 1, .head_dim = 64, .n_past = 40, .n_tokens = 3, .capacity = 43,
            .k_codec = KvCodec::TCQ3, .sinks = 4});
}

}  // namespace
}  // namespace sparrow
