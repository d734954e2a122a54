// The KV cache: per-layer codecs for K and V, sliding-window rings, KV-shared layers, Gemma 4's dual head dims,
// the --kv-layers syntax, and the errors for codecs or layers that cannot be used. Geometry from a hand-made
// layer shapes, sizes from the codecs' bits per element (spec numbers), not from the cache's own arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "cli_test_util.h"
#include "sparrow/sparrow.h"
#include "api/kv_options.h"
#include "kv/kv_cache.h"
#include "kv/kv_presets.h"
#include "kv_test_layers.h"
#include "random_weights.h"
#include "util/error.h"

namespace sparrow {
namespace {

using formats::KvCodec;

using kv_test::mixed_layers;
constexpr int32_t kWindow = 128;

// Bytes of one head vector of dimension d in a codec with the given bits per element.
double vector_bytes(double bits_per_element, int d) { return bits_per_element * d / 8; }

struct CacheFixture : ::testing::Test {
  // Options with the layers' sliding window set.
  static KvCacheOptions options() {
    KvCacheOptions o;
    o.sliding_window = kWindow;
    return o;
  }
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::vector<KvLayerShape> layers = mixed_layers();
};

TEST(KvLayersSyntax, RangesSingleLayersAndBothCodecs) {
  const auto o = parse_kv_layers("0-3:q8_0/tbq4,7:f16,2-2:qjl/tbq3");
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o[0].first, 0);
  EXPECT_EQ(o[0].last, 3);
  EXPECT_EQ(o[0].k_codec, KvCodec::Q8_0);
  EXPECT_EQ(o[0].v_codec, KvCodec::TBQ4);
  EXPECT_EQ(o[1].first, 7);
  EXPECT_EQ(o[1].last, 7);
  EXPECT_EQ(o[1].k_codec, KvCodec::F16);
  EXPECT_EQ(o[1].v_codec, KvCodec::F16);
  EXPECT_EQ(o[2].k_codec, KvCodec::QJL);
  EXPECT_TRUE(parse_kv_layers("").empty());
  const auto kinds = parse_kv_layers("global:q8_0/tbq4,sliding:tbq3");
  ASSERT_EQ(kinds.size(), 2u);
  EXPECT_EQ(kinds[0].kind, KvLayerOverride::Kind::Global);
  EXPECT_EQ(kinds[0].k_codec, KvCodec::Q8_0);
  EXPECT_EQ(kinds[0].v_codec, KvCodec::TBQ4);
  EXPECT_EQ(kinds[1].kind, KvLayerOverride::Kind::Sliding);
  EXPECT_EQ(kinds[1].v_codec, KvCodec::TBQ3);
}

TEST(KvLayersSyntax, BadEntriesAreClearErrors) {
  for (const char* bad : {"f16", "x:f16", "3-1:f16", "0:nope", "0:f16/qjl", "-2:f16", "0-:f16", "1:", "globals:f16",
                          "global:nope"}) {
    try {
      parse_kv_layers(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-layers"), std::string::npos) << e.what();
    }
  }
}

TEST(KvCodecOption, KeysOnlyCodecIsRefusedForValues) {
  EXPECT_EQ(parse_kv_codec_option("qjl", "-ctk", false), KvCodec::QJL);
  EXPECT_THROW(parse_kv_codec_option("qjl", "-ctv", true), Error);
  try {
    parse_kv_codec_option("q3_k", "-ctk", false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tbq4"), std::string::npos) << "lists the codecs: " << e.what();
  }
}

TEST_F(CacheFixture, DecodeReadsEveryVisiblePositionOfEveryLayerOnce) {
  KvCacheOptions o = options();
  o.n_ctx = 1000;
  o.k_codec = o.v_codec = KvCodec::F16;  // 16 bits per element
  KvCache cache(*backend, layers, o);
  // Per position: sliding layers 0, 1, 3 and shared 4 read 2 heads x 256 of K and of V; global layer 2 and
  // shared 5 read 1 head x 512.
  const double sliding = 2 * 2 * vector_bytes(16, 256), global = 2 * 1 * vector_bytes(16, 512);
  const auto expected = [&](int64_t n_past) {
    const double sliding_positions = double(std::min<int64_t>(n_past + 1, kWindow));
    return 4 * sliding * sliding_positions + 2 * global * double(n_past + 1);
  };
  for (int32_t n_past : {0, 1, 127, 128, 500, 999}) {
    EXPECT_EQ(double(cache.bytes_read_by_decode(n_past)), expected(n_past)) << "n_past " << n_past;
  }
}

TEST_F(CacheFixture, SizesFollowCodecsWindowsAndSharing) {
  KvCacheOptions o = options();
  o.n_ctx = 1000;
  o.n_batch = 64;
  o.k_codec = KvCodec::TBQ4;
  o.v_codec = KvCodec::TBQ3;
  o.layers = parse_kv_layers("1:q8_0/f16");
  KvCache cache(*backend, layers, o);

  const int64_t ring = kWindow + 64;  // window + batch
  EXPECT_EQ(cache.layer(0).capacity, ring);
  EXPECT_EQ(cache.layer(2).capacity, 1000);
  EXPECT_EQ(cache.layer(1).k_codec, KvCodec::Q8_0);
  EXPECT_EQ(cache.layer(1).v_codec, KvCodec::F16);
  EXPECT_EQ(cache.layer(3).k_codec, KvCodec::TBQ4);
  EXPECT_EQ(cache.layer(3).v_codec, KvCodec::TBQ3);
  // Shared layers read their source's storage.
  EXPECT_EQ(cache.layer(4).k, cache.layer(3).k);
  EXPECT_EQ(cache.layer(5).v, cache.layer(2).v);
  EXPECT_EQ(cache.layer(5).head_dim, 512);

  // Spec bits per element: q8_0 8.5, f16 16; tbq4/tbq3 from the codec table at each head dim.
  const double tbq4_256 = vector_bytes(formats::kv_bits_per_element(KvCodec::TBQ4, 256), 256);
  const double tbq3_256 = vector_bytes(formats::kv_bits_per_element(KvCodec::TBQ3, 256), 256);
  const double tbq4_512 = vector_bytes(formats::kv_bits_per_element(KvCodec::TBQ4, 512), 512);
  const double tbq3_512 = vector_bytes(formats::kv_bits_per_element(KvCodec::TBQ3, 512), 512);
  const double sliding_per_token = 2 * (tbq4_256 + tbq3_256) * 2 + 2 * (vector_bytes(8.5, 256) + vector_bytes(16, 256));
  const double global_per_token = tbq4_512 + tbq3_512;
  EXPECT_DOUBLE_EQ(double(cache.bytes_per_token(true)), sliding_per_token);
  EXPECT_DOUBLE_EQ(double(cache.bytes_per_token(false)), global_per_token);
  EXPECT_DOUBLE_EQ(double(cache.bytes()), sliding_per_token * ring + global_per_token * 1000);

  const std::string summary = cache.summary();
  EXPECT_NE(summary.find("sliding: 3 layers"), std::string::npos) << summary;
  EXPECT_NE(summary.find("global: 1 layers"), std::string::npos) << summary;
  EXPECT_NE(summary.find("shared: 2 layers"), std::string::npos) << summary;
  EXPECT_NE(summary.find("q8_0/f16 x1"), std::string::npos) << summary;
  EXPECT_NE(summary.find("tbq4/tbq3 centered K balanced K x2"), std::string::npos) << summary;
}

TEST_F(CacheFixture, KindOverridesSetEveryOwningLayerOfTheirKindInOrder) {
  KvCacheOptions o = options();
  o.k_codec = o.v_codec = KvCodec::TBQ4;
  o.layers = parse_kv_layers("global:q8_0/tbq4,sliding:tbq3,1:f16");  // later entries win
  KvCache cache(*backend, layers, o);
  EXPECT_EQ(cache.layer(2).k_codec, KvCodec::Q8_0);  // the global layer
  EXPECT_EQ(cache.layer(2).v_codec, KvCodec::TBQ4);
  EXPECT_EQ(cache.layer(5).k_codec, KvCodec::Q8_0);  // shared: reads layer 2
  for (int32_t il : {0, 3, 4}) {
    EXPECT_EQ(cache.layer(il).k_codec, KvCodec::TBQ3) << il;
    EXPECT_EQ(cache.layer(il).v_codec, KvCodec::TBQ3) << il;
  }
  EXPECT_EQ(cache.layer(1).k_codec, KvCodec::F16);

  // A kind the model does not have is an error, not a silent no-op.
  std::vector<KvLayerShape> all_sliding = layers;
  for (KvLayerShape& l : all_sliding) l.sliding = true;
  o.layers = parse_kv_layers("global:q8_0");
  try {
    KvCache none(*backend, all_sliding, o);
    FAIL() << "accepted a global override without global layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no global layers"), std::string::npos) << e.what();
  }
}

TEST_F(CacheFixture, KeysAreCenteredForLowBitCodecsUnlessToldOtherwise) {
  KvCacheOptions o = options();
  o.k_codec = KvCodec::TBQ4;
  o.layers = parse_kv_layers("1:q8_0/f16,2:q4_0");
  {
    KvCache cache(*backend, layers, o);
    EXPECT_NE(cache.layer(0).k_center, nullptr);
    EXPECT_EQ(cache.layer(1).k_center, nullptr);  // llama.cpp's codecs stay as llama.cpp stores them
    EXPECT_EQ(cache.layer(2).k_center, nullptr);
  }
  o.center_keys = KeyCentering::Off;
  {
    KvCache cache(*backend, layers, o);
    EXPECT_EQ(cache.layer(0).k_center, nullptr);
  }
  o.center_keys = KeyCentering::On;
  {
    KvCache cache(*backend, layers, o);
    EXPECT_NE(cache.layer(1).k_center, nullptr);
  }
}

TEST_F(CacheFixture, KeysAreBalancedForLowBitCodecsUnlessToldOtherwise) {
  KvCacheOptions o = options();
  o.k_codec = KvCodec::TBQ4;
  o.layers = parse_kv_layers("1:q8_0/f16,2:q4_0");
  {
    KvCache cache(*backend, layers, o);
    EXPECT_TRUE(cache.balanced_keys(0));
    EXPECT_FALSE(cache.balanced_keys(1));  // llama.cpp's codecs stay as llama.cpp stores them
    EXPECT_FALSE(cache.balanced_keys(2));
    EXPECT_NE(cache.summary().find("balanced K"), std::string::npos) << cache.summary();
  }
  o.balance_keys = KeyBalancing::Off;
  {
    KvCache cache(*backend, layers, o);
    EXPECT_FALSE(cache.balanced_keys(0));
  }
  o.balance_keys = KeyBalancing::On;
  {
    KvCache cache(*backend, layers, o);
    EXPECT_TRUE(cache.balanced_keys(1));
  }
}

// The first store of a sequence sets each KV head's center to the batch's mean key without position 0 (the
// attention sink); a first batch shorter than kKeyCenterMinTokens leaves it at zero.
TEST_F(CacheFixture, KeyCenterIsTheMeanKeyWithoutPositionZero) {
  layers = {{.sliding = false, .head_dim = 64, .n_kv_heads = 2, .owns_kv = true, .kv_source = 0}};
  KvCacheOptions o = options();
  o.n_ctx = 32;
  o.k_codec = o.v_codec = KvCodec::F32;
  o.center_keys = KeyCentering::On;
  KvCache cache(*backend, layers, o);
  const int d = 64, heads = 2, n = 10;
  std::vector<float> k(size_t(n) * heads * d), v(k.size(), 0.0f);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d; ++i) k[(size_t(t) * heads + h) * d + i] = t == 0 ? 1000.0f : float(t + i + 100 * h);
  cache.store(0, k.data(), v.data(), n, 0);
  const float* center = cache.layer(0).k_center;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < d; ++i) EXPECT_FLOAT_EQ(center[h * d + i], 5.0f + float(i + 100 * h));  // mean of 1..9
  // Keys are stored minus the center.
  const float* stored = static_cast<const float*>(cache.layer(0).k);
  EXPECT_FLOAT_EQ(stored[3 * d + 7], k[(3 * heads + 0) * d + 7] - center[7]);

  cache.store(0, k.data(), v.data(), kKeyCenterMinTokens - 1, 0);
  for (int i = 0; i < heads * d; ++i) EXPECT_EQ(center[i], 0.0f);
  // Later batches of the sequence keep the center.
  cache.store(0, k.data(), v.data(), n, 0);
  cache.store(0, k.data(), v.data(), 2, n);
  EXPECT_FLOAT_EQ(center[0], 5.0f);
}

