// KV codec microbenchmarks (Google Benchmark): throughput of the optimized CPU ops of every registered codec at
// every head dim, single-threaded, next to a memcpy of the same cache bytes.
//
//   encode/<codec>/d:<d>      encode kTokens head vectors into a cache                 (cache bytes written)
//   score/<codec>/d:<d>       one prepared query against kTokens cached blocks          (cache bytes read)
//   accumulate/<codec>/d:<d>  weighted sum of kTokens cached blocks into one accumulator (cache bytes read)
//   expand/<codec>/d:<d>      kTokens cached blocks to basis rows, kExpandTile per call  (cache bytes read;
//                             rows_bytes_per_second: rows written)
//   memcpy/d:<d>              memcpy of kTokens f16 head vectors (2d bytes each)
//   attention/<K>/<V>/d:<d>   one decode step (4 query heads on 1 KV head, Gemma 3 270M's group) over
//                             kAttentionKeys cached keys, one thread              (K+V cache bytes read)
//
// bytes_per_second counts block bytes (the cache), so a codec's figure compares directly with memcpy's and
// with memory bandwidth: a 4-bit codec scoring at the same GB/s as f16 is 4x faster per token, and
// items_per_second gives tokens per second. The cache of kTokens blocks is sized to stay in L2/L3, so these
// measure the kernels, not DRAM. Run through scripts/bench-kv-codecs, which records machine and commit.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/kv_codec.h"

namespace {

using sparrow::formats::KvCodecInfo;
using sparrow::formats::KvCodecOps;

constexpr int kTokens = 2048;
constexpr int kHeadDims[] = {64, 128, 256, 512};
// Blocks per expand call, as attention's kKeyBlock (src/cpu/attention.cpp): the rows stay in L1/L2.
constexpr int kExpandTile = 32;
// Keys of the decode attention benchmark: a long context's global layer (its cache leaves L2).
constexpr int kAttentionKeys = 16384;
constexpr int kAttentionQueryHeads = 4;

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// kTokens encoded head vectors of dimension d, back to back as in a KV cache.
struct Cache {
  Cache(const KvCodecInfo& info, const KvCodecOps& ops, int d)
      : block_bytes(info.block_bytes(d)), x(gaussian(size_t(kTokens) * d, 7)), bytes(kTokens * block_bytes) {
    for (int t = 0; t < kTokens; ++t) ops.encode(x.data() + size_t(t) * d, d, bytes.data() + t * block_bytes);
  }
  size_t block_bytes;
  std::vector<float> x;
  std::vector<uint8_t> bytes;
};

void report(benchmark::State& state, size_t bytes_per_iteration, const KvCodecInfo& info, int d) {
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes_per_iteration));
  state.SetItemsProcessed(int64_t(state.iterations()) * kTokens);
  state.counters["bits_per_element"] = 8.0 * double(info.block_bytes(d)) / d;
}

void encode_bench(benchmark::State& state, const KvCodecInfo* info, int d) {
  const KvCodecOps& ops = sparrow::cpu::kv_codec_ops(info->codec);
  Cache cache(*info, ops, d);
  for (auto _ : state) {
    for (int t = 0; t < kTokens; ++t) {
      ops.encode(cache.x.data() + size_t(t) * d, d, cache.bytes.data() + t * cache.block_bytes);
    }
    benchmark::ClobberMemory();
  }
  report(state, cache.bytes.size(), *info, d);
}

void score_bench(benchmark::State& state, const KvCodecInfo* info, int d) {
  const KvCodecOps& ops = sparrow::cpu::kv_codec_ops(info->codec);
  Cache cache(*info, ops, d);
  const std::vector<float> q = gaussian(d, 11);
  std::vector<float> prepared(info->query_floats(d));
  ops.prepare_query(q.data(), d, prepared.data());
  std::vector<float> scores(kTokens);
  for (auto _ : state) {
    for (int t = 0; t < kTokens; ++t) scores[t] = ops.score(prepared.data(), cache.bytes.data() + t * cache.block_bytes, d);
    benchmark::DoNotOptimize(scores.data());
    benchmark::ClobberMemory();
  }
  report(state, cache.bytes.size(), *info, d);
}

