// The device KV codec ops (cuda/kv/kv_ops.h) against the reference ops of formats/kv/: every codec x head dim x
// op on random inputs from fixed seeds, and every cell of the committed fixtures through the verify engine.
//
// Tolerances, and why:
//   encode         the device's bytes equal the reference's (both sum norms and projections in double in the same
//                  order and round the same products). polar4 only: its angles come from the device's atan2, which
//                  may differ from glibc's in the last bit of a double, so up to 0.2% of the elements may decode
//                  differently (a code flipped at a cell boundary); the rest must decode identically.
//   decode         exactly the reference's values (sparrow verify demands it too).
//   prepare_query  within 1e-6 of max(|ref_i|, rms(ref)): the same butterflies and ordered double sums, so
//                  identical in practice; the margin only allows a different rounding of a double sum.
//   finish         likewise, 1e-6.
//   score          within 1e-4 of max(|ref|, |q| |x^|): float sums in another order than the reference's doubles.
//   accumulate     within 1e-4 of max(|ref_i|, rms(ref)): float sums, with fused multiply-adds.
#include "cuda/kv/kv_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_check.h"
#include "formats/kv/kv_codec.h"
#include "formats/kv/seeded_random.h"
#include "gpu_test_util.h"
#include "util/error.h"
#include "verify/fixture.h"
#include "verify/target.h"
#include "verify/verify.h"