// ---------------------------------------------------------------------------------------------------------------
// Saving and restoring a sequence's cache, and how far back it can be truncated.

struct SaveRestore : CacheFixture {
  static constexpr int32_t kTokens = 304;
  // 304 tokens of random keys and values stored in 16-token batches, so that the sliding rings (128 + 16 slots)
  // have wrapped twice.
  static KvCacheOptions sequence_options(KvCodec k, KvCodec v, int32_t n_batch) {
    KvCacheOptions o = options();
    o.n_ctx = 400;
    o.n_batch = n_batch;
    o.k_codec = k;
    o.v_codec = v;
    return o;
  }
  void fill(KvCache& cache) const {
    for (int32_t first = 0; first < kTokens; first += 16)
      for (int32_t il = 0; il < 4; ++il) {
        const int64_t width = int64_t(layers[il].n_kv_heads) * layers[il].head_dim;
        const auto k = testing::random_activations(16 * width, uint32_t(first * 10 + il));
        const auto v = testing::random_activations(16 * width, uint32_t(first * 10 + il + 5));
        cache.store(il, k.data(), v.data(), 16, first);
      }
  }
  static std::string saved(const KvCache& cache, int32_t n_past) {
    std::ostringstream out;
    cache.save(out, n_past);
    return out.str();
  }
  static void restore(KvCache& cache, const std::string& bytes, int32_t n_past) {
    std::istringstream in(bytes);
    cache.restore(in, n_past);
  }
  // The encoded block of position p in layer il's K or V ring, head h.
  static const uint8_t* block(const KvCache& cache, int32_t il, bool keys, int32_t h, int64_t p) {
    const KvLayerView& v = cache.layer(il);
    const size_t bb = formats::kv_codec_info(keys ? v.k_codec : v.v_codec).block_bytes(v.head_dim);
    return static_cast<const uint8_t*>(keys ? v.k : v.v) + (h * v.capacity + p % v.capacity) * bb;
  }
};

