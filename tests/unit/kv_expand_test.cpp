// cpu::kv_expand_blocks, the attention's batched view of a KV codec, against the reference ops of every codec at
// every head dim and on every SIMD target compiled in: each expanded row is the reference accumulate(1, block)
// from zero, its inner product with a reference-prepared query is the reference score, and one call expands
// exactly n blocks (n = 1, 3, 64; none at n = 0) at the blocks' own stride.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/kv_codec.h"
#include "kv_codec_test_util.h"
#include "util/error.h"

namespace sparrow {
namespace {

using formats::KvCodec;
using formats::KvCodecInfo;
using formats::SeededRandom;
using namespace kv_codec_test;

constexpr int kBlocks = 64;                         // encoded per codec and head dim
constexpr int kBlockCounts[] = {0, 1, 3, kBlocks};  // blocks per expand call: the last n of the kBlocks
constexpr float kUntouched = -1234.5f;              // fills the row after the last expanded one

// kBlocks reference-encoded head vectors, back to back as in a KV cache, with their reference rows
// (accumulate(1, block) onto zeros) and one reference-prepared random query per block.
struct EncodedCache {
  EncodedCache(const KvCodecInfo& info, int d, uint64_t seed)
      : block_bytes(info.block_bytes(d)), row_floats(info.query_floats(d)), bytes(kBlocks * block_bytes),
        rows(kBlocks * row_floats, 0.0f), queries(kBlocks * row_floats) {
    const formats::KvCodecOps& ref = *info.reference;
    SeededRandom rng(seed);
    for (int j = 0; j < kBlocks; ++j) {
      // Norms spread over four decades, so that a row scaled by another block's norm would show.
      std::vector<float> x = heavy_tailed(rng, d);
      const float magnitude = float(std::pow(10.0, 4.0 * rng.uniform() - 2.0));
      for (float& v : x) v *= magnitude;
      ref.encode(x.data(), d, block(j));
      ref.accumulate(1.0f, block(j), d, reference_row(j));
      ref.prepare_query(gaussian(rng, d).data(), d, queries.data() + j * row_floats);
    }
  }
  uint8_t* block(int j) { return bytes.data() + j * block_bytes; }
  float* reference_row(int j) { return rows.data() + j * row_floats; }
  const float* query(int j) const { return queries.data() + j * row_floats; }

  size_t block_bytes, row_floats;
  std::vector<uint8_t> bytes;
  std::vector<float> rows, queries;
};

std::string describe(const KvCodecInfo& info, int d, int n, int j) {
  return std::string(info.name) + " d=" + std::to_string(d) + " n=" + std::to_string(n) + " row " +
         std::to_string(j);
}

// Expands the last n blocks of the cache (plus a guard row) on the current target and checks every row.
void expect_rows_match_reference(const KvCodecInfo& info, int d, EncodedCache& cache, int n) {
  const int first = kBlocks - n;
  std::vector<float> rows((n + 1) * cache.row_floats, kUntouched);
  cpu::kv_expand_blocks(info.codec)(cache.block(first), n, d, rows.data());
  for (int j = 0; j < n; ++j) {
    const float* row = rows.data() + j * cache.row_floats;
    const float* expected = cache.reference_row(first + j);
    float max_abs = 0;
    for (size_t i = 0; i < cache.row_floats; ++i) max_abs = std::max(max_abs, std::fabs(expected[i]));
    ASSERT_GT(max_abs, 0.0f) << describe(info, d, n, j);
    for (size_t i = 0; i < cache.row_floats; ++i)
      ASSERT_NEAR(row[i], expected[i], 1e-6 * max_abs) << describe(info, d, n, j) << " element " << i;

    // <q', row> against the reference score, relative to sum |q'_i row_i| (the size of the terms summed).
    const float* q = cache.query(first + j);
    double dot_with_row = 0, magnitude = 0;
    for (size_t i = 0; i < cache.row_floats; ++i) {
      dot_with_row += double(q[i]) * row[i];
      magnitude += std::fabs(double(q[i]) * row[i]);
    }
    const float score = info.reference->score(q, cache.block(first + j), d);
    EXPECT_NEAR(dot_with_row, score, 1e-5 * magnitude) << describe(info, d, n, j);
  }
  const float* guard = rows.data() + n * cache.row_floats;
  for (size_t i = 0; i < cache.row_floats; ++i)
    ASSERT_EQ(guard[i], kUntouched) << info.name << " d=" << d << " n=" << n << ": wrote past row n, element " << i;
}

class KvExpand : public testing::TestWithParam<KvCodec> {};

TEST_P(KvExpand, RowsAreReferenceAccumulateAndScoreOnEveryTarget) {
  const KvCodecInfo& info = formats::kv_codec_info(GetParam());
  for (int d : kHeadDims) {
    EncodedCache cache(info, d, 1000 + d);
    for_each_simd_target([&] {
      for (int n : kBlockCounts) expect_rows_match_reference(info, d, cache, n);
    });
  }
}

TEST_P(KvExpand, RejectsUnsupportedHeadDims) {
  const cpu::ExpandBlocks expand = cpu::kv_expand_blocks(GetParam());
  std::vector<uint8_t> blocks(4096);
  std::vector<float> rows(4096);
  for (int d : {0, 32, 96, 1024}) EXPECT_THROW(expand(blocks.data(), 1, d, rows.data()), Error) << "d=" << d;
}

std::vector<KvCodec> all_codecs() {
  std::vector<KvCodec> codecs;
  for (const KvCodecInfo& info : formats::kv_codecs()) codecs.push_back(info.codec);
  return codecs;
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, KvExpand, testing::ValuesIn(all_codecs()),
                         [](const testing::TestParamInfo<KvCodec>& p) {
                           return std::string(formats::kv_codec_info(p.param).name);
                         });

}  // namespace
}  // namespace sparrow
