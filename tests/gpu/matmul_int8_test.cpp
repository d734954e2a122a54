// cuda::matmul_int8 (the decode GEMV and the tensor-core GEMM on 8-bit codes) for every block type with an
// integer form, against
// a double-precision reference built from formats::dequantize_row of W and the dequantized activations (the
// reference codes and scales of formats::quantize_activations, which the GPU's quantizer reproduces bit for bit:
// tests/gpu/matmul_test.cpp), plus the one place where the kernel multiplies something other than those values:
// the weight minimum times the activations' sum term (ggml's; below). Shapes: n_in 256 / 2816 / 8192, n_out not a
// multiple of the 128-row tile, token counts of the GEMV (1 to 8) and around and across the GEMM's 64-token tile;
// outputs poisoned with NaN.
// Every case logs its largest error relative to its bound.
#include "cuda/matmul_int8.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/activations.h"
#include "cuda/cuda_check.h"
#include "cuda/dependent_launch.cuh"
#include "cuda/elementwise.h"
#include "formats/weight_formats.h"
#include "formats/weight_int8.h"
#include "gpu_test_util.h"
#include "random_weights.h"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

using testing::DeviceBuffer;
using testing::random_activations;
using testing::random_weights;
using testing::Stream;

// The block types the kernel takes, in the format table's order.
const TensorType kInt8Types[] = {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0,
                                 TensorType::Q5_1, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

// The activations as the reference quantizer makes them, per token: codes [n_tokens][n_in], scales
// [n_tokens][n_in / group], sum32 [n_tokens][n_in / 32].
struct QuantizedActivations {
  formats::ActivationFormat format;
  int group;
  std::vector<int8_t> q;
  std::vector<float> scale, sum32;
};

QuantizedActivations quantize(TensorType type, const std::vector<float>& x, int64_t n_in, int64_t n_tokens) {
  QuantizedActivations a;
  a.format = formats::weight_format(type, "test").activation;
  a.group = formats::activation_group(a.format);
  a.q.resize(size_t(n_tokens * n_in));
  a.scale.resize(size_t(n_tokens * n_in / a.group));
  a.sum32.resize(size_t(n_tokens * n_in / 32));
  for (int64_t t = 0; t < n_tokens; ++t) {
    formats::quantize_activations(a.format, x.data() + t * n_in, n_in, a.q.data() + t * n_in,
                                  a.scale.data() + t * (n_in / a.group), a.sum32.data() + t * (n_in / 32));
  }
  return a;
}

// One weight row in integer form: per sub-block its codes, scale and min (formats/weight_int8.h, itself
// checked against dequantize_row by tests/unit/weight_int8_test.cpp).
struct IntegerRow {
  std::vector<int8_t> codes;
  std::vector<formats::SubBlockScale> scales;
};

template <TensorType T>
IntegerRow integer_row(const uint8_t* row, int64_t n_in) {
  using W = formats::WeightInt8<T>;
  using Unit = typename W::Unit;
  IntegerRow out;
  out.codes.resize(size_t(n_in));
  const int64_t n_units = n_in / formats::WeightBlock<T>::kUnitElements;
  for (int64_t u = 0; u < n_units; ++u) {
    Unit unit;
    std::memcpy(&unit, row + size_t(u) * sizeof(Unit), sizeof(Unit));
    for (int s = 0; s < W::kSubBlocks; ++s) {
      const int64_t first = (u * W::kSubBlocks + s) * W::kSubBlock;
      out.scales.push_back(W::decode_sub_block(unit, s, out.codes.data() + first));
    }
  }
  return out;
}

// Reference and bound for one output y[t][o]. The GEMM computes, per sub-block s in order,
//   acc = fma(fl(w_scale_s * x_scale_s), dot_s, acc);   acc = fma(w_min_s, x_off_s, acc)   (types with a min)
// and the GEMV the same per lane over every 32nd sub-block, then adds the lanes' sums in a tree of 5 levels.
// with dot_s the exact integer dot product of the codes and x_off_s the activations' offset term (sum32 for
// 32-element sub-blocks: for Q8_1 f16(unrounded scale * sum of codes), not x_scale * sum of codes).
//
// want = sum_i w_i * x_i in double, w_i = dequantize_row, x_i = x_scale * q_i (the values the CPU multiplies),
//        plus sum_s w_min_s * (x_off_s - x_scale_s * sum_s q): ggml's offset term instead of the exact sum
//        (zero for Q8_K's sum32 up to one rounding; for Q8_1 the f16 rounding of the stored sum).
// Bound, from three sources:
//  1. fp32 arithmetic in the kernel: N = S (1 + has_min) fused multiply-adds in sequence, each one rounding of
//     2^-24 (gamma_N of recursive summation over the terms), plus the rounding of w_scale * x_scale (2^-24 of
//     each product term): at most (N + 1) 2^-24 sum_s (|w_scale x_scale dot_s| + |w_min x_off_s|); (N + 2) used.
//     The GEMV's longest chain of roundings is shorter (a lane's ceil(S / 32) (1 + has_min) steps, then one per
//     tree level that adds two nonzero sums, at most log2(min(S, 32))), so the same bound holds for it.
//     dot_s and its conversion are exact (|dot_s| < 2^22), so this is relative to the terms the kernel adds,
//     not to sum_i |w_i x_i|.
//  2. The kernel multiplies by the real scale * code + min, the reference by its float rounding w_i (which
//     differ where the decoder rounds: weight_int8.h): at most 2^-24 |w_i| per element, so 2^-24 sum_i |w_i x_i|;
//     2 x that used (the double reference's own roundings are ~2^-53 and covered by the factor).
//  3. Nothing else: activations, codes and scales are the same numbers on both sides.
struct Expected {
  double want, bound;
};

template <TensorType T>
Expected expected_output(const std::vector<float>& w_row, const IntegerRow& iw, const QuantizedActivations& a,
                         int64_t t, int64_t n_in) {
  using W = formats::WeightInt8<T>;
  constexpr int kSub = W::kSubBlock;
  const int8_t* q = a.q.data() + t * n_in;
  double want = 0, abs_products = 0, kernel_terms = 0;
  const int64_t n_sub = n_in / kSub;
  for (int64_t s = 0; s < n_sub; ++s) {
    const double x_scale = a.scale[size_t(t * (n_in / a.group) + s * kSub / a.group)];
    int dot = 0, sum_q = 0;
    for (int j = 0; j < kSub; ++j) {
      const int64_t i = s * kSub + j;
      const double product = double(w_row[size_t(i)]) * (x_scale * q[i]);
      want += product;
      abs_products += std::fabs(product);
      dot += int(iw.codes[size_t(i)]) * int(q[i]);
      sum_q += q[i];
    }
    const formats::SubBlockScale ws = iw.scales[size_t(s)];
    kernel_terms += std::fabs(double(float(ws.scale * float(x_scale))) * dot);
    if constexpr (W::kHasMin) {
      const double x_off = kSub == 32 ? double(a.sum32[size_t(t * (n_in / 32) + s * kSub / 32)])
                                      : double(float(float(x_scale) * float(sum_q)));
      want += double(ws.min) * (x_off - x_scale * sum_q);
      kernel_terms += std::fabs(double(ws.min) * x_off);
    }
  }
  const double n_fmas = double(n_sub) * (W::kHasMin ? 2 : 1);
  const double bound = (n_fmas + 2) * 0x1.0p-24 * kernel_terms + 2 * 0x1.0p-24 * abs_products + 1e-30;
  return {want, bound};
}

struct Shape {
  int64_t n_in, n_out;
};

// Runs one product from the reference's activation codes and checks every output; returns the largest error /
// bound ratio seen.
template <TensorType T>
double check_mma(MatmulContext& ctx, const Stream& stream, Shape s, int64_t n_tokens, uint32_t seed) {
  const std::string name = tensor_type_name(T);
  const auto bytes = random_weights(T, s.n_in, s.n_out, seed);
  const auto x = random_activations(s.n_in * n_tokens, seed + 1);
  const QuantizedActivations a = quantize(T, x, s.n_in, n_tokens);
  DeviceBuffer<uint8_t> w_dev(bytes);
  DeviceBuffer<int8_t> q_dev(a.q);
  DeviceBuffer<float> scale_dev(a.scale), sum32_dev(a.sum32), y_dev(size_t(n_tokens * s.n_out));
  y_dev.poison();
  matmul_int8(ctx, WeightMatrix{T, w_dev.get(), s.n_in, s.n_out}, q_dev.get(), scale_dev.get(),
                  sum32_dev.get(), n_tokens, y_dev.get());
  stream.sync();
  const std::vector<float> y = y_dev.read();

  const size_t row_bytes = tensor_row_bytes(T, s.n_in);
  double worst_ratio = 0;
  std::vector<float> w_row(size_t(s.n_in));
  for (int64_t o = 0; o < s.n_out; ++o) {
    formats::dequantize_row(T, bytes.data() + size_t(o) * row_bytes, w_row.data(), s.n_in);
    const IntegerRow iw = integer_row<T>(bytes.data() + size_t(o) * row_bytes, s.n_in);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const Expected e = expected_output<T>(w_row, iw, a, t, s.n_in);
      const double got = y[size_t(t * s.n_out + o)];
      const double error = std::fabs(got - e.want);
      if (!(error <= e.bound)) {  // also catches NaN: an output never written
        ADD_FAILURE() << name << " n_in=" << s.n_in << " n_out=" << s.n_out << " tokens=" << n_tokens << " token "
                      << t << " row " << o << ": got " << got << ", want " << e.want << ", error " << error
                      << " > bound " << e.bound;
        return error / e.bound;
      }
      worst_ratio = std::max(worst_ratio, error / e.bound);
    }
  }
  return worst_ratio;
}

