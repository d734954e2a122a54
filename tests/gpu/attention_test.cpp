// The CUDA KV-cache writes and fused attention against references written here: caches encoded by the reference
// encoders of formats/, decoded by their reference decoders, and plain softmax attention in double.
#include "cuda/attention.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "formats/kv/kv_codec.h"
#include "gpu_test_util.h"
#include "util/error.h"

namespace {

using sparrow::AttentionArgs;
using sparrow::KvLayerView;
using sparrow::formats::KvCodec;
using sparrow::formats::kv_codec_info;
using sparrow::formats::kv_codecs;

constexpr int kHeadDims[] = {64, 128, 256, 512};

struct Heads {
  int n_heads, n_kv_heads;
};
constexpr Heads kHeadLayouts[] = {{1, 1}, {8, 1}, {8, 2}, {4, 4}};

std::string codec_name(KvCodec codec) { return std::string(kv_codec_info(codec).name); }

// The codec that stores V beside a K codec under test: itself, unless it stores keys only.
KvCodec value_codec_for(KvCodec k) { return kv_codec_info(k).keys_only ? KvCodec::F16 : k; }

using sparrow::testing::DeviceBuffer;
using sparrow::testing::Stream;

std::vector<float> random_floats(size_t n, uint32_t seed, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// One layer's K or V cache as the reference builds it: block (head, slot) at (head * capacity + slot) * block_bytes.
struct HostCache {
  KvCodec codec;
  int d, n_kv_heads;
  int64_t capacity;
  size_t block_bytes;
  std::vector<uint8_t> bytes;

  HostCache(KvCodec c, int head_dim, int kv_heads, int64_t slots)
      : codec(c), d(head_dim), n_kv_heads(kv_heads), capacity(slots),
        block_bytes(kv_codec_info(c).block_bytes(head_dim)), bytes(size_t(kv_heads) * slots * block_bytes) {}

  uint8_t* block(int head, int64_t slot) { return bytes.data() + (head * capacity + slot) * block_bytes; }
  const uint8_t* block(int head, int64_t slot) const { return bytes.data() + (head * capacity + slot) * block_bytes; }

  // rows: [n_positions][n_kv_heads][d] for positions 0..n_positions-1, stored in order (a ring keeps the last).
  void store(const std::vector<float>& rows, int64_t n_positions) {
    for (int64_t p = 0; p < n_positions; ++p)
      for (int h = 0; h < n_kv_heads; ++h)
        kv_codec_info(codec).reference->encode(rows.data() + (p * n_kv_heads + h) * d, d, block(h, p % capacity));
  }

  // Every block decoded: [n_kv_heads][capacity][d].
  std::vector<double> decoded() const {
    std::vector<double> all(size_t(n_kv_heads) * capacity * d);
    std::vector<float> x(d);
    for (int h = 0; h < n_kv_heads; ++h)
      for (int64_t s = 0; s < capacity; ++s) {
        kv_codec_info(codec).reference->decode(block(h, s), d, x.data());
        std::copy(x.begin(), x.end(), all.begin() + (h * capacity + s) * d);
      }
    return all;
  }
};

// One attention call: n_tokens queries at first_position.., over a cache holding positions 0..first_position +
// n_tokens - 1.
struct Shape {
  int64_t n_tokens;
  int32_t first_position;
  int32_t sliding_window = 0;
  int64_t capacity = 0;  // 0: every position has its own slot
};

struct Case {
  KvCodec k_codec, v_codec;
  int d;
  Heads heads;
  Shape shape;

  int64_t n_positions() const { return shape.first_position + shape.n_tokens; }
  int64_t capacity() const { return shape.capacity > 0 ? shape.capacity : n_positions(); }
  float scale() const { return 1.0f / std::sqrt(float(d)); }
  std::string describe() const {
    return "K " + codec_name(k_codec) + ", V " + codec_name(v_codec) + ", d " + std::to_string(d) + ", heads " +
           std::to_string(heads.n_heads) + "/" + std::to_string(heads.n_kv_heads) + ", tokens " +
           std::to_string(shape.n_tokens) + " at " + std::to_string(shape.first_position) + ", window " +
           std::to_string(shape.sliding_window) + ", capacity " + std::to_string(capacity());
  }
};

// Plain softmax attention in double over the decoded cache: query t at position first_position + t sees the keys
// at positions p <= its own (and within the sliding window), read from slot p % capacity.
std::vector<double> reference_attention(const Case& c, const std::vector<float>& q, const std::vector<double>& k,
                                        const std::vector<double>& v) {
  const int d = c.d, group = c.heads.n_heads / c.heads.n_kv_heads;
  const int64_t capacity = c.capacity();
  std::vector<double> out(size_t(c.shape.n_tokens) * c.heads.n_heads * d, 0.0);
  std::vector<double> scores;
  for (int64_t t = 0; t < c.shape.n_tokens; ++t) {
    const int64_t position = c.shape.first_position + t;
    const int64_t first = c.shape.sliding_window > 0 ? std::max<int64_t>(0, position - c.shape.sliding_window + 1) : 0;
    for (int h = 0; h < c.heads.n_heads; ++h) {
      const int kv_head = h / group;
      const float* query = q.data() + (t * c.heads.n_heads + h) * d;
      scores.assign(size_t(position - first + 1), 0.0);
      double max = -INFINITY;
      for (int64_t p = first; p <= position; ++p) {
        const double* key = k.data() + (kv_head * capacity + p % capacity) * d;
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += double(query[i]) * key[i];
        scores[p - first] = dot * c.scale();
        max = std::max(max, scores[p - first]);
      }
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - max));
      double* o = out.data() + (t * c.heads.n_heads + h) * d;
      for (int64_t p = first; p <= position; ++p) {
        const double* value = v.data() + (kv_head * capacity + p % capacity) * d;
        const double w = scores[p - first] / sum;
        for (int i = 0; i < d; ++i) o[i] += w * value[i];
      }
    }
  }
  return out;
}

