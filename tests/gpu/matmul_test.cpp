// CUDA matmul and get_rows for every weight format, against a host reference written here: formats::dequantize_row
// (itself bit-exact with ggml, tests/unit/weight_formats_test.cpp) followed by a double-precision dot product with
// the activations as the CPU multiplies them (formats::round_activations: rounded to f16 / bf16, or ggml's
// 8-bit groups), which the GPU must reproduce; and the GPU's activation quantization against the reference's bits.
// Every case logs its format, shape, token count and the largest error seen relative to its bound, so that a
// log from a GPU machine says how much room each bound leaves.
#include "cuda/matmul.h"
#include "cuda/matmul_half.h"
#include "cuda/matmul_int8.h"

#include "cuda/activations.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/cuda_check.h"
#include "formats/weight_formats.h"
#include "gpu_test_util.h"
#include "random_weights.h"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

using testing::DeviceBuffer;
using testing::random_activations;
using testing::random_weights;
using testing::Stream;

std::string name_of(TensorType type) { return tensor_type_name(type); }

size_t row_bytes(TensorType type, int64_t n_in) { return tensor_row_bytes(type, n_in); }

std::vector<float> dequantized(TensorType type, const std::vector<uint8_t>& bytes, int64_t n_in, int64_t n_out) {
  std::vector<float> w(size_t(n_in * n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    formats::dequantize_row(type, bytes.data() + size_t(o) * row_bytes(type, n_in), w.data() + o * n_in, n_in);
  }
  return w;
}

// Bound on |gpu - exact| per output, as a multiple of sum_i |w_i x_i| (the scale of every rounding error):
//  - GEMV (n_tokens <= kMaxGemvTokens): weights decoded exactly, products and sums in fp32. A lane owns every
//    32nd run of 8 elements, so it sums at most 8 * ceil(n_in / 256) products in sequence (one rounding each in
//    an fmaf), then 5 shuffle levels add the lanes: at most that many + 5 roundings of 2^-24 along any path (the
//    classic gamma_n bound of recursive summation), with 1% slack.
//  - GEMM, f16 / bf16 (matmul_half.h): products of 16-bit values are exact in fp32; each mma sums 16 of them
//    from zero, the tensor core aligning them to the largest and truncating, at most 2^-23 of the largest per
//    addend (17 addends on a two-pass tensor core: 34 units of 2^-24 of the partial's absolute sum); the
//    partials, one per 16 elements, are added with rounded fp32 adds: n_in / 16 more roundings. (A sum accumulated inside the mma
//    across all of n_in would be bounded only by about n_in units.)
//  - GEMM, f32 (cuBLAS, full fp32): at most n_in roundings of 2^-24 in cuBLAS's order (blocked summation does
//    better; this is the plain recursive bound).
double relative_bound(TensorType type, int64_t n_in, int64_t n_tokens) {
  if (n_tokens <= kMaxGemvTokens) return double(8 * ((n_in + 255) / 256) + 5) * 0x1.0p-24 * 1.01;
  if (type == TensorType::F16 || type == TensorType::BF16) return double((n_in + 15) / 16 + 34) * 0x1.0p-24;
  return double(n_in + 1) * 0x1.0p-24;
}

struct Shape {
  int64_t n_in, n_out;
};

// Runs one product and checks every output; returns the largest error / bound ratio seen.
double check_matmul(MatmulContext& ctx, const Stream& stream, TensorType type, Shape s, int64_t n_tokens,
                    uint32_t seed) {
  const auto bytes = random_weights(type, s.n_in, s.n_out, seed);
  const auto w = dequantized(type, bytes, s.n_in, s.n_out);
  const auto x = random_activations(s.n_in * n_tokens, seed + 1);
  std::vector<float> x_as_multiplied(x.size());
  formats::round_activations(formats::weight_format(type, "test").activation, x.data(), int64_t(x.size()),
                             x_as_multiplied.data());
  DeviceBuffer<uint8_t> w_dev(bytes);
  DeviceBuffer<float> x_dev(x), y_dev(size_t(n_tokens * s.n_out));
  y_dev.poison();
  matmul(ctx, WeightMatrix{type, w_dev.get(), s.n_in, s.n_out}, x_dev.get(), n_tokens, y_dev.get());
  stream.sync();
  const std::vector<float> y = y_dev.read();

  const double relative = relative_bound(type, s.n_in, n_tokens);
  double worst_ratio = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t o = 0; o < s.n_out; ++o) {
      double want = 0, abs_dot = 0;
      for (int64_t i = 0; i < s.n_in; ++i) {
        const double term = double(w[size_t(o * s.n_in + i)]) * x_as_multiplied[size_t(t * s.n_in + i)];
        want += term;
        abs_dot += std::fabs(term);
      }
      const double got = y[size_t(t * s.n_out + o)];
      const double bound = relative * abs_dot + 1e-30;
      const double error = std::fabs(got - want);
      if (!(error <= bound)) {  // also catches NaN: an output never written
        ADD_FAILURE() << name_of(type) << " n_in=" << s.n_in << " n_out=" << s.n_out << " tokens=" << n_tokens
                      << " token " << t << " row " << o << ": got " << got << ", want " << want << ", error "
                      << error << " > bound " << bound;
        return error / bound;
      }
      worst_ratio = std::max(worst_ratio, error / bound);
    }
  }
  return worst_ratio;
}