template <class F>
void for_each_int8_type(F&& f) {
  for (TensorType type : kInt8Types) {
    formats::visit_weight_type(type, "test", [&](auto t) {
      if constexpr (formats::WeightInt8<decltype(t)::value>::kSupported) f(t);
    });
  }
}

TEST(CudaMatmulInt8, MatchesDequantizedDoubleDotForEveryTypeShapeAndTokenCount) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  uint32_t seed = 100;
  for_each_int8_type([&](auto type) {
    constexpr TensorType T = decltype(type)::value;
    for (Shape s : {Shape{256, 131}, Shape{2816, 37}, Shape{8192, 37}}) {
      for (int64_t n_tokens : {1, 2, 3, 8, 9, 33, 64, 100, 512}) {
        if (HasFailure()) return;
        const double ratio = check_mma<T>(ctx, stream, s, n_tokens, seed++);
        std::printf("matmul_int8 %-5s n_in=%-5lld n_out=%-3lld tokens=%-3lld max error / bound = %.3g\n",
                    tensor_type_name(T).c_str(), (long long)s.n_in, (long long)s.n_out, (long long)n_tokens, ratio);
      }
    }
  });
}

// Legacy rows of odd block counts (n_in not a multiple of the GEMM's 128-element staging step; rows of 3 x 18,
// 17 x 34 bytes, ... that start off 16-byte boundaries, the byte-wise ends of the GEMV's row staging) and one
// row tile's worth of rows plus one.
TEST(CudaMatmulInt8, RowsThatEndMidStepAndPartialTiles) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const std::pair<TensorType, int64_t> cases[] = {
      {TensorType::Q4_0, 96}, {TensorType::Q4_1, 32},  {TensorType::Q5_0, 544},
      {TensorType::Q5_1, 160}, {TensorType::Q8_0, 544}, {TensorType::Q6_K, 768},
  };
  for (const auto& [type, n_in] : cases) {
    formats::visit_weight_type(type, "test", [&](auto t) {
      constexpr TensorType T = decltype(t)::value;
      if constexpr (formats::WeightInt8<T>::kSupported) {
        for (int64_t n_tokens : {1, 65}) {
          if (HasFailure()) return;
          const double ratio = check_mma<T>(ctx, stream, Shape{n_in, 129}, n_tokens, uint32_t(n_in + n_tokens));
          std::printf("matmul_int8 %-5s n_in=%-5lld n_out=129 tokens=%-3lld max error / bound = %.3g\n",
                      tensor_type_name(T).c_str(), (long long)n_in, (long long)n_tokens, ratio);
        }
      }
    });
  }
}