// The arguments of c's attention call over device buffers.
AttentionArgs attention_args(const Case& c, const float* q, float* out, void* k, void* v) {
  AttentionArgs args;
  args.q = q;
  args.out = out;
  args.n_tokens = c.shape.n_tokens;
  args.n_heads = c.heads.n_heads;
  args.first_position = c.shape.first_position;
  args.sliding_window = c.shape.sliding_window;
  args.scale = c.scale();
  args.kv.k_codec = c.k_codec;
  args.kv.v_codec = c.v_codec;
  args.kv.k = k;
  args.kv.v = v;
  args.kv.capacity = c.capacity();
  args.kv.n_kv_heads = c.heads.n_kv_heads;
  args.kv.head_dim = c.d;
  return args;
}

// cuda::attention over the given cache bytes.
std::vector<float> device_attention(const Case& c, const std::vector<float>& q, const HostCache& k,
                                    const HostCache& v) {
  Stream stream;
  DeviceBuffer<float> q_dev(q), out_dev(q.size());
  DeviceBuffer<uint8_t> k_dev(k.bytes), v_dev(v.bytes);
  sparrow::cuda::AttentionContext ctx(stream.get());
  sparrow::cuda::attention(ctx, attention_args(c, q_dev.get(), out_dev.get(), k_dev.get(), v_dev.get()));
  stream.sync();
  return out_dev.read();
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

// The device computes in float, in the codecs' bases; the reference in double, on decoded vectors. Their outputs
// differ by float rounding (about 1e-6 of the values' size); leaving out or adding one key of a thousand moves an
// output by about 1e-3 of it.
constexpr double kAttentionTolerance = 5e-5;

// A case's inputs: random queries, and a cache of random keys and values encoded by the reference encoders.
struct Inputs {
  std::vector<float> q;
  HostCache k, v;

  Inputs(const Case& c, uint32_t seed)
      : q(random_floats(size_t(c.shape.n_tokens) * c.heads.n_heads * c.d, seed + 2)),
        k(c.k_codec, c.d, c.heads.n_kv_heads, c.capacity()),
        v(c.v_codec, c.d, c.heads.n_kv_heads, c.capacity()) {
    const size_t n = size_t(c.n_positions()) * c.heads.n_kv_heads * c.d;
    k.store(random_floats(n, seed), c.n_positions());
    v.store(random_floats(n, seed + 1), c.n_positions());
  }
};

void expect_output_matches(const Case& c, const Inputs& in, const std::vector<float>& actual) {
  const std::vector<double> v_decoded = in.v.decoded();
  const std::vector<double> expected = reference_attention(c, in.q, in.k.decoded(), v_decoded);
  const double tolerance = kAttentionTolerance * max_abs(v_decoded);
  ASSERT_TRUE(std::all_of(actual.begin(), actual.end(), [](float x) { return std::isfinite(x); }));
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::abs(double(actual[i]) - expected[i]);
    if (err > worst) worst = err, worst_at = i;
  }
  EXPECT_LE(worst, tolerance) << "at output " << worst_at << " (token " << worst_at / (c.heads.n_heads * c.d)
                              << "): device " << actual[worst_at] << ", reference " << expected[worst_at];
}

