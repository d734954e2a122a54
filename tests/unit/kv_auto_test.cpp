// -ctk auto / -ctv auto (runtime/kv_auto.h): every layer that owns KV gets the decided pair for its backend and
// head dim, given codecs and --kv-layers still win, and the C API and the tools default to auto.
#include "runtime/kv_auto.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/kv_options.h"
#include "kv/kv_cache.h"
#include "kv_test_layers.h"
#include "ops/backend.h"
#include "sparrow/sparrow.h"
#include "util/error.h"

namespace sparrow {
namespace {

using formats::KvCodec;

// The codecs a real cache ends up with, layer by layer (the cache applies the overrides).
std::vector<std::pair<KvCodec, KvCodec>> cache_codecs(const std::vector<KvLayerShape>& layers,
                                                      const KvCacheOptions& o) {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  KvCache cache(*backend, layers, o);
  std::vector<std::pair<KvCodec, KvCodec>> codecs;
  for (int32_t il = 0; il < int32_t(layers.size()); ++il)
    codecs.emplace_back(cache.layer(il).k_codec, cache.layer(il).v_codec);
  return codecs;
}

KvCacheOptions small_cache() {
  KvCacheOptions o;
  o.n_ctx = 64;
  o.n_batch = 8;
  o.sliding_window = 16;
  return o;
}

TEST(KvAuto, TheDecisionsCoverEveryBackendAndHeadDimAndUnknownBackendsGetF16) {
  for (const char* backend : {"cpu", "cuda"}) {
    for (int32_t head_dim : {64, 128, 256, 512}) {
      const KvCodecPair pair = decided_kv_codecs(backend, head_dim);
      EXPECT_FALSE(formats::kv_codec_info(pair.v).keys_only) << backend << " " << head_dim;
    }
  }
  const KvCodecPair other = decided_kv_codecs("lockstep", 256);
  EXPECT_EQ(other.k, KvCodec::F16);
  EXPECT_EQ(other.v, KvCodec::F16);
}

TEST(KvAuto, EachLayerGetsItsHeadDimsPairAndSharedLayersReadTheirSource) {
  const auto layers = kv_test::mixed_layers();
  KvCacheOptions o = small_cache();
  const std::string line = apply_kv_auto(layers, "cpu", std::nullopt, std::nullopt, o);
  EXPECT_NE(line.find("head dim 256"), std::string::npos) << line;
  EXPECT_NE(line.find("head dim 512"), std::string::npos) << line;
  EXPECT_EQ(o.chosen_by, line);
  const auto codecs = cache_codecs(layers, o);
  for (int32_t il = 0; il < int32_t(layers.size()); ++il) {
    const KvCodecPair want = decided_kv_codecs("cpu", layers[il].head_dim);
    EXPECT_EQ(codecs[il].first, want.k) << "layer " << il;
    EXPECT_EQ(codecs[il].second, want.v) << "layer " << il;
  }
}

TEST(KvAuto, AGivenCodecAndLayerOverridesWin) {
  const auto layers = kv_test::mixed_layers();
  KvCacheOptions o = small_cache();
  o.layers = parse_kv_layers("3:tbq4/tbq3");
  apply_kv_auto(layers, "cpu", KvCodec::TBQ4, std::nullopt, o);  // -ctk tbq4, -ctv auto
  const auto codecs = cache_codecs(layers, o);
  EXPECT_EQ(codecs[0].first, KvCodec::TBQ4);
  EXPECT_EQ(codecs[0].second, decided_kv_codecs("cpu", 256).v);
  EXPECT_EQ(codecs[2].first, KvCodec::TBQ4);  // the global layer: head dim 512's V
  EXPECT_EQ(codecs[2].second, decided_kv_codecs("cpu", 512).v);
  EXPECT_EQ(codecs[3].first, KvCodec::TBQ4);  // --kv-layers, applied after auto
  EXPECT_EQ(codecs[3].second, KvCodec::TBQ3);
  EXPECT_EQ(codecs[4], codecs[3]);  // a KV-shared layer reads its source's cache
  EXPECT_NE(o.chosen_by.find("-ctv auto"), std::string::npos) << o.chosen_by;

  KvCacheOptions given = small_cache();
  given.k_codec = KvCodec::Q4_0;
  EXPECT_EQ(apply_kv_auto(layers, "cpu", KvCodec::Q4_0, KvCodec::Q8_0, given), "");
  EXPECT_TRUE(given.layers.empty());
  EXPECT_TRUE(given.chosen_by.empty());
}

TEST(KvAuto, AutoIsTheDefaultAndASpelling) {
  const sparrow_context_params p = sparrow_context_default_params();
  EXPECT_EQ(std::string(p.cache_type_k), "auto");
  EXPECT_EQ(std::string(p.cache_type_v), "auto");
  EXPECT_FALSE(parse_kv_codec_choice("auto", "-ctk", false).has_value());
  EXPECT_EQ(parse_kv_codec_choice("q8_0", "-ctv", true), KvCodec::Q8_0);
  EXPECT_THROW(parse_kv_codec_choice("qjl", "-ctv", true), Error);  // keys only
  EXPECT_THROW(parse_kv_codec_choice("automatic", "-ctk", false), Error);
}

}  // namespace
}  // namespace sparrow