// The decode GEMV's grid holds at most the CTAs the GPU keeps resident, so a matrix of more rows than that has
// each warp walk several rows (an H100 or H200 holds about 5000 of its warps), rows of 2816 Q8_0 / Q4_0 elements
// take two steps of the warp's copy ring, and Q6_K rows of 2816 are 2310 bytes, off 16-byte boundaries.
TEST(CudaMatmulInt8, DecodeRowsBeyondOneResidentGrid) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  for (TensorType type : {TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K, TensorType::Q4_0}) {
    formats::visit_weight_type(type, "test", [&](auto t) {
      constexpr TensorType T = decltype(t)::value;
      if constexpr (formats::WeightInt8<T>::kSupported) {
        for (int64_t n_tokens : {1, 3}) {
          if (HasFailure()) return;
          const double ratio = check_mma<T>(ctx, stream, Shape{2816, 12007}, n_tokens, uint32_t(40 + n_tokens));
          std::printf("matmul_int8 %-5s n_in=2816 n_out=12007 tokens=%lld max error / bound = %.3g\n",
                      tensor_type_name(T).c_str(), (long long)n_tokens, ratio);
        }
      }
    });
  }
}

// Several matrices in one GEMV launch (the rows of all of them shared out over the grid's warps) give each
// matrix the bits of its own launch, and so does the launch that quantizes the float activations itself.
TEST(CudaMatmulInt8, SeveralMatricesInOneLaunchGiveTheBitsOfSeparateLaunches) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const int64_t n_in = 1536, n_tokens = 2;
  const int64_t n_outs[] = {6001, 130, 9000, 1};
  for (TensorType type : {TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_1}) {
    const auto x = random_activations(n_in * n_tokens, 77);
    const QuantizedActivations a = quantize(type, x, n_in, n_tokens);
    DeviceBuffer<float> x_dev(x);
    DeviceBuffer<int8_t> q_dev(a.q);
    DeviceBuffer<float> scale_dev(a.scale), sum32_dev(a.sum32);
    std::deque<DeviceBuffer<uint8_t>> weights;  // deques: the buffers neither copy nor move
    std::deque<DeviceBuffer<float>> together, alone, quantizing;
    std::vector<MatmulTarget> targets, quantizing_targets;
    for (int64_t n_out : n_outs) {
      weights.emplace_back(random_weights(type, n_in, n_out, uint32_t(n_out)));
      for (auto* outputs : {&together, &alone, &quantizing}) {
        outputs->emplace_back(size_t(n_tokens * n_out));
        outputs->back().poison();
      }
    }
    for (size_t m = 0; m < weights.size(); ++m) {
      const WeightMatrix w{type, weights[m].get(), n_in, n_outs[m]};
      targets.push_back({w, together[m].get()});
      quantizing_targets.push_back({w, quantizing[m].get()});
      matmul_int8(ctx, w, q_dev.get(), scale_dev.get(), sum32_dev.get(), n_tokens, alone[m].get());
    }
    matmul_int8(ctx, targets, q_dev.get(), scale_dev.get(), sum32_dev.get(), n_tokens);
    ASSERT_TRUE(matmul_int8_quantizes(type, n_in, n_tokens));
    matmul_int8(ctx, quantizing_targets, x_dev.get(), n_tokens);
    stream.sync();
    for (size_t m = 0; m < weights.size(); ++m) {
      const auto p = together[m].read(), r = alone[m].read(), f = quantizing[m].read();
      EXPECT_EQ(std::memcmp(p.data(), r.data(), p.size() * sizeof(float)), 0)
          << tensor_type_name(type) << " matrix " << m;
      EXPECT_EQ(std::memcmp(f.data(), r.data(), p.size() * sizeof(float)), 0)
          << tensor_type_name(type) << " matrix " << m << ", activations quantized in the GEMV";
      EXPECT_FALSE(std::isnan(p.back())) << tensor_type_name(type) << " matrix " << m;
    }
  }
}