TEST(CudaMatmul, MatchesDequantizedDoubleDotForEveryFormatShapeAndTokenCount) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  uint32_t seed = 1;
  for (const formats::WeightFormat& format : formats::kWeightFormats) {
    // Block types are multiplied on their 8-bit codes, checked against their own reference (ggml's activation
    // sums) by CudaMatmulInt8.*, through this entry too.
    if (matmul_int8_supports(format.type)) continue;
    for (Shape s : {Shape{256, 67}, Shape{2816, 33}, Shape{8192, 5}}) {
      for (int64_t n_tokens : {1, 2, 3, 7, 8, 9, 33, 512}) {
        const double ratio = check_matmul(ctx, stream, format.type, s, n_tokens, seed++);
        std::printf("matmul %-5s n_in=%-5lld n_out=%-3lld tokens=%-3lld path=%-4s max error / bound = %.3g\n",
                    name_of(format.type).c_str(), (long long)s.n_in, (long long)s.n_out, (long long)n_tokens,
                    n_tokens <= kMaxGemvTokens ? "gemv" : "gemm", ratio);
        if (HasFailure()) return;
      }
    }
  }
}

// Products of one input (q, k and v; gate and up) as matmuls runs them: the input converted once per run of
// targets and one GEMV launch per run of one block type, which must give each output bit for bit what matmul
// gives it alone (the same codes, the same per-row sums). Groups cover one type, block types whose activations
// share a format (Q4_K, Q6_K: Q8_K), formats that differ (Q8_0 then Q4_K), float types between block types (the
// float path reuses the 8-bit buffers), more matrices than one launch takes, and decode and prefill token counts.
TEST(CudaMatmul, MatmulsGiveEachOutputWhatOneMatmulGivesIt) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  using T = TensorType;
  struct Group {
    std::vector<std::pair<T, int64_t>> matrices;  // type, n_out
    int64_t n_in;
  };
  const std::vector<Group> groups = {
      {{{T::Q8_0, 96}, {T::Q8_0, 16}, {T::Q8_0, 16}}, 512},
      {{{T::Q4_K, 40}, {T::Q4_K, 8}, {T::Q6_K, 8}}, 768},
      {{{T::Q8_0, 33}, {T::Q4_K, 17}, {T::F16, 9}, {T::Q4_K, 12}}, 256},
      {{{T::Q5_0, 7}, {T::Q5_0, 9}, {T::Q5_0, 11}, {T::Q5_0, 13}, {T::Q5_0, 15}, {T::F32, 4}}, 320},
  };
  uint32_t seed = 500;
  for (const Group& g : groups) {
    for (int64_t n_tokens : {1, 5, 8, 9, 70}) {
      const auto x = random_activations(size_t(g.n_in * n_tokens), seed++);
      DeviceBuffer<float> x_dev(x);
      std::deque<DeviceBuffer<uint8_t>> weights;  // deque: buffers stay where they are
      std::deque<DeviceBuffer<float>> together, alone;
      std::vector<MatmulTarget> targets;
      for (const auto& [type, n_out] : g.matrices) {
        weights.emplace_back(random_weights(type, g.n_in, n_out, seed++));
        together.emplace_back(size_t(n_tokens * n_out));
        alone.emplace_back(size_t(n_tokens * n_out));
        together.back().poison();
        targets.push_back({WeightMatrix{type, weights.back().get(), g.n_in, n_out}, together.back().get()});
      }
      matmul(ctx, x_dev.get(), n_tokens, targets);
      for (size_t m = 0; m < targets.size(); ++m) matmul(ctx, targets[m].w, x_dev.get(), n_tokens, alone[m].get());
      stream.sync();
      for (size_t m = 0; m < targets.size(); ++m) {
        const std::vector<float> a = together[m].read(), b = alone[m].read();
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << "matrix " << m << " (" << name_of(targets[m].w.type) << ") of a group of " << targets.size()
            << ", n_in " << g.n_in << ", " << n_tokens << " tokens";
      }
    }
  }
}