// Every codec: a cache restored from the bytes saved holds the same blocks for every position a ring of its
// size keeps, larger or smaller than the saved one, and the same key centers.
TEST_F(SaveRestore, EveryCodecRestoresTheBlocksOfTheLastPositions) {
  for (const formats::KvCodecInfo& codec : formats::kv_codecs()) {
    SCOPED_TRACE(std::string(codec.name));
    const KvCodec v_codec = codec.keys_only ? KvCodec::F16 : codec.codec;
    KvCache original(*backend, layers, sequence_options(codec.codec, v_codec, 16));
    fill(original);
    const std::string bytes = saved(original, kTokens);
    for (int32_t n_batch : {16, 64, 8}) {
      SCOPED_TRACE("n_batch " + std::to_string(n_batch));
      KvCache copy(*backend, layers, sequence_options(codec.codec, v_codec, n_batch));
      restore(copy, bytes, kTokens);
      for (int32_t il = 0; il < 4; ++il) {
        const KvLayerView& a = original.layer(il);
        const KvLayerView& b = copy.layer(il);
        const int64_t first = kTokens - std::min(a.capacity, b.capacity);
        for (bool keys : {true, false}) {
          const size_t bb = formats::kv_codec_info(keys ? a.k_codec : a.v_codec).block_bytes(a.head_dim);
          for (int32_t h = 0; h < a.n_kv_heads; ++h)
            for (int64_t p = std::max<int64_t>(first, 0); p < kTokens; ++p)
              ASSERT_EQ(std::memcmp(block(original, il, keys, h, p), block(copy, il, keys, h, p), bb), 0)
                  << "layer " << il << (keys ? " K" : " V") << " head " << h << " position " << p;
        }
        ASSERT_EQ(a.k_center != nullptr, b.k_center != nullptr);
        if (a.k_center)
          EXPECT_EQ(std::memcmp(a.k_center, b.k_center, sizeof(float) * a.n_kv_heads * a.head_dim), 0);
      }
      if (n_batch == 16) EXPECT_EQ(saved(copy, kTokens), bytes) << "same settings: the same bytes again";
    }
  }
}