// Where the element-wise kernels run in these tests: the stream, with the current device's multiprocessors.
LaunchTarget launch_target(const Stream& stream) {
  int device = 0, multiprocessors = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  return {stream.get(), multiprocessors};
}

// The gated products (Backend::gated_matmul) in one GEMV launch give the bits of the ops one by one: the two
// products, then gelu_mul; or the product, gelu_mul, then mul_rows from a strided buffer. Row counts that are
// not a multiple of the CTA's warps, up to the GEMV's 8 tokens.
TEST(CudaMatmulInt8, GatedProductsInOneLaunchGiveTheBitsOfTheOpsOneByOne) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const LaunchTarget target = launch_target(stream);
  DeviceBuffer<uint16_t> gelu_table(gelu_f16_table());
  const int64_t n_out = 3001, mul_stride = 4 * n_out;
  // Rows of one step (one warp each) and of several (2 or 4 warps each), up to the tokens the GEMV quantizes
  // (at 6144 inputs, 2: three tokens' codes and scales are over its 20 KiB of shared memory).
  for (const auto& [n_in, token_counts] : {std::pair{int64_t(1536), std::vector<int64_t>{1, 3, 8}},
                                           std::pair{int64_t(6144), std::vector<int64_t>{1, 2}}}) {
    for (TensorType type : {TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_1}) {
      for (int64_t n_tokens : token_counts) {
        const std::string what = std::string(tensor_type_name(type)) + ", n_in " + std::to_string(n_in) + ", " +
                                 std::to_string(n_tokens) + " tokens";
        DeviceBuffer<float> x(random_activations(n_in * n_tokens, 11));
        DeviceBuffer<float> mul(random_activations(mul_stride * n_tokens, 12));
        DeviceBuffer<uint8_t> gate_w(random_weights(type, n_in, n_out, 13));
        DeviceBuffer<uint8_t> up_w(random_weights(type, n_in, n_out, 14));
        const WeightMatrix gate{type, gate_w.get(), n_in, n_out}, up{type, up_w.get(), n_in, n_out};
        const size_t n = size_t(n_tokens * n_out);
        DeviceBuffer<float> fused_up(n), fused_mul(n), up_scratch(n), apart_up(n), apart_mul(n), up_y(n);
        for (auto* b : {&fused_up, &fused_mul, &apart_up, &apart_mul}) b->poison();

        const GatedProduct times_up{.gate = gate, .up = &up, .up_y = up_scratch.get()};
        const GatedProduct times_rows{.gate = gate, .mul = mul.get() + 5, .mul_stride = mul_stride};
        ASSERT_TRUE(matmul_int8_fuses(times_up, n_tokens)) << what;
        ASSERT_TRUE(matmul_int8_fuses(times_rows, n_tokens)) << what;
        matmul_int8_gated(ctx, gelu_table.get(), times_up, x.get(), n_tokens, fused_up.get());
        matmul_int8_gated(ctx, gelu_table.get(), times_rows, x.get(), n_tokens, fused_mul.get());

        const MatmulTarget both[] = {{gate, apart_up.get()}, {up, up_y.get()}};
        matmul_int8(ctx, both, x.get(), n_tokens);
        gelu_mul(target, gelu_table.get(), apart_up.get(), up_y.get(), int64_t(n), apart_up.get());
        const MatmulTarget alone{gate, apart_mul.get()};
        matmul_int8(ctx, std::span(&alone, 1), x.get(), n_tokens);
        gelu_mul(target, gelu_table.get(), apart_mul.get(), nullptr, int64_t(n), apart_mul.get());
        mul_rows(target, apart_mul.get(), mul.get() + 5, n_tokens, n_out, mul_stride);
        stream.sync();

        const auto f_up = fused_up.read(), a_up = apart_up.read(), f_mul = fused_mul.read(), a_mul = apart_mul.read();
        EXPECT_EQ(std::memcmp(f_up.data(), a_up.data(), n * sizeof(float)), 0) << what << ", times up";
        EXPECT_EQ(std::memcmp(f_mul.data(), a_mul.data(), n * sizeof(float)), 0) << what << ", times rows";
        EXPECT_FALSE(std::isnan(f_up.back()) || std::isnan(f_mul.back())) << what;
      }
    }
  }
  // What the GEMV does not fuse is refused, not computed otherwise.
  const int64_t n_in = 1536;
  DeviceBuffer<uint8_t> w(random_weights(TensorType::Q8_0, n_in, 64, 15));
  DeviceBuffer<uint8_t> other(random_weights(TensorType::Q8_0, n_in, 65, 16));
  const WeightMatrix gate{TensorType::Q8_0, w.get(), n_in, 64}, up{TensorType::Q8_0, other.get(), n_in, 65};
  DeviceBuffer<float> x(random_activations(n_in, 17)), y(64);
  const GatedProduct mismatched{.gate = gate, .up = &up, .up_y = y.get()}, without_mul{.gate = gate};
  EXPECT_FALSE(matmul_int8_fuses(mismatched, 1));
  EXPECT_FALSE(matmul_int8_fuses(without_mul, 1));
  EXPECT_FALSE(matmul_int8_fuses(GatedProduct{.gate = gate, .mul = x.get()}, 9));  // beyond the GEMV's tokens
  EXPECT_THROW(matmul_int8_gated(ctx, gelu_table.get(), mismatched, x.get(), 1, y.get()), Error);
}