void expect_attention_matches(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.describe());
  const Inputs in(c, seed);
  expect_output_matches(c, in, device_attention(c, in.q, in.k, in.v));
}

// Decode (one token) at depths 1, 31, 1000 and 5000, and prefill of 7, 64 and 300 tokens from position 0 and from
// a later position; with sliding windows smaller and larger than the context, and rings shorter than the context.
std::vector<Shape> geometry_shapes() {
  std::vector<Shape> shapes;
  for (int32_t depth : {1, 31, 1000, 5000}) shapes.push_back({1, depth});
  shapes.push_back({3, 2000});  // a few tokens deep in the context: several rows per CTA and a split key range
  for (int64_t tokens : {7, 64, 300})
    for (int32_t first : {0, 93}) shapes.push_back({tokens, first});
  // A ring of window + batch slots, as the KV cache gives sliding layers: position p in slot p % capacity.
  shapes.push_back({1, 1000, 100, 101});
  shapes.push_back({1, 5000, 512, 513});
  shapes.push_back({64, 93, 16, 80});
  shapes.push_back({300, 200, 37, 337});
  shapes.push_back({7, 0, 5, 12});
  // Windows wider than the context: nothing is masked beyond causality.
  shapes.push_back({1, 31, 100});
  shapes.push_back({300, 93, 4096});
  return shapes;
}

TEST(CudaAttention, GeometryMatchesReference) {
  SPARROW_REQUIRE_GPU();
  uint32_t seed = 1;
  for (int d : kHeadDims)
    for (Heads heads : kHeadLayouts)
      for (const Shape& shape : geometry_shapes())
        expect_attention_matches({KvCodec::F16, KvCodec::F16, d, heads, shape}, seed += 3);
}

// The backend keeps one context per stream: calls of different sizes, queued back to back with no host
// synchronization, reuse and grow its scratch in stream order.
TEST(CudaAttention, OneContextServesCallsOfGrowingAndShrinkingSize) {
  SPARROW_REQUIRE_GPU();
  const Case cases[] = {{KvCodec::F16, KvCodec::F16, 128, {8, 2}, {1, 31}},
                        {KvCodec::F16, KvCodec::F32, 256, {8, 1}, {300, 0}},
                        {KvCodec::F32, KvCodec::F16, 128, {4, 4}, {1, 5000}},
                        {KvCodec::F16, KvCodec::F16, 64, {8, 2}, {7, 0, 5, 12}}};
  Stream stream;
  sparrow::cuda::AttentionContext ctx(stream.get());
  std::vector<std::unique_ptr<Inputs>> inputs;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> queries, outputs;
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> caches;
  uint32_t seed = 41;
  for (const Case& c : cases) {
    inputs.push_back(std::make_unique<Inputs>(c, seed += 3));
    queries.push_back(std::make_unique<DeviceBuffer<float>>(inputs.back()->q));
    outputs.push_back(std::make_unique<DeviceBuffer<float>>(inputs.back()->q.size()));
    caches.push_back(std::make_unique<DeviceBuffer<uint8_t>>(inputs.back()->k.bytes));
    caches.push_back(std::make_unique<DeviceBuffer<uint8_t>>(inputs.back()->v.bytes));
  }
  for (size_t i = 0; i < std::size(cases); ++i)
    sparrow::cuda::attention(ctx, attention_args(cases[i], queries[i]->get(), outputs[i]->get(),
                                                 caches[2 * i]->get(), caches[2 * i + 1]->get()));
  stream.sync();
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(cases[i].describe());
    expect_output_matches(cases[i], *inputs[i], outputs[i]->read());
  }
}

// GQA groups that do not divide the 16 rows of a CTA (3), fill it exactly (16), or are wider than it (24: a group
// spans CTAs, and a CTA's rows span tokens).
TEST(CudaAttention, WideAndOddGroupsMatchReference) {
  SPARROW_REQUIRE_GPU();
  const Heads layouts[] = {{6, 2}, {32, 2}, {24, 1}};
  const Shape shapes[] = {{1, 1000}, {3, 2000}, {64, 93, 16, 80}, {300, 0}};
  uint32_t seed = 5;
  for (int d : {128, 256})
    for (Heads heads : layouts)
      for (const Shape& shape : shapes)
        expect_attention_matches({KvCodec::F16, KvCodec::F16, d, heads, shape}, seed += 3);
}