// The activation conversion alone: every format, bit for bit against the reference, with groups that are all
// zero, outliers, and values halfway between two 8-bit steps (where rounding to even matters).
TEST(CudaActivations, QuantizeAndRoundBitForBitLikeTheReference) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  const int64_t n_tokens = 5, n_in = 2048;
  std::vector<float> x = random_activations(n_tokens * n_in, 31);
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero Q8_K group (and eight Q8_0 groups)
  for (int64_t i = 600; i < 632; ++i) x[size_t(i)] = 0.5f * float(i - 616);  // amax 7.5: x * 127 / amax ties
  DeviceBuffer<float> x_dev(x);
  const formats::ActivationFormat formats_to_check[] = {
      formats::ActivationFormat::F16, formats::ActivationFormat::BF16, formats::ActivationFormat::Q8_0,
      formats::ActivationFormat::Q8_1, formats::ActivationFormat::Q8_K};
  for (formats::ActivationFormat format : formats_to_check) {
    const int group = formats::activation_group(format);
    const size_t n = x.size();
    DeviceBuffer<float> rounded(n);
    DeviceBuffer<uint16_t> half(n);
    DeviceBuffer<int8_t> q(n);
    DeviceBuffer<float> scale(group ? n / size_t(group) : 1), sum32(n / 32);
    rounded.poison();
    ActivationOutputs out{rounded.get()};
    if (group == 0) out.half = half.get();
    else out.q = q.get(), out.scale = scale.get(), out.sum32 = sum32.get();
    quantize_activations(stream.get(), format, x_dev.get(), n_tokens, n_in, out);
    stream.sync();
    std::vector<float> want(n);
    formats::round_activations(format, x.data(), int64_t(n), want.data());
    const auto got = rounded.read();
    const auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(got[i]), bits(want[i])) << "format " << int(format) << " element " << i << ": " << got[i]
                                              << " vs " << want[i];
    }
    if (group == 0) {
      const auto h = half.read();
      for (size_t i = 0; i < n; ++i) {
        const float value = format == formats::ActivationFormat::F16 ? formats::f16_to_f32(h[i]) : formats::bf16_to_f32(h[i]);
        ASSERT_EQ(bits(value), bits(want[i])) << "16-bit encoding of element " << i;
      }
      continue;
    }
    std::vector<int8_t> want_q(n);
    std::vector<float> want_scale(n / size_t(group)), want_sum32(n / 32);
    formats::quantize_activations(format, x.data(), int64_t(n), want_q.data(), want_scale.data(), want_sum32.data());
    EXPECT_EQ(q.read(), want_q) << "format " << int(format);
    const auto got_scale = scale.read(), got_sum32 = sum32.read();
    for (size_t g = 0; g < want_scale.size(); ++g) ASSERT_EQ(bits(got_scale[g]), bits(want_scale[g])) << "group " << g;
    for (size_t k = 0; k < want_sum32.size(); ++k) ASSERT_EQ(bits(got_sum32[k]), bits(want_sum32[k])) << "sum " << k;
  }
  EXPECT_THROW(quantize_activations(stream.get(), formats::ActivationFormat::Q8_K, x_dev.get(), 1, 100,
                                    ActivationOutputs{}),
               Error);
}