// The residual step run by the GEMV's last CTA (Backend::matmul_residual) gives the bits of the product followed
// by add_rms_norm: rows of 640, 1536 and 2560 floats (add_rms_norm's kernel runs them on 160, 384 and 512
// threads, the last with two float4s a thread), with and without weights, the next input and the layer output
// scale. Each fused case runs twice, so the second launch finds the count of finished CTAs set back to zero.
TEST(CudaMatmulInt8, ResidualStepInTheGemvGivesTheBitsOfTheOpsOneByOne) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const LaunchTarget target = launch_target(stream);
  const int64_t n_in = 2048;
  for (TensorType type : {TensorType::Q8_0, TensorType::Q4_K}) {
    for (int64_t n_out : {640, 1536, 2560}) {
      DeviceBuffer<uint8_t> w_dev(random_weights(type, n_in, n_out, 21));
      const WeightMatrix w{type, w_dev.get(), n_in, n_out};
      DeviceBuffer<float> r_weight(random_activations(n_out, 22)), next_weight(random_activations(n_out, 23));
      for (int64_t n_tokens : {1, 3, 8}) {
        for (const bool full : {false, true}) {  // weights, next input and output scale, or none of them
          const std::string what = std::string(tensor_type_name(type)) + ", " + std::to_string(n_out) + " rows, " +
                                   std::to_string(n_tokens) + " tokens" + (full ? ", everything" : ", bare");
          const size_t n = size_t(n_tokens * n_out);
          const auto residual = random_activations(int64_t(n), 24);
          DeviceBuffer<float> in(random_activations(n_in * n_tokens, 25));
          DeviceBuffer<float> x_apart(residual), r_apart(n), next_apart(n);
          next_apart.poison();
          const MatmulTarget product{w, r_apart.get()};
          matmul_int8(ctx, std::span(&product, 1), in.get(), n_tokens);
          add_rms_norm(target, x_apart.get(), r_apart.get(), full ? r_weight.get() : nullptr, n_tokens, n_out,
                       1e-6f, full ? next_weight.get() : nullptr, full ? next_apart.get() : nullptr,
                       full ? 0.75f : 1.0f);
          stream.sync();
          const auto x_want = x_apart.read(), r_want = r_apart.read(), next_want = next_apart.read();
          for (int run = 0; run < 2; ++run) {
            DeviceBuffer<float> x(residual), r(n), next(n);
            r.poison();
            next.poison();
            const ResidualStep step{.x = x.get(),
                                    .r_weight = full ? r_weight.get() : nullptr,
                                    .eps = 1e-6f,
                                    .next_weight = full ? next_weight.get() : nullptr,
                                    .next = full ? next.get() : nullptr,
                                    .x_scale = full ? 0.75f : 1.0f};
            ASSERT_TRUE(matmul_int8_fuses_residual(w, n_tokens, r.get(), step)) << what;
            matmul_int8_residual(ctx, w, in.get(), n_tokens, r.get(), step);
            stream.sync();
            const auto x_got = x.read(), r_got = r.read(), next_got = next.read();
            EXPECT_EQ(std::memcmp(r_got.data(), r_want.data(), n * sizeof(float)), 0) << what << ", run " << run;
            EXPECT_EQ(std::memcmp(x_got.data(), x_want.data(), n * sizeof(float)), 0) << what << ", run " << run;
            if (full) {
              EXPECT_EQ(std::memcmp(next_got.data(), next_want.data(), n * sizeof(float)), 0)
                  << what << ", run " << run;
            }
            EXPECT_FALSE(std::isnan(x_got.back()) || std::isnan(r_got.back())) << what;
          }
        }
      }
    }
  }
  // What the GEMV does not fuse is refused, not computed otherwise.
  const int64_t n_out = 1536;
  DeviceBuffer<uint8_t> w_dev(random_weights(TensorType::Q8_0, n_in, n_out, 26));
  const WeightMatrix w{TensorType::Q8_0, w_dev.get(), n_in, n_out};
  DeviceBuffer<float> in(random_activations(n_in * 9, 27)), x(n_out * 9 + 1), r(n_out * 9);
  const ResidualStep misaligned{.x = x.get() + 1, .eps = 1e-6f}, aligned{.x = x.get(), .eps = 1e-6f};
  EXPECT_FALSE(matmul_int8_fuses_residual(w, 1, r.get(), misaligned));
  EXPECT_FALSE(matmul_int8_fuses_residual(w, 9, r.get(), aligned));  // beyond the GEMV's tokens
  EXPECT_FALSE(matmul_int8_fuses_residual(WeightMatrix{TensorType::Q8_0, w_dev.get(), n_in, 4 * 2048 + 4}, 1,
                                          r.get(), aligned));  // a row too long for add_rms_norm's registers
  EXPECT_THROW(matmul_int8_residual(ctx, w, in.get(), 1, r.get(), misaligned), Error);
}