void accumulate_bench(benchmark::State& state, const KvCodecInfo* info, int d) {
  const KvCodecOps& ops = sparrow::cpu::kv_codec_ops(info->codec);
  Cache cache(*info, ops, d);
  std::vector<float> acc(info->accumulator_floats(d), 0.0f);
  const float w = 1.0f / kTokens;
  for (auto _ : state) {
    for (int t = 0; t < kTokens; ++t) ops.accumulate(w, cache.bytes.data() + t * cache.block_bytes, d, acc.data());
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  report(state, cache.bytes.size(), *info, d);
}

void expand_bench(benchmark::State& state, const KvCodecInfo* info, int d) {
  const KvCodecOps& ops = sparrow::cpu::kv_codec_ops(info->codec);
  const sparrow::cpu::ExpandBlocks expand = sparrow::cpu::kv_expand_blocks(info->codec);
  Cache cache(*info, ops, d);
  const size_t row_floats = info->query_floats(d);
  std::vector<float> rows(kExpandTile * row_floats);
  for (auto _ : state) {
    for (int t = 0; t < kTokens; t += kExpandTile) {
      expand(cache.bytes.data() + t * cache.block_bytes, kExpandTile, d, rows.data());
      benchmark::DoNotOptimize(rows.data());
      benchmark::ClobberMemory();
    }
  }
  report(state, cache.bytes.size(), *info, d);
  state.counters["rows_bytes_per_second"] = benchmark::Counter(
      double(state.iterations()) * kTokens * row_floats * sizeof(float), benchmark::Counter::kIsRate);
}

void memcpy_bench(benchmark::State& state, int d) {
  const size_t n = size_t(kTokens) * 2 * d;
  std::vector<uint8_t> src(n, 1), dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
  state.SetItemsProcessed(int64_t(state.iterations()) * kTokens);
}

void attention_bench(benchmark::State& state, sparrow::formats::KvCodec k_codec,
                     sparrow::formats::KvCodec v_codec, int d) {
  using sparrow::formats::kv_codec_info;
  const KvCodecInfo& k_info = kv_codec_info(k_codec);
  const KvCodecInfo& v_info = kv_codec_info(v_codec);
  const size_t k_bytes = size_t(kAttentionKeys) * k_info.block_bytes(d);
  const size_t v_bytes = size_t(kAttentionKeys) * v_info.block_bytes(d);
  std::vector<uint8_t> k(k_bytes), v(v_bytes);
  const std::vector<float> x = gaussian(size_t(kAttentionKeys) * d, 5);
  const KvCodecOps& k_ops = sparrow::cpu::kv_codec_ops(k_codec);
  const KvCodecOps& v_ops = sparrow::cpu::kv_codec_ops(v_codec);
  for (int t = 0; t < kAttentionKeys; ++t) {
    k_ops.encode(x.data() + size_t(t) * d, d, k.data() + t * k_info.block_bytes(d));
    v_ops.encode(x.data() + size_t(t) * d, d, v.data() + t * v_info.block_bytes(d));
  }
  const std::vector<float> q = gaussian(size_t(kAttentionQueryHeads) * d, 13);
  std::vector<float> out(q.size());
  sparrow::AttentionArgs args;
  args.q = q.data();
  args.out = out.data();
  args.n_tokens = 1;
  args.n_heads = kAttentionQueryHeads;
  args.first_position = kAttentionKeys - 1;
  args.scale = 1.0f / std::sqrt(float(d));  // the usual softmax scale: scores spread as in a model
  args.kv = {k_codec, v_codec, k.data(), v.data(), kAttentionKeys, 1, d, nullptr};
  sparrow::cpu::ThreadPool pool(1);
  for (auto _ : state) {
    sparrow::cpu::attention(pool, args);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(k_bytes + v_bytes));
  state.SetItemsProcessed(int64_t(state.iterations()) * kAttentionKeys);
}

void register_all() {
  for (int d : kHeadDims) {
    benchmark::RegisterBenchmark(("memcpy/d:" + std::to_string(d)).c_str(), memcpy_bench, d);
  }
  using Bench = void (*)(benchmark::State&, const KvCodecInfo*, int);
  const std::pair<const char*, Bench> ops[] = {
      {"encode", encode_bench}, {"score", score_bench}, {"accumulate", accumulate_bench}, {"expand", expand_bench}};
  for (const auto& [op, fn] : ops) {
    for (const KvCodecInfo& info : sparrow::formats::kv_codecs()) {
      for (int d : kHeadDims) {
        const std::string name = std::string(op) + "/" + std::string(info.name) + "/d:" + std::to_string(d);
        benchmark::RegisterBenchmark(name.c_str(), fn, &info, d);
      }
    }
  }
  using sparrow::formats::KvCodec;
  const std::pair<KvCodec, KvCodec> pairs[] = {{KvCodec::F16, KvCodec::F16},   {KvCodec::Q8_0, KvCodec::Q8_0},
                                               {KvCodec::Q4_0, KvCodec::Q4_0}, {KvCodec::TBQ4, KvCodec::TBQ4},
                                               {KvCodec::TBQ3, KvCodec::TBQ3}, {KvCodec::Q8_0, KvCodec::TBQ4}};
  for (const auto& [k, v] : pairs) {
    for (int d : {256, 512}) {
      const std::string name = "attention/" + std::string(sparrow::formats::kv_codec_info(k).name) + "/" +
                               std::string(sparrow::formats::kv_codec_info(v).name) + "/d:" + std::to_string(d);
      benchmark::RegisterBenchmark(name.c_str(), attention_bench, k, v, d);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