// A ring keeps n_batch positions beyond the window: truncating further back is refused. After a restore, the
// smaller of the saved and the current rings decides.
TEST_F(SaveRestore, TruncationGoesBackNoFurtherThanTheRingsHold) {
  KvCache original(*backend, layers, sequence_options(KvCodec::F16, KvCodec::F16, 16));
  fill(original);
  EXPECT_NO_THROW(original.check_truncate(kTokens - 16));
  EXPECT_THROW(original.check_truncate(kTokens - 17), Error);
  const std::string bytes = saved(original, kTokens);

  KvCache larger(*backend, layers, sequence_options(KvCodec::F16, KvCodec::F16, 64));
  restore(larger, bytes, kTokens);
  EXPECT_NO_THROW(larger.check_truncate(kTokens - 16));
  EXPECT_THROW(larger.check_truncate(kTokens - 17), Error) << "the saved ring held only 16 beyond the window";

  KvCache smaller(*backend, layers, sequence_options(KvCodec::F16, KvCodec::F16, 8));
  restore(smaller, bytes, kTokens);
  EXPECT_NO_THROW(smaller.check_truncate(kTokens - 8));
  EXPECT_THROW(smaller.check_truncate(kTokens - 9), Error);
  smaller.reset();
  EXPECT_NO_THROW(smaller.check_truncate(0));

  // Without sliding layers any position can be returned to.
  layers = {{.sliding = false, .head_dim = 64, .n_kv_heads = 1, .owns_kv = true, .kv_source = 0}};
  KvCache global(*backend, layers, sequence_options(KvCodec::F16, KvCodec::F16, 16));
  const std::vector<float> kv(64 * 100, 0.5f);
  global.store(0, kv.data(), kv.data(), 100, 0);
  EXPECT_NO_THROW(global.check_truncate(0));
}

// What does not match is named; bytes that end early are an error, not a partial restore reported as done.
TEST_F(SaveRestore, MismatchesAndShortInputAreClearErrors) {
  KvCache original(*backend, layers, sequence_options(KvCodec::TBQ4, KvCodec::Q8_0, 16));
  fill(original);
  const std::string bytes = saved(original, kTokens);
  auto expect_error = [&](KvCache& cache, const std::string& input, const std::string& needle) {
    try {
      restore(cache, input, kTokens);
      ADD_FAILURE() << "expected an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << " should name " << needle;
    }
  };
  KvCache other_codecs(*backend, layers, sequence_options(KvCodec::TBQ3, KvCodec::Q8_0, 16));
  expect_error(other_codecs, bytes, "saved with KV codecs tbq4/q8_0, this cache uses tbq3/q8_0");
  KvCacheOptions uncentered = sequence_options(KvCodec::TBQ4, KvCodec::Q8_0, 16);
  uncentered.center_keys = KeyCentering::Off;
  KvCache no_centers(*backend, layers, uncentered);
  expect_error(no_centers, bytes, "key centering on, this cache has it off");
  KvCacheOptions unbalanced = sequence_options(KvCodec::TBQ4, KvCodec::Q8_0, 16);
  unbalanced.balance_keys = KeyBalancing::Off;
  KvCache no_balance(*backend, layers, unbalanced);
  expect_error(no_balance, bytes, "key balancing on, this cache has it off");
  KvCache same(*backend, layers, sequence_options(KvCodec::TBQ4, KvCodec::Q8_0, 16));
  // The last bytes are layer 3's protected-positions flag and the KV-shared layers' flags; four bytes short ends
  // in layer 3's V blocks, three short in its flag.
  expect_error(same, bytes.substr(0, bytes.size() - 4), "file ends inside KV blocks");
  expect_error(same, bytes.substr(0, bytes.size() - 3), "file ends inside a layer's protected positions");
  expect_error(same, bytes.substr(0, 3), "file ends inside the layer count");
  std::vector<KvLayerShape> fewer(layers.begin(), layers.begin() + 4);
  KvCache shorter(*backend, fewer, sequence_options(KvCodec::TBQ4, KvCodec::Q8_0, 16));
  expect_error(shorter, bytes, "saved for 6 layers, this model has 4");
}