// The decode GEMV is a dependent launch (dependent_launch.cuh): it starts streaming weights while the kernel
// before it runs, and must still read the activations that kernel writes. Here that kernel is an add over a
// quarter-gigabyte buffer whose last elements are the activations, so a GEMV that read them early would see the
// zeros they start as.
TEST(CudaMatmulInt8, DependentLaunchReadsWhatTheKernelBeforeItWrote) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const int64_t n_in = 2048, n_out = 3000, n_tokens = 1, n_buffer = int64_t(1) << 26;
  const auto x = random_activations(n_in * n_tokens, 5);
  const QuantizedActivations a = quantize(TensorType::Q8_0, x, n_in, n_tokens);
  std::vector<float> addend(size_t(n_buffer), 0.0f);
  std::copy(x.begin(), x.end(), addend.end() - int64_t(x.size()));
  DeviceBuffer<float> buffer(std::vector<float>(size_t(n_buffer), 0.0f)), addend_dev(addend);
  DeviceBuffer<int8_t> q_dev(a.q);
  DeviceBuffer<float> scale_dev(a.scale), y_codes{size_t(n_out)}, y_floats{size_t(n_out)};
  DeviceBuffer<uint8_t> w_dev(random_weights(TensorType::Q8_0, n_in, n_out, 6));
  const WeightMatrix w{TensorType::Q8_0, w_dev.get(), n_in, n_out};
  y_floats.poison();
  matmul_int8(ctx, w, q_dev.get(), scale_dev.get(), nullptr, n_tokens, y_codes.get());
  add(launch_target(stream), buffer.get(), addend_dev.get(), n_buffer);
  const MatmulTarget target{w, y_floats.get()};
  matmul_int8(ctx, std::span(&target, 1), buffer.get() + (n_buffer - n_in * n_tokens), n_tokens);
  stream.sync();
  const auto want = y_codes.read(), got = y_floats.read();
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
      << "dependent launches " << (dependent_launch_enabled() ? "on" : "off");
}