// Float rows of a few runs of 8, whose rows (24 x 2 bytes, 1000 x 2 bytes) start off 16-byte boundaries, which
// exercises the byte-wise ends of the GEMV's row staging. (Block rows of odd block counts: CudaMatmulInt8.
// RowsThatEndMidStepAndPartialTiles.)
TEST(CudaMatmul, ShortRowsAndRowsThatStartOffSixteenByteBoundaries) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const std::pair<TensorType, int64_t> cases[] = {
      {TensorType::F32, 8}, {TensorType::F16, 24}, {TensorType::F16, 1000}, {TensorType::BF16, 1000}};
  for (const auto& [type, n_in] : cases) {
    for (int64_t n_tokens : {1, 8, 9}) {
      const double ratio = check_matmul(ctx, stream, type, Shape{n_in, 13}, n_tokens, uint32_t(n_in + n_tokens));
      std::printf("matmul %-5s n_in=%-5lld n_out=13  tokens=%-3lld max error / bound = %.3g\n",
                  name_of(type).c_str(), (long long)n_in, (long long)n_tokens, ratio);
      if (HasFailure()) return;
    }
  }
}

// The weights may live in host memory mapped into the device (cudaHostRegister): same products as from a copy
// in device memory, on both paths.
TEST(CudaMatmul, ReadsWeightsFromMappedHostMemory) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const Shape s{1024, 37};
  for (TensorType type : {TensorType::Q4_K, TensorType::Q8_0, TensorType::F16}) {
    std::vector<uint8_t> bytes = random_weights(type, s.n_in, s.n_out, 77);
    SPARROW_CUDA_CHECK(cudaHostRegister(bytes.data(), bytes.size(), cudaHostRegisterMapped | cudaHostRegisterReadOnly));
    void* mapped = nullptr;
    SPARROW_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, bytes.data(), 0));
    DeviceBuffer<uint8_t> w_dev(bytes);
    for (int64_t n_tokens : {3, 40}) {
      DeviceBuffer<float> x_dev(random_activations(s.n_in * n_tokens, 78));
      DeviceBuffer<float> from_device(size_t(n_tokens * s.n_out)), from_host(size_t(n_tokens * s.n_out));
      from_device.poison();
      from_host.poison();
      matmul(ctx, WeightMatrix{type, w_dev.get(), s.n_in, s.n_out}, x_dev.get(), n_tokens, from_device.get());
      matmul(ctx, WeightMatrix{type, mapped, s.n_in, s.n_out}, x_dev.get(), n_tokens, from_host.get());
      stream.sync();
      const auto a = from_device.read(), b = from_host.read();
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << name_of(type) << " tokens=" << n_tokens;
      EXPECT_FALSE(std::isnan(a[0])) << name_of(type) << " tokens=" << n_tokens;
    }
    SPARROW_CUDA_CHECK(cudaHostUnregister(bytes.data()));
  }
}

TEST(CudaMatmul, RejectsBadShapesAndTypes) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  DeviceBuffer<uint8_t> bytes(1 << 16);
  DeviceBuffer<float> x(4096), y(4096);
  auto product = [&](TensorType type, int64_t n_in, int64_t n_out, const void* data) {
    matmul(ctx, WeightMatrix{type, data, n_in, n_out}, x.get(), 1, y.get());
  };
  EXPECT_THROW(product(TensorType::Q4_K, 100, 2, bytes.get()), Error);   // not whole super-blocks
  EXPECT_THROW(product(TensorType::Q2_K, 256, 1, bytes.get()), Error);   // not a supported format
  EXPECT_THROW(product(TensorType::F16, 12, 1, bytes.get()), Error);     // not whole runs of 8
  EXPECT_THROW(product(TensorType::Q8_0, 32, 1, nullptr), Error);
  EXPECT_THROW(product(TensorType::F32, 8, 1, bytes.get() + 1), Error);  // f32 data must be 4-byte aligned
  EXPECT_THROW(matmul(ctx, WeightMatrix{TensorType::Q8_0, bytes.get(), 32, 1}, x.get(), -1, y.get()), Error);
  // The half GEMM on its own: 16-bit float types only, whole runs of 8.
  const auto* halves = reinterpret_cast<const uint16_t*>(bytes.get());
  EXPECT_THROW(matmul_half(stream.get(), TensorType::Q8_0, halves, 32, 1, halves, 16, y.get()), Error);
  EXPECT_THROW(matmul_half(stream.get(), TensorType::F16, halves, 12, 1, halves, 16, y.get()), Error);
  EXPECT_THROW(matmul_half(stream.get(), TensorType::BF16, halves, 16, 1, nullptr, 16, y.get()), Error);
}