// Protected positions: a restored cache holds the same sink and window blocks as the saved one (for the window,
// the positions both rings hold), the window ring bounds truncation, and a cache kept otherwise is named.
TEST_F(SaveRestore, ProtectedPositionsRestoreAndBoundTruncation) {
  auto protected_options = [](int32_t n_batch, int32_t sinks, int32_t window) {
    KvCacheOptions o = sequence_options(KvCodec::TCQ4, KvCodec::TBQ3, n_batch);
    o.protected_sinks = sinks;
    o.protected_window = window;
    o.protected_codec = KvCodec::Q8_0;
    return o;
  };
  KvCache original(*backend, layers, protected_options(16, 2, 8));
  fill(original);
  const std::string bytes = saved(original, kTokens);
  const size_t bb = formats::kv_codec_info(KvCodec::Q8_0).block_bytes(256);
  auto protected_block = [&](const KvCache& cache, int32_t il, bool keys, int32_t h, int64_t slot) {
    const KvLayerView& v = cache.layer(il);
    const size_t b = formats::kv_codec_info(v.protected_codec).block_bytes(v.head_dim);
    return static_cast<const uint8_t*>(keys ? v.protected_k : v.protected_v) + (h * v.protected_slots() + slot) * b;
  };
  for (int32_t n_batch : {16, 64, 4}) {
    SCOPED_TRACE("n_batch " + std::to_string(n_batch));
    KvCache copy(*backend, layers, protected_options(n_batch, 2, 8));
    restore(copy, bytes, kTokens);
    for (int32_t il = 0; il < 4; ++il) {
      const KvLayerView& a = original.layer(il);
      const KvLayerView& b = copy.layer(il);
      ASSERT_TRUE(a.protects() && b.protects());
      const size_t block_bytes = il == 2 ? formats::kv_codec_info(KvCodec::Q8_0).block_bytes(512) : bb;
      const int64_t first = kTokens - std::min(a.window_capacity, b.window_capacity);
      for (bool keys : {true, false})
        for (int32_t h = 0; h < a.n_kv_heads; ++h) {
          for (int64_t p = 0; p < 2; ++p)
            ASSERT_EQ(std::memcmp(protected_block(original, il, keys, h, p), protected_block(copy, il, keys, h, p),
                                  block_bytes), 0) << "sink " << p;
          for (int64_t p = first; p < kTokens; ++p)
            ASSERT_EQ(std::memcmp(protected_block(original, il, keys, h, a.window_slot(p)),
                                  protected_block(copy, il, keys, h, b.window_slot(p)), block_bytes), 0)
                << "layer " << il << " window position " << p;
        }
    }
  }
  auto expect_error = [&](const KvCacheOptions& o, const std::string& needle) {
    KvCache cache(*backend, layers, o);
    try {
      restore(cache, bytes, kTokens);
      ADD_FAILURE() << "expected an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(sequence_options(KvCodec::TCQ4, KvCodec::TBQ3, 16), "protected positions on, this cache has them off");
  expect_error(protected_options(16, 1, 8), "saved with 2 sinks and a window of 8 in q8_0");
}

// The window ring holds window + batch slots: a sequence goes back only as far as the window before its new end
// is still in it (a global layer alone, so that no sliding ring decides first).
TEST_F(SaveRestore, ProtectedWindowBoundsTruncation) {
  layers = {{.sliding = false, .head_dim = 64, .n_kv_heads = 1, .owns_kv = true, .kv_source = 0}};
  KvCacheOptions o = sequence_options(KvCodec::TCQ4, KvCodec::TCQ4, 16);
  o.protected_sinks = 1;
  o.protected_window = 8;
  KvCache cache(*backend, layers, o);
  const auto kv = testing::random_activations(64 * 16, 7);
  for (int32_t first = 0; first < 100; first += 16)
    cache.store(0, kv.data(), kv.data(), std::min(16, 100 - first), first);
  // Slots 8 + 16: positions 76..99 held; going back to n needs n - 7..n - 1.
  EXPECT_NO_THROW(cache.check_truncate(83));
  EXPECT_THROW(cache.check_truncate(82), Error);
  cache.reset();
  EXPECT_NO_THROW(cache.check_truncate(0));
}

// Protection goes to layers whose K or V codec has fewer bits than the protected codec, its blocks count in the
// cache's bytes (sinks + window + batch slots) and in the bits per element (sinks + window over the context), and
// the summary says so.
TEST_F(CacheFixture, ProtectedPositionsGoToLowBitLayersAndCountInTheirBytes) {
  KvCacheOptions o = options();
  o.n_ctx = 1024;
  o.n_batch = 32;
  o.k_codec = o.v_codec = KvCodec::TCQ4;
  o.layers = parse_kv_layers("1:f16");
  const double plain_bits = kv_bits_per_element(layers, o);
  const size_t plain_bytes = KvCache(*backend, layers, o).bytes();
  o.protected_sinks = 1;
  o.protected_window = 15;
  o.protected_codec = KvCodec::Q8_0;
  KvCache cache(*backend, layers, o);
  EXPECT_TRUE(cache.layer(0).protects());
  EXPECT_FALSE(cache.layer(1).protects()) << "an f16 layer gains nothing from q8_0 copies";
  EXPECT_TRUE(cache.layer(2).protects());
  EXPECT_EQ(cache.layer(0).window_capacity, 15 + 32);
  // Owning, protected layers: 0 and 3 (2 heads of 256), 2 (1 head of 512); 8.5 bits per element in q8_0.
  const double q8_bytes_256 = vector_bytes(8.5, 256), q8_bytes_512 = vector_bytes(8.5, 512);
  const double per_position = 2 * (2 * 2 * q8_bytes_256 + q8_bytes_512);  // K and V
  EXPECT_DOUBLE_EQ(double(cache.bytes() - plain_bytes), (1 + 15 + 32) * per_position);
  const double elements = 2.0 * (3 * 2 * 256 + 512);  // K and V of the 4 owning layers, per position
  EXPECT_NEAR(kv_bits_per_element(layers, o) - plain_bits, 8 * 16.0 / 1024 * per_position / elements, 1e-12);
  EXPECT_NE(cache.summary().find("protected: the first 1 and the last 15 positions in q8_0 on 3 layers"),
            std::string::npos) << cache.summary();
  o.protected_sinks = -1;
  EXPECT_THROW(KvCache(*backend, layers, o), Error);
  o.protected_sinks = 1;
  o.protected_codec = KvCodec::QJL;
  EXPECT_THROW(KvCache(*backend, layers, o), Error) << "qjl holds no values";
}

TEST_F(CacheFixture, SlidingRingNeverExceedsTheContext) {
  KvCacheOptions o = options();
  o.n_ctx = 100;
  o.n_batch = 64;
  KvCache cache(*backend, layers, o);
  EXPECT_EQ(cache.layer(0).capacity, 100);
}

TEST_F(CacheFixture, OverridesOnSharedLayersOnlyOrMissingLayersAreRefused) {
  KvCacheOptions o = options();
  o.layers = parse_kv_layers("4-5:q8_0");
  EXPECT_THROW(KvCache(*backend, layers, o), Error);
  o.layers = parse_kv_layers("3-5:q8_0");  // a range with an owner is fine; shared layers follow their source
  EXPECT_NO_THROW(KvCache(*backend, layers, o));
  o.layers = parse_kv_layers("6:q8_0");
  EXPECT_THROW(KvCache(*backend, layers, o), Error);
}

// Gemma-3-270M-like: 18 layers of head dim 256 and one KV head, every sixth global.
std::vector<KvLayerShape> gemma3_like_layers() {
  std::vector<KvLayerShape> layers;
  for (int32_t il = 0; il < 18; ++il)
    layers.push_back({.sliding = il % 6 != 5, .head_dim = 256, .n_kv_heads = 1, .owns_kv = true, .kv_source = il});
  return layers;
}

TEST(KvBits, BitsPerElementFollowTheCodecsOfEveryOwningLayer) {
  KvCacheOptions o;
  o.k_codec = o.v_codec = KvCodec::F16;
  EXPECT_DOUBLE_EQ(kv_bits_per_element(mixed_layers(), o), 16.0);
  o.k_codec = KvCodec::Q8_0;
  EXPECT_DOUBLE_EQ(kv_bits_per_element(mixed_layers(), o), (8.5 + 16) / 2);
  // Global K at q8_0 over tbq4: 3 of 18 layers' K at 8.5 bits, the rest at tbq4's.
  const double tbq4 = formats::kv_bits_per_element(KvCodec::TBQ4, 256);
  o.k_codec = o.v_codec = KvCodec::TBQ4;
  o.layers = parse_kv_layers("global:q8_0/tbq4");
  EXPECT_NEAR(kv_bits_per_element(gemma3_like_layers(), o), (3 * 8.5 + 15 * tbq4 + 18 * tbq4) / 36, 1e-12);
}

TEST(KvBits, PresetsGetSmallerDownTheList) {
  double previous = 1e9;
  for (const KvPreset& preset : kv_presets()) {
    KvCacheOptions o;
    o.k_codec = preset.k_codec;
    o.v_codec = preset.v_codec;
    o.layers = preset.layers;
    const double bits = kv_bits_per_element(gemma3_like_layers(), o);
    EXPECT_LT(bits, previous) << preset.name;
    previous = bits;
  }
}

TEST(KvBits, PicksTheFirstPresetThatFitsAndSaysSo) {
  const auto layers = gemma3_like_layers();
  auto chosen = [&](double bits) {
    KvCacheOptions o;
    o.k_codec = o.v_codec = KvCodec::F32;  // replaced
    o.layers = parse_kv_layers("0:f32");   // replaced
    const std::string line = apply_kv_bits(layers, bits, o);
    EXPECT_EQ(line, o.chosen_by);
    EXPECT_LE(kv_bits_per_element(layers, o), bits) << line;
    return line;
  };
  EXPECT_NE(chosen(16).find(": f16,"), std::string::npos) << chosen(16);
  EXPECT_NE(chosen(8.5).find(": q8_0,"), std::string::npos) << chosen(8.5);
  EXPECT_NE(chosen(6.4).find(": q8_0 K, tcq4 V,"), std::string::npos) << chosen(6.4);
  EXPECT_NE(chosen(4.5).find(": tcq4, q8_0 K on global layers"), std::string::npos) << chosen(4.5);
  EXPECT_NE(chosen(4.2).find(": tcq4,"), std::string::npos) << chosen(4.2);
  EXPECT_NE(chosen(4.0).find(": tcq4 K, tcq3 V, q8_0 K on global layers"), std::string::npos) << chosen(4.0);
  EXPECT_NE(chosen(3.6).find(": tcq3, q8_0 K on global layers"), std::string::npos) << chosen(3.6);
  EXPECT_NE(chosen(3.2).find(": tcq3,"), std::string::npos) << chosen(3.2);
  try {
    KvCacheOptions o;
    apply_kv_bits(layers, 1.0, o);
    FAIL() << "1 bit per element fitted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no KV configuration is that small"), std::string::npos) << e.what();
  }
  // Without global layers the presets that name them are the same as their base: skipped, not an error.
  auto all_sliding = layers;
  for (KvLayerShape& l : all_sliding) l.sliding = true;
  KvCacheOptions o;
  EXPECT_NE(apply_kv_bits(all_sliding, 4.5, o).find(": tcq4,"), std::string::npos) << o.chosen_by;
}