// From the reference's codes, from the device quantizer's, and through cuda::matmul (the backend's entry, which
// quantizes and takes these kernels): the same bits, for the GEMV and the GEMM (the inputs are bit-identical and
// neither kernel's order depends on where they came from).
TEST(CudaMatmulInt8, FromDeviceQuantizedActivationsGivesTheSameBits) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  const Shape s{2816, 75};
  for (const auto& [type, n_tokens] : {std::pair{TensorType::Q4_K, int64_t(70)}, std::pair{TensorType::Q5_1, int64_t(3)},
                                       std::pair{TensorType::Q6_K, int64_t(70)}, std::pair{TensorType::Q4_K, int64_t(1)}}) {
    const auto bytes = random_weights(type, s.n_in, s.n_out, 9);
    const auto x = random_activations(s.n_in * n_tokens, 10);
    const QuantizedActivations a = quantize(type, x, s.n_in, n_tokens);
    DeviceBuffer<uint8_t> w_dev(bytes);
    DeviceBuffer<float> x_dev(x);
    DeviceBuffer<int8_t> q_host(a.q), q_device(a.q.size());
    DeviceBuffer<float> scale_host(a.scale), sum32_host(a.sum32), scale_device(a.scale.size()),
        sum32_device(a.sum32.size());
    const ActivationOutputs outputs{.q = q_device.get(), .scale = scale_device.get(), .sum32 = sum32_device.get()};
    quantize_activations(stream.get(), a.format, x_dev.get(), n_tokens, s.n_in, outputs);
    DeviceBuffer<float> from_host(size_t(n_tokens * s.n_out)), from_device(size_t(n_tokens * s.n_out)),
        from_matmul(size_t(n_tokens * s.n_out));
    from_host.poison();
    from_device.poison();
    from_matmul.poison();
    const WeightMatrix w{type, w_dev.get(), s.n_in, s.n_out};
    matmul_int8(ctx, w, q_host.get(), scale_host.get(), sum32_host.get(), n_tokens, from_host.get());
    matmul_int8(ctx, w, q_device.get(), scale_device.get(), sum32_device.get(), n_tokens, from_device.get());
    matmul(ctx, w, x_dev.get(), n_tokens, from_matmul.get());
    stream.sync();
    const auto p = from_host.read(), r = from_device.read(), m = from_matmul.read();
    EXPECT_EQ(std::memcmp(p.data(), r.data(), p.size() * sizeof(float)), 0) << tensor_type_name(type);
    EXPECT_EQ(std::memcmp(p.data(), m.data(), p.size() * sizeof(float)), 0) << tensor_type_name(type) << " via matmul";
    EXPECT_FALSE(std::isnan(p[0])) << tensor_type_name(type);
  }
}