// Every codec on the K side and on the V side, at every head dim, in a decode and a ring-buffered prefill.
TEST(CudaAttention, EveryCodecMatchesReference) {
  SPARROW_REQUIRE_GPU();
  const Shape shapes[] = {{1, 1000}, {64, 93, 16, 80}};
  uint32_t seed = 7;
  for (const auto& info : kv_codecs()) {
    for (int d : kHeadDims)
      for (const Shape& shape : shapes) {
        expect_attention_matches({info.codec, value_codec_for(info.codec), d, {8, 2}, shape}, seed += 3);
        if (!info.keys_only) expect_attention_matches({KvCodec::F16, info.codec, d, {8, 2}, shape}, seed += 3);
      }
  }
}

// Attention is one launch when a row block has few CTAs (attention.cu, choose_one_launch): each CTA prepares its
// own queries and the last to finish merges the splits; otherwise prepare_query_kernel and merge_kernel run
// around the flash kernel. Both ways with every codec on either side: on a GPU of 132 multiprocessors a decode at
// depth 1000 takes the first (31 splits of one row) and one at 3000 the second (66 splits of two rows). Each call
// runs twice on one context: the first way's split counters must be left at zero.
TEST(CudaAttention, OneLaunchAndThreeLaunchesMatchReferenceForEveryCodec) {
  SPARROW_REQUIRE_GPU();
  const Shape shapes[] = {{1, 1000}, {1, 3000}};
  bool one_launch = false, three_launches = false;
  uint32_t seed = 13;
  std::vector<std::pair<KvCodec, KvCodec>> pairs;
  for (const auto& info : kv_codecs()) {
    pairs.emplace_back(info.codec, value_codec_for(info.codec));
    if (!info.keys_only) pairs.emplace_back(KvCodec::F16, info.codec);
  }
  for (const auto& [k_codec, v_codec] : pairs)
    for (int d : {128, 512})
      for (const Shape& shape : shapes) {
        const Case c{k_codec, v_codec, d, {8, 2}, shape};
        SCOPED_TRACE(c.describe());
        const Inputs in(c, seed += 3);
        Stream stream;
        DeviceBuffer<float> q_dev(in.q), out_dev(in.q.size());
        DeviceBuffer<uint8_t> k_dev(in.k.bytes), v_dev(in.v.bytes);
        sparrow::cuda::AttentionContext ctx(stream.get());
        const AttentionArgs args = attention_args(c, q_dev.get(), out_dev.get(), k_dev.get(), v_dev.get());
        const sparrow::cuda::AttentionLaunch plan = sparrow::cuda::plan_attention(ctx, args);
        ASSERT_GT(plan.n_splits, 1);
        (plan.prepared == nullptr ? one_launch : three_launches) = true;
        EXPECT_EQ(plan.prepared == nullptr, plan.split_counters != nullptr);
        for (int run = 0; run < 2; ++run) {
          sparrow::cuda::attention(ctx, args);
          stream.sync();
          expect_output_matches(c, in, out_dev.read());
        }
      }
  EXPECT_TRUE(one_launch && three_launches) << "the shapes no longer exercise both ways";
}

// Every K codec with every V codec (both ported), once.
TEST(CudaAttention, EveryCodecPairMatchesReference) {
  SPARROW_REQUIRE_GPU();
  uint32_t seed = 11;
  for (const auto& k : kv_codecs())
    for (const auto& v : kv_codecs()) {
      if (v.keys_only) continue;
      expect_attention_matches({k.codec, v.codec, 128, {4, 2}, {5, 40, 0, 0}}, seed += 3);
    }
}

// ---------------------------------------------------------------------------------------------------------
// kv_store

// Stores positions 0..n_positions-1 in the given batches through cuda::kv_store; returns the K and V cache bytes.
struct StoredCache {
  std::vector<uint8_t> k, v;
};