namespace {

using sparrow::formats::KvCodec;
using sparrow::formats::KvCodecInfo;
using sparrow::formats::kv_codec_info;

// A device copy of a host vector, copied back on request.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_ > 0) SPARROW_CUDA_CHECK(cudaMalloc(&data_, sizeof(T) * n_));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    if (n_ > 0) SPARROW_CUDA_CHECK(cudaMemcpy(data_, host.data(), sizeof(T) * n_, cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return data_; }
  std::vector<T> to_host() const {
    SPARROW_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> host(n_);
    if (n_ > 0) SPARROW_CUDA_CHECK(cudaMemcpy(host.data(), data_, sizeof(T) * n_, cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  size_t n_;
  T* data_ = nullptr;
};

TEST(CudaKvCodecs, EveryFixtureCellPasses) {
  SPARROW_REQUIRE_GPU();
  const sparrow::verify::Fixtures fixtures = sparrow::verify::load_fixtures(SPARROW_SOURCE_DIR "/tests/fixtures/kv");
  // The same path as `sparrow verify --backend cuda`: the CUDA Backend's batched codec ops.
  const sparrow::verify::Report report = sparrow::verify::run_verify(sparrow::verify::make_target("cuda"), fixtures);
  const size_t expected_cells = sparrow::formats::kv_codecs().size() * sparrow::verify::kOps.size() *
                                sparrow::verify::kHeadDims.size();
  EXPECT_EQ(report.cells.size(), expected_cells);
  for (const sparrow::verify::Cell& cell : report.cells) {
    if (cell.status == sparrow::verify::CellStatus::Passed) continue;
    ADD_FAILURE() << cell.codec << " " << sparrow::verify::op_name(cell.op) << " d=" << cell.head_dim << ": "
                  << sparrow::verify::status_name(cell.status) << ", " << cell.passed << "/" << cell.total
                  << " cases, max error " << cell.max_err << ": " << cell.note;
  }
  EXPECT_EQ(report.count(sparrow::verify::CellStatus::Passed), int(expected_cells));
}

// ---------------------------------------------------------------------------------------------------------
// Random inputs against the reference ops.

constexpr int kVectors = 40, kQueries = 5, kSequences = 3;

struct RandomCase {
  int d = 0;
  std::vector<float> vectors, queries, weights, accumulators;
};

// Gaussian vectors at several scales (a tenth of them 1000x larger, a few 1e-3x), Gaussian queries, softmax
// weights for all but the last sequence (signed Gaussian), Gaussian accumulators for finish.
RandomCase make_case(const KvCodecInfo& info, int d) {
  sparrow::formats::SeededRandom rng(0xC0DEC5ull * 1009 + uint64_t(info.codec) * 4096 + uint64_t(d));
  RandomCase c;
  c.d = d;
  const auto normals = [&](size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * float(rng.normal());
    return v;
  };
  for (int i = 0; i < kVectors; ++i) {
    const float scale = i % 10 == 3 ? 1000.0f : i % 10 == 7 ? 1e-3f : 1.0f;
    const std::vector<float> x = normals(size_t(d), scale);
    c.vectors.insert(c.vectors.end(), x.begin(), x.end());
  }
  c.queries = normals(size_t(kQueries) * d, 1.0f);
  for (int s = 0; s < kSequences; ++s) {
    std::vector<float> w = normals(kVectors, 2.0f);
    if (s + 1 < kSequences) {
      double total = 0;
      for (float& x : w) total += (x = std::exp(x));
      for (float& x : w) x = float(x / total);
    }
    c.weights.insert(c.weights.end(), w.begin(), w.end());
  }
  c.accumulators = normals(size_t(kSequences) * info.accumulator_floats(d), 1.0f);
  return c;
}

// |got - want| / max(|want_i|, rms(want)) over a row, the largest; NaN against NaN counts as equal.
double max_relative_error(const float* got, const float* want, size_t n) {
  double sum_sq = 0;
  for (size_t i = 0; i < n; ++i) sum_sq += double(want[i]) * want[i];
  const double floor = n ? std::sqrt(sum_sq / double(n)) : 0.0;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    const double scale = std::max(std::fabs(double(want[i])), floor);
    const double err = std::fabs(double(got[i]) - double(want[i])) / scale;
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  return worst;
}

bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

class CudaKvCodecOps : public testing::TestWithParam<std::tuple<KvCodec, int>> {
 protected:
  void SetUp() override {
    SPARROW_REQUIRE_GPU();
    info_ = &kv_codec_info(std::get<0>(GetParam()));
    d_ = std::get<1>(GetParam());
    case_ = make_case(*info_, d_);
    block_bytes_ = info_->block_bytes(d_);
    for (int v = 0; v < kVectors; ++v) {
      std::vector<uint8_t> block(block_bytes_);
      info_->reference->encode(vector(v), d_, block.data());
      ref_blocks_.insert(ref_blocks_.end(), block.begin(), block.end());
    }
  }
  std::string label(const char* op) const {
    return std::string(info_->name) + " d=" + std::to_string(d_) + " " + op;
  }
  const float* vector(int v) const { return case_.vectors.data() + size_t(v) * d_; }
  const uint8_t* ref_block(int v) const { return ref_blocks_.data() + size_t(v) * block_bytes_; }
  std::vector<float> ref_decode(const uint8_t* block) const {
    std::vector<float> x(d_);
    info_->reference->decode(block, d_, x.data());
    return x;
  }

  const KvCodecInfo* info_ = nullptr;
  int d_ = 0;
  size_t block_bytes_ = 0;
  RandomCase case_;
  std::vector<uint8_t> ref_blocks_;
};

TEST_P(CudaKvCodecOps, EncodeWritesTheReferenceBlocks) {
  DeviceArray<float> x(case_.vectors);
  DeviceArray<uint8_t> blocks(ref_blocks_.size());
  sparrow::cuda::kv_encode(info_->codec, d_, x.get(), kVectors, blocks.get(), nullptr);
  const std::vector<uint8_t> got = blocks.to_host();
  if (info_->codec != KvCodec::POLAR4) {
    for (int v = 0; v < kVectors; ++v) {
      const uint8_t* block = got.data() + size_t(v) * block_bytes_;
      const auto diff = std::mismatch(block, block + block_bytes_, ref_block(v));
      ASSERT_TRUE(diff.first == block + block_bytes_)
          << label("encode") << ": vector " << v << " byte " << (diff.first - block) << " is "
          << int(*diff.first) << ", reference " << int(*diff.second) << "; max error of the decoded vector "
          << max_relative_error(ref_decode(block).data(), ref_decode(ref_block(v)).data(), size_t(d_));
    }
    return;
  }
  int differing = 0;
  double max_error = 0;
  for (int v = 0; v < kVectors; ++v) {
    const std::vector<float> mine = ref_decode(got.data() + size_t(v) * block_bytes_), want = ref_decode(ref_block(v));
    for (int i = 0; i < d_; ++i) differing += !same_value(mine[i], want[i]);
    max_error = std::max(max_error, max_relative_error(mine.data(), want.data(), size_t(d_)));
  }
  EXPECT_LE(differing, kVectors * d_ / 500) << label("encode") << ": " << differing << " of " << kVectors * d_
                                             << " elements decode differently; max error " << max_error;
}

TEST_P(CudaKvCodecOps, DecodeGivesTheReferenceValues) {
  DeviceArray<uint8_t> blocks(ref_blocks_);
  DeviceArray<float> x(size_t(kVectors) * d_);
  sparrow::cuda::kv_decode(info_->codec, d_, blocks.get(), kVectors, x.get(), nullptr);
  const std::vector<float> got = x.to_host();
  for (int v = 0; v < kVectors; ++v) {
    const std::vector<float> want = ref_decode(ref_block(v));
    const float* mine = got.data() + size_t(v) * d_;
    for (int i = 0; i < d_; ++i) {
      ASSERT_TRUE(same_value(mine[i], want[i]))
          << label("decode") << ": vector " << v << " element " << i << " is " << mine[i] << ", reference "
          << want[i] << "; max error " << max_relative_error(mine, want.data(), size_t(d_));
    }
  }
}

TEST_P(CudaKvCodecOps, PrepareQueryMatchesTheReference) {
  const size_t qf = info_->query_floats(d_);
  DeviceArray<float> q(case_.queries);
  DeviceArray<float> prepared(size_t(kQueries) * qf);
  sparrow::cuda::kv_prepare_query(info_->codec, d_, q.get(), kQueries, prepared.get(), nullptr);
  const std::vector<float> got = prepared.to_host();
  std::vector<float> want(qf);
  for (int i = 0; i < kQueries; ++i) {
    info_->reference->prepare_query(case_.queries.data() + size_t(i) * d_, d_, want.data());
    const double err = max_relative_error(got.data() + i * qf, want.data(), qf);
    EXPECT_LE(err, 1e-6) << label("prepare_query") << ": query " << i << ", max error " << err;
  }
}

TEST_P(CudaKvCodecOps, ScoreMatchesTheReference) {
  DeviceArray<float> q(case_.queries);
  DeviceArray<uint8_t> blocks(ref_blocks_);
  DeviceArray<float> scores(size_t(kQueries) * kVectors);
  sparrow::cuda::kv_score(info_->codec, d_, q.get(), kQueries, blocks.get(), kVectors, scores.get(), nullptr);
  const std::vector<float> got = scores.to_host();
  std::vector<float> prepared(info_->query_floats(d_));
  double max_error = 0;
  for (int i = 0; i < kQueries; ++i) {
    const float* query = case_.queries.data() + size_t(i) * d_;
    info_->reference->prepare_query(query, d_, prepared.data());
    double q_norm = 0;
    for (int e = 0; e < d_; ++e) q_norm += double(query[e]) * query[e];
    for (int v = 0; v < kVectors; ++v) {
      const float want = info_->reference->score(prepared.data(), ref_block(v), d_);
      const std::vector<float> x = ref_decode(ref_block(v));
      double x_norm = 0;
      for (float e : x) x_norm += double(e) * e;
      const double scale = std::max(std::fabs(double(want)), std::sqrt(q_norm * x_norm));
      const double err = std::fabs(double(got[size_t(i) * kVectors + v]) - want) / scale;
      max_error = std::max(max_error, std::isnan(err) ? INFINITY : err);
    }
  }
  EXPECT_LE(max_error, 1e-4) << label("score") << ": max error " << max_error;
}

TEST_P(CudaKvCodecOps, AccumulateMatchesTheReference) {
  const size_t af = info_->accumulator_floats(d_);
  DeviceArray<float> weights(case_.weights);
  DeviceArray<uint8_t> blocks(ref_blocks_);
  DeviceArray<float> acc(size_t(kSequences) * af);
  sparrow::cuda::kv_accumulate(info_->codec, d_, weights.get(), kSequences, blocks.get(), kVectors, acc.get(),
                               nullptr);
  const std::vector<float> got = acc.to_host();
  for (int s = 0; s < kSequences; ++s) {
    std::vector<float> want(af, 0.0f);
    for (int v = 0; v < kVectors; ++v)
      info_->reference->accumulate(case_.weights[size_t(s) * kVectors + v], ref_block(v), d_, want.data());
    const double err = max_relative_error(got.data() + s * af, want.data(), af);
    EXPECT_LE(err, 1e-4) << label("accumulate") << ": sequence " << s << ", max error " << err;
  }
}

TEST_P(CudaKvCodecOps, FinishMatchesTheReference) {
  const size_t af = info_->accumulator_floats(d_);
  DeviceArray<float> acc(case_.accumulators);
  DeviceArray<float> out(size_t(kSequences) * d_);
  sparrow::cuda::kv_finish(info_->codec, d_, acc.get(), kSequences, out.get(), nullptr);
  const std::vector<float> got = out.to_host();
  std::vector<float> want(d_);
  for (int s = 0; s < kSequences; ++s) {
    info_->reference->finish(case_.accumulators.data() + s * af, d_, want.data());
    const double err = max_relative_error(got.data() + size_t(s) * d_, want.data(), size_t(d_));
    EXPECT_LE(err, 1e-6) << label("finish") << ": accumulator " << s << ", max error " << err;
  }
}

std::vector<KvCodec> all_codecs() {
  std::vector<KvCodec> codecs;
  for (const KvCodecInfo& info : sparrow::formats::kv_codecs()) codecs.push_back(info.codec);
  return codecs;
}

INSTANTIATE_TEST_SUITE_P(EveryCodecAndHeadDim, CudaKvCodecOps,
                         testing::Combine(testing::ValuesIn(all_codecs()), testing::Values(64, 128, 256, 512)),
                         [](const testing::TestParamInfo<std::tuple<KvCodec, int>>& p) {
                           return std::string(kv_codec_info(std::get<0>(p.param)).name) + "_d" +
                                  std::to_string(std::get<1>(p.param));
                         });

// ---------------------------------------------------------------------------------------------------------
// Bad arguments: refused before anything touches the device, so these run on any machine.

TEST(CudaKvCodecArguments, UnsupportedHeadDimIsAnError) {
  try {
    sparrow::cuda::kv_encode(KvCodec::TBQ4, 96, nullptr, 0, nullptr, nullptr);
    FAIL() << "kv_encode accepted head dim 96";
  } catch (const sparrow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 96"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tbq4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sparrow::cuda::kv_decode(KvCodec::F16, 100, nullptr, 0, nullptr, nullptr), sparrow::Error);
  EXPECT_THROW(sparrow::cuda::kv_score(KvCodec::QJL, 32, nullptr, 0, nullptr, 0, nullptr, nullptr), sparrow::Error);
  EXPECT_THROW(sparrow::cuda::kv_accumulate(KvCodec::TCQ3, 1024, nullptr, 0, nullptr, 0, nullptr, nullptr),
               sparrow::Error);
  EXPECT_THROW(sparrow::cuda::kv_finish(KvCodec::POLAR4, 0, nullptr, 0, nullptr, nullptr), sparrow::Error);
  EXPECT_THROW(sparrow::cuda::kv_prepare_query(KvCodec::Q4_0, 48, nullptr, 0, nullptr, nullptr), sparrow::Error);
}

TEST(CudaKvCodecArguments, NegativeCountsAndNullBuffersAreErrors) {
  EXPECT_THROW(sparrow::cuda::kv_encode(KvCodec::F32, 128, nullptr, -1, nullptr, nullptr), sparrow::Error);
  EXPECT_THROW(sparrow::cuda::kv_decode(KvCodec::TBQ3, 128, nullptr, 4, nullptr, nullptr), sparrow::Error);
  EXPECT_THROW(sparrow::cuda::kv_score(KvCodec::TBQ4P, 64, nullptr, 2, nullptr, 3, nullptr, nullptr),
               sparrow::Error);
}

TEST(CudaKvCodecArguments, EmptyBatchesDoNothing) {
  // No vectors: nothing to launch, so no device is needed and null buffers are fine.
  EXPECT_NO_THROW(sparrow::cuda::kv_encode(KvCodec::TCQ2, 256, nullptr, 0, nullptr, nullptr));
  EXPECT_NO_THROW(sparrow::cuda::kv_score(KvCodec::F16, 512, nullptr, 0, nullptr, 0, nullptr, nullptr));
}

}  // namespace