TEST(CudaMatmulInt8, RejectsTypesWithoutIntegerFormAndBadArguments) {
  SPARROW_REQUIRE_GPU();
  Stream stream;
  MatmulContext ctx(stream.get());
  DeviceBuffer<uint8_t> bytes(1 << 16);
  DeviceBuffer<int8_t> q(1 << 16);
  DeviceBuffer<float> scale(4096), sum32(4096), y(4096);
  auto product = [&](TensorType type, int64_t n_in, const void* data, const int8_t* codes, const float* sums) {
    matmul_int8(ctx, WeightMatrix{type, data, n_in, 3}, codes, scale.get(), sums, 9, y.get());
  };
  EXPECT_THROW(product(TensorType::F16, 256, bytes.get(), q.get(), sum32.get()), Error);   // no integer form
  EXPECT_THROW(product(TensorType::F32, 256, bytes.get(), q.get(), sum32.get()), Error);
  EXPECT_THROW(product(TensorType::Q2_K, 256, bytes.get(), q.get(), sum32.get()), Error);  // not supported at all
  EXPECT_THROW(product(TensorType::Q4_K, 100, bytes.get(), q.get(), sum32.get()), Error);  // not whole super-blocks
  EXPECT_THROW(product(TensorType::Q8_0, 64, nullptr, q.get(), sum32.get()), Error);
  EXPECT_THROW(product(TensorType::Q8_0, 64, bytes.get(), q.get() + 1, sum32.get()), Error);  // codes misaligned
  EXPECT_THROW(product(TensorType::Q4_1, 64, bytes.get(), q.get(), nullptr), Error);        // a min needs sums
  EXPECT_NO_THROW(product(TensorType::Q8_0, 64, bytes.get(), q.get(), nullptr));            // no min: no sums
  EXPECT_THROW(matmul_int8(ctx, WeightMatrix{TensorType::Q8_0, bytes.get(), 64, 3}, q.get(), scale.get(),
                               nullptr, -1, y.get()),
               Error);
  // Float activations, quantized in the GEMV: only decode shapes whose codes fit its shared memory.
  DeviceBuffer<float> x(4096);
  const MatmulTarget q8_target{WeightMatrix{TensorType::Q8_0, bytes.get(), 64, 3}, y.get()};
  const std::span<const MatmulTarget> q8(&q8_target, 1);
  EXPECT_NO_THROW(matmul_int8(ctx, q8, x.get(), 2));
  EXPECT_THROW(matmul_int8(ctx, q8, x.get() + 1, 2), Error);  // floats misaligned
  EXPECT_THROW(matmul_int8(ctx, q8, static_cast<const float*>(nullptr), 2), Error);
  EXPECT_THROW(matmul_int8(ctx, q8, x.get(), 9), Error);  // a prefill: quantize first
  EXPECT_TRUE(matmul_int8_quantizes(TensorType::Q8_0, 12288, 1));
  EXPECT_FALSE(matmul_int8_quantizes(TensorType::Q8_0, 65536, 1));
  EXPECT_FALSE(matmul_int8_quantizes(TensorType::Q8_0, 1536, 9));
  EXPECT_FALSE(matmul_int8_quantizes(TensorType::F16, 1536, 1));
  EXPECT_TRUE(matmul_int8_supports(TensorType::Q6_K));
  EXPECT_FALSE(matmul_int8_supports(TensorType::BF16));
  EXPECT_FALSE(matmul_int8_supports(TensorType::IQ2_XXS));
  stream.sync();
}

}  // namespace
}  // namespace sparrow::cuda