StoredCache device_store(KvCodec k_codec, KvCodec v_codec, int d, int n_kv, int64_t capacity,
                         const std::vector<float>& keys, const std::vector<float>& values,
                         const std::vector<float>* center, const std::vector<int64_t>& batches) {
  Stream stream;
  const size_t row = size_t(n_kv) * d;
  DeviceBuffer<float> k_dev(keys), v_dev(values);
  DeviceBuffer<uint8_t> k_cache(size_t(n_kv) * capacity * kv_codec_info(k_codec).block_bytes(d));
  DeviceBuffer<uint8_t> v_cache(size_t(n_kv) * capacity * kv_codec_info(v_codec).block_bytes(d));
  std::unique_ptr<DeviceBuffer<float>> center_dev;
  if (center) center_dev = std::make_unique<DeviceBuffer<float>>(*center);
  KvLayerView kv;
  kv.k_codec = k_codec;
  kv.v_codec = v_codec;
  kv.k = k_cache.get();
  kv.v = v_cache.get();
  kv.capacity = capacity;
  kv.n_kv_heads = n_kv;
  kv.head_dim = d;
  kv.k_center = center_dev ? center_dev->get() : nullptr;
  int64_t position = 0;
  for (int64_t n : batches) {
    sparrow::cuda::kv_store(kv, k_dev.get() + position * row, v_dev.get() + position * row, n, int32_t(position),
                            stream.get());
    position += n;
  }
  stream.sync();
  return {k_cache.read(), v_cache.read()};
}

double distance(const std::vector<float>& a, const float* b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(sum);
}

// The device's blocks against the reference encoder's, for the inputs `rows` ([n_positions][n_kv][d], the last
// `capacity` positions held). Float encoders may round a borderline element the other way, so a few blocks may
// differ, but then the device's block must reconstruct its input as well as the reference's.
void expect_blocks_match(const HostCache& expected, const std::vector<uint8_t>& actual, const std::vector<float>& rows,
                         int64_t n_positions) {
  SCOPED_TRACE(codec_name(expected.codec) + ", d " + std::to_string(expected.d));
  ASSERT_EQ(actual.size(), expected.bytes.size());
  const int d = expected.d;
  const auto& ops = *kv_codec_info(expected.codec).reference;
  std::vector<float> from_device(d), from_reference(d);
  int64_t n_blocks = 0, n_different = 0;
  for (int64_t p = std::max<int64_t>(0, n_positions - expected.capacity); p < n_positions; ++p)
    for (int h = 0; h < expected.n_kv_heads; ++h) {
      ++n_blocks;
      const size_t offset = (h * expected.capacity + p % expected.capacity) * expected.block_bytes;
      if (std::memcmp(actual.data() + offset, expected.bytes.data() + offset, expected.block_bytes) == 0) continue;
      ++n_different;
      const float* x = rows.data() + (p * expected.n_kv_heads + h) * d;
      ops.decode(actual.data() + offset, d, from_device.data());
      ops.decode(expected.bytes.data() + offset, d, from_reference.data());
      const double norm = distance(std::vector<float>(d, 0.0f), x);
      EXPECT_LE(distance(from_device, x), 1.05 * distance(from_reference, x) + 1e-6 * norm)
          << "position " << p << ", head " << h << ": the device block reconstructs its input worse";
    }
  EXPECT_LE(n_different, n_blocks / 100) << n_different << " of " << n_blocks << " blocks differ from the reference";
}

// Batches that start at position 0, continue a sequence, and (the last) overrun the ring: only its last
// `capacity` tokens are stored.
TEST(CudaKvStore, WritesReferenceBlocksIntoRingSlots) {
  SPARROW_REQUIRE_GPU();
  const int n_kv = 2;
  const int64_t capacity = 40;
  const std::vector<int64_t> batches = {25, 7, 1, 67};
  const int64_t n_positions = 100;
  uint32_t seed = 21;
  for (const auto& info : kv_codecs()) {
    const KvCodec v_codec = value_codec_for(info.codec);
    for (int d : kHeadDims) {
      const size_t n = size_t(n_positions) * n_kv * d;
      const std::vector<float> keys = random_floats(n, seed++, 0.5f), values = random_floats(n, seed++);
      const std::vector<float> center = random_floats(size_t(n_kv) * d, seed++, 0.5f);
      std::vector<float> centered = keys;
      for (size_t i = 0; i < n; ++i) centered[i] -= center[i % center.size()];
      HostCache k(info.codec, d, n_kv, capacity), v(v_codec, d, n_kv, capacity);
      k.store(centered, n_positions);
      v.store(values, n_positions);
      const StoredCache stored = device_store(info.codec, v_codec, d, n_kv, capacity, keys, values, &center, batches);
      expect_blocks_match(k, stored.k, centered, n_positions);
      expect_blocks_match(v, stored.v, values, n_positions);
    }
  }
}