TEST_F(CacheFixture, UnsupportedHeadDimIsAClearError) {
  layers[2].head_dim = 96;
  layers[5].head_dim = 96;
  try {
    KvCache cache(*backend, layers, options());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 96"), std::string::npos) << e.what();
  }
}

TEST_F(CacheFixture, ImpossibleContextIsRefusedBeforeAllocating) {
  KvCacheOptions o = options();
  o.n_ctx = 1 << 30;
  o.k_codec = o.v_codec = KvCodec::F32;
  EXPECT_THROW(KvCache(*backend, layers, o), Error);
}

// The tools: any KV configuration runs, and bad ones exit non-zero with one line. The model has f32 weights:
// with quantized weights, activations are quantized to 8 bits before every matmul, and the prompt GEMM's float
// summation order (a 1e-7 relative difference from the one-token kernel) flips some of those roundings, which
// the model amplifies to percent-level logit differences; f32 weights isolate what these tests check.
class KvCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string((testing::scratch_dir() / "kv-cli.gguf").string());
    auto r = testing::run_sparrow("mkmodel --arch gemma4 --preset tiny-ple --type f32 --seed 5 -o " + *model_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static std::string* model_;
};
std::string* KvCli::model_ = nullptr;

TEST_F(KvCli, RunWithCompressedCodecsPrintsTheCacheSummary) {
  auto r = testing::run_sparrow("run -m " + *model_ + " -p hello -n 4 --temp 0 -ctk tbq4 -ctv tbq3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("tbq4/tbq3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bytes/token"), std::string::npos) << r.err;
}

TEST_F(KvCli, LogitsWithPerLayerOverrides) {
  const std::string out = (testing::scratch_dir() / "kv-cli-logits.bin").string();
  auto r = testing::run_sparrow("logits -m " + *model_ + " --tokens 2,10,20 -o " + out +
                                " -ctk q8_0 -ctv q4_0 --kv-layers 0:polar4/tcq3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("polar4/tcq3"), std::string::npos) << r.err;
}

TEST_F(KvCli, KeysOnlyCodecForValuesFails) {
  auto r = testing::run_sparrow("run -m " + *model_ + " -p hello -n 1 -ctv qjl");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("keys only"), std::string::npos) << r.err;
}

TEST_F(KvCli, KvBitsChoosesAConfigurationAndSaysWhich) {
  // This model has 3 layers that own KV, one of them global (head dim 512): q8_0 keys there cost 5.2 bits per
  // element in all, so 5.5 bits take that preset and 5 the next one (plain tcq4, 4.125 bits).
  auto r = testing::run_sparrow("run -m " + *model_ + " -p hello -n 2 --temp 0 --kv-bits 5.5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--kv-bits 5.5: tcq4, q8_0 K on global layers"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("global: 1 layers (q8_0/tcq4)"), std::string::npos) << r.err;
  auto smaller = testing::run_sparrow("run -m " + *model_ + " -p hello -n 2 --temp 0 --kv-bits 5");
  ASSERT_EQ(smaller.exit_code, 0) << smaller.err;
  EXPECT_NE(smaller.err.find("--kv-bits 5: tcq4, 4.12 bits per element"), std::string::npos) << smaller.err;
  auto both = testing::run_sparrow("run -m " + *model_ + " -p hello -n 1 --kv-bits 4.5 -ctk q8_0");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
  auto tiny = testing::run_sparrow("run -m " + *model_ + " -p hello -n 1 --kv-bits 1");
  EXPECT_NE(tiny.exit_code, 0);
  EXPECT_NE(tiny.err.find("no KV configuration is that small"), std::string::npos) << tiny.err;
  auto negative = testing::run_sparrow("run -m " + *model_ + " -p hello -n 1 --kv-bits -2");
  EXPECT_NE(negative.exit_code, 0);
}

TEST_F(KvCli, UnknownCodecFails) {
  auto r = testing::run_sparrow("run -m " + *model_ + " -p hello -n 1 -ctk q5_k");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unknown KV cache codec"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace sparrow

namespace sparrow {
namespace {

// max |a - b| over max |a| of two logit rows: how far apart two runs' logits are, relative to their scale.
float relative_logit_gap(const float* a, const float* b, int32_t n_vocab) {
  float max_abs = 0, max_diff = 0;
  for (int32_t v = 0; v < n_vocab; ++v) {
    max_abs = std::max(max_abs, std::fabs(a[v]));
    max_diff = std::max(max_diff, std::fabs(a[v] - b[v]));
  }
  return max_abs > 0 ? max_diff / max_abs : std::numeric_limits<float>::infinity();
}

// The logits of the tokens decoded as one batch and one token at a time, in two contexts made with p, agree.
void expect_prefill_matches_decode(sparrow_model* model, const std::vector<sparrow_token>& tokens,
                                   const sparrow_context_params& p, const std::string& label) {
  const int32_t n_vocab = sparrow_model_n_vocab(model);
  sparrow_context* batch = sparrow_context_new(model, p);
  sparrow_context* step = sparrow_context_new(model, p);
  ASSERT_TRUE(batch && step) << sparrow_last_error();
  ASSERT_EQ(sparrow_decode(batch, tokens.data(), int32_t(tokens.size()), 1), 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    ASSERT_EQ(sparrow_decode(step, &tokens[i], 1, 0), 0);
    ASSERT_LE(relative_logit_gap(sparrow_get_logits(batch, int32_t(i)), sparrow_get_logits(step, -1), n_vocab), 1e-4f)
        << label << " position " << i;
  }
  sparrow_context_free(batch);
  sparrow_context_free(step);
}

// Prefill (query tiles over the whole prompt) and token-by-token decode (one query, key range split across
// threads, partial softmaxes merged) are different task layouts over the same cache: same logits.
TEST_F(KvCli, PrefillAndDecodeAgreeForEveryCompressedLayout) {
  sparrow_model* model = sparrow_model_load(model_->c_str(), nullptr, nullptr);
  ASSERT_NE(model, nullptr) << sparrow_last_error();
  std::vector<sparrow_token> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(2 + (i * 37) % (sparrow_model_n_vocab(model) - 2));
  for (const char* codec : {"f32", "tbq4", "q4_0"}) {
    sparrow_context_params p = sparrow_context_default_params();
    p.n_ctx = 64;
    p.n_threads = 2;
    p.cache_type_k = codec;
    p.cache_type_v = codec;
    p.kv_center_keys = 0;  // a centre is set by a sequence's first store, which differs between the two runs
    expect_prefill_matches_decode(model, tokens, p, codec);
  }
  sparrow_model_free(model);
}

// Protected positions: prefill (a batch's own positions in the window ring) and token-by-token decode (the window
// carried across steps) read the same protected and main blocks: same logits.
TEST_F(KvCli, PrefillAndDecodeAgreeWithProtectedPositions) {
  sparrow_model* model = sparrow_model_load(model_->c_str(), nullptr, nullptr);
  ASSERT_NE(model, nullptr) << sparrow_last_error();
  std::vector<sparrow_token> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(2 + (i * 41) % (sparrow_model_n_vocab(model) - 2));
  sparrow_context_params p = sparrow_context_default_params();
  p.n_ctx = 64;
  p.n_threads = 2;
  p.cache_type_k = p.cache_type_v = "tcq4";
  p.kv_center_keys = 0;
  p.kv_sinks = 2;
  p.kv_window = 6;
  p.kv_protected_type = "q8_0";
  sparrow_context* ctx = sparrow_context_new(model, p);
  ASSERT_NE(ctx, nullptr) << sparrow_last_error();
  EXPECT_NE(std::string(sparrow_context_kv_summary(ctx)).find("protected: the first 2 and the last 6"),
            std::string::npos);
  sparrow_context_free(ctx);
  expect_prefill_matches_decode(model, tokens, p, "tcq4, 2 sinks, window 6");
  p.kv_protected_type = "nonsense";
  EXPECT_EQ(sparrow_context_new(model, p), nullptr);
  EXPECT_NE(std::string(sparrow_last_error()).find("kv_protected_type: unknown KV codec 'nonsense'"),
            std::string::npos) << sparrow_last_error();
  sparrow_model_free(model);
}

// Balanced keys leave every score unchanged (model/key_balance.h): with f32 KV, which stores what it is given,
// balancing on and off give the same logits up to rounding of the gains' last bits, which this random-weight
// model amplifies: on an AVX2 machine (2026-12-06) merely decoding the prompt one token at a time instead of in
// one batch moved its logits by up to 4.2e-4 of max |logit|, and balancing by up to 1.15e-3 (1.2e-4 on an
// AVX-512 one). A wiring error (queries divided by the scales their keys were not multiplied by) moved them by
// 3e-2 to 0.38 at every position after the first; 5e-3 sits between the two.
TEST_F(KvCli, BalancedKeysLeaveTheLogitsAsTheyWere) {
  sparrow_model* model = sparrow_model_load(model_->c_str(), nullptr, nullptr);
  ASSERT_NE(model, nullptr) << sparrow_last_error();
  const int32_t n_vocab = sparrow_model_n_vocab(model);
  std::vector<sparrow_token> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back(2 + (i * 53) % (n_vocab - 2));
  sparrow_context* runs[2] = {};
  for (int balanced : {0, 1}) {
    sparrow_context_params p = sparrow_context_default_params();
    p.n_ctx = 64;
    p.n_threads = 2;
    p.cache_type_k = p.cache_type_v = "f32";
    p.kv_balance_keys = balanced;
    runs[balanced] = sparrow_context_new(model, p);
    ASSERT_NE(runs[balanced], nullptr) << sparrow_last_error();
    ASSERT_EQ(sparrow_decode(runs[balanced], tokens.data(), int32_t(tokens.size()), 1), 0);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    ASSERT_LE(relative_logit_gap(sparrow_get_logits(runs[0], int32_t(i)), sparrow_get_logits(runs[1], int32_t(i)),
                                 n_vocab),
              5e-3f)
        << "position " << i;
  }
  for (sparrow_context* c : runs) sparrow_context_free(c);
  sparrow_model_free(model);
}

}  // namespace
}  // namespace sparrow