// Row gathers decode with the reference's arithmetic (weight_blocks.h on both sides), so they are exact: the
// GPU's rows equal dequantize_row's bit for bit, times the scale (one float product on both sides).
TEST(CudaGetRows, EqualsDequantizeRowTimesScaleBitForBit) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const Shape s{2560, 41};
  const std::vector<int32_t> ids = {0, 40, 7, 7, 13};
  for (const formats::WeightFormat& format : formats::kWeightFormats) {
    const auto bytes = random_weights(format.type, s.n_in, s.n_out, 11);
    const auto w = dequantized(format.type, bytes, s.n_in, s.n_out);
    DeviceBuffer<uint8_t> w_dev(bytes);
    DeviceBuffer<int32_t> ids_dev(ids);
    for (float scale : {1.0f, 50.596443f}) {
      DeviceBuffer<float> out(ids.size() * size_t(s.n_in));
      out.poison();
      get_rows(ctx, WeightMatrix{format.type, w_dev.get(), s.n_in, s.n_out}, ids_dev.get(), int64_t(ids.size()),
               scale, out.get());
      stream.sync();
      const auto got = out.read();
      int64_t mismatches = 0;
      for (size_t r = 0; r < ids.size(); ++r) {
        for (int64_t i = 0; i < s.n_in; ++i) {
          const float want = scale * w[size_t(ids[r] * s.n_in + i)];
          const float have = got[r * size_t(s.n_in) + size_t(i)];
          if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(have) && mismatches++ < 5) {
            ADD_FAILURE() << name_of(format.type) << " scale " << scale << " id " << ids[r] << " element " << i
                          << ": got " << have << ", want " << want;
          }
        }
      }
      std::printf("get_rows %-5s scale=%g mismatching elements: %lld\n", name_of(format.type).c_str(), scale,
                  (long long)mismatches);
    }
  }
}

TEST(CudaGetRows, OutOfRangeIdsComeOutNaNAndBadShapesThrow) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const Shape s{256, 3};
  const auto bytes = random_weights(TensorType::Q6_K, s.n_in, s.n_out, 5);
  DeviceBuffer<uint8_t> w_dev(bytes);
  DeviceBuffer<int32_t> ids(std::vector<int32_t>{1, 3, -1});
  DeviceBuffer<float> out(3 * size_t(s.n_in));
  out.poison();
  const WeightMatrix w{TensorType::Q6_K, w_dev.get(), s.n_in, s.n_out};
  get_rows(ctx, w, ids.get(), 3, 1.0f, out.get());
  stream.sync();
  const auto got = out.read();
  for (int64_t i = 0; i < s.n_in; ++i) {
    ASSERT_FALSE(std::isnan(got[size_t(i)])) << "row of id 1, element " << i;
    ASSERT_TRUE(std::isnan(got[size_t(s.n_in + i)])) << "row of id 3 (out of range), element " << i;
    ASSERT_TRUE(std::isnan(got[size_t(2 * s.n_in + i)])) << "row of id -1, element " << i;
  }
  EXPECT_THROW(get_rows(ctx, WeightMatrix{TensorType::Q6_K, w_dev.get(), 100, 3}, ids.get(), 1, 1.0f, out.get()),
               Error);
  EXPECT_THROW(get_rows(ctx, WeightMatrix{TensorType::IQ2_XXS, w_dev.get(), 256, 3}, ids.get(), 1, 1.0f, out.get()),
               Error);
}

}  // namespace
}  // namespace sparrow::cuda