// End to end, lossless f32 cache: keys with a large common offset, stored centered through kv_store in batches
// into a ring, then attended. Centering shifts every score of a query by one constant, so the result must equal
// plain attention over the original keys and values.
TEST(CudaKvStore, CenteredKeysLeaveAttentionUnchanged) {
  SPARROW_REQUIRE_GPU();
  const int d = 128, n_kv = 2;
  const Heads heads{8, 2};
  const int64_t n_positions = 300, n_tokens = 20, capacity = 120;
  const int32_t window = 100;
  const size_t n = size_t(n_positions) * n_kv * d;
  const std::vector<float> keys = random_floats(n, 31, 3.0f), values = random_floats(n, 32);
  const std::vector<float> q = random_floats(size_t(n_tokens) * heads.n_heads * d, 33);
  std::vector<float> center(size_t(n_kv) * d, 0.0f);
  for (size_t i = 0; i < n; ++i) center[i % center.size()] += keys[i] / n_positions;
  const StoredCache stored = device_store(KvCodec::F32, KvCodec::F32, d, n_kv, capacity, keys, values, &center,
                                          {64, 150, 6, n_positions - 220});

  Case c{KvCodec::F32, KvCodec::F32, d, heads, {n_tokens, int32_t(n_positions - n_tokens), window, capacity}};
  HostCache k(KvCodec::F32, d, n_kv, capacity), v(KvCodec::F32, d, n_kv, capacity);
  k.bytes = stored.k;
  v.bytes = stored.v;
  const std::vector<float> actual = device_attention(c, q, k, v);

  // The reference reads the original keys, uncentered, by position.
  Case plain = c;
  plain.shape.capacity = n_positions;
  const std::vector<double> all_keys(keys.begin(), keys.end()), all_values(values.begin(), values.end());
  std::vector<double> by_slot_k(n), by_slot_v(n);
  for (int64_t p = 0; p < n_positions; ++p)
    for (int h = 0; h < n_kv; ++h)
      for (int i = 0; i < d; ++i) {
        by_slot_k[(h * n_positions + p) * d + i] = all_keys[(p * n_kv + h) * d + i];
        by_slot_v[(h * n_positions + p) * d + i] = all_values[(p * n_kv + h) * d + i];
      }
  const std::vector<double> expected = reference_attention(plain, q, by_slot_k, by_slot_v);
  const double tolerance = kAttentionTolerance * max_abs(by_slot_v);
  for (size_t i = 0; i < expected.size(); ++i)
    ASSERT_NEAR(actual[i], expected[i], tolerance) << "output " << i;
}

// ---------------------------------------------------------------------------------------------------------
// Bad input

KvLayerView valid_view(void* memory) {
  KvLayerView kv;
  kv.k = kv.v = memory;
  kv.capacity = 16;
  kv.n_kv_heads = 2;
  kv.head_dim = 128;
  return kv;
}

TEST(CudaKvStore, RejectsBadGeometryBeforeTouchingTheDevice) {
  char memory[1];
  KvLayerView kv = valid_view(memory);
  kv.head_dim = 96;
  EXPECT_THROW(sparrow::cuda::kv_store(kv, nullptr, nullptr, 1, 0, nullptr), sparrow::Error);
  kv = valid_view(memory);
  kv.capacity = 0;
  EXPECT_THROW(sparrow::cuda::kv_store(kv, nullptr, nullptr, 1, 0, nullptr), sparrow::Error);
  kv = valid_view(memory);
  kv.v_codec = KvCodec::QJL;
  EXPECT_THROW(sparrow::cuda::kv_store(kv, nullptr, nullptr, 1, 0, nullptr), sparrow::Error);
}

TEST(CudaAttention, RejectsBadArguments) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  sparrow::cuda::AttentionContext ctx(stream.get());
  DeviceBuffer<float> buffer(1);
  AttentionArgs args;
  args.q = args.out = buffer.get();
  args.n_tokens = 1;
  args.n_heads = 8;
  args.kv = valid_view(buffer.get());
  args.n_heads = 3;  // not a multiple of the 2 KV heads
  EXPECT_THROW(sparrow::cuda::attention(ctx, args), sparrow::Error);
  args.n_heads = 8;
  args.kv.head_dim = 100;
  EXPECT_THROW(sparrow::cuda::attention(ctx, args), sparrow::Error);
  args.kv.head_dim = 128;
  args.kv.v_codec = KvCodec::QJL;
  EXPECT_THROW(sparrow::cuda::attention(ctx, args), sparrow::Error);
}

}  // namespace
