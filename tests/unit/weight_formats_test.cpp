// Weight formats: half/bfloat16 conversions checked exhaustively against an independent formula, quantize ->
// dequantize error bounds per type, and bit-exactness of dequantize_row against llama.cpp's own to_float
// (loaded with dlopen from the peer build, so no llama.cpp header or code enters Sparrow).
#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "formats/weight_formats.h"
#include "ggml_activations.h"
#include "random_weights.h"
#include "reference_test_util.h"
#include "runtime/resources.h"
#include "util/error.h"

namespace sparrow::formats {
namespace {

struct TypeCase {
  TensorType type;
  const char* name;
  int block_elements;
  size_t block_bytes;
};

const TypeCase kAllTypes[] = {
    {TensorType::F32, "f32", 1, 4},       {TensorType::F16, "f16", 1, 2},
    {TensorType::BF16, "bf16", 1, 2},     {TensorType::Q8_0, "q8_0", 32, sizeof(BlockQ8_0)},
    {TensorType::Q4_0, "q4_0", 32, sizeof(BlockQ4_0)}, {TensorType::Q4_1, "q4_1", 32, sizeof(BlockQ4_1)},
    {TensorType::Q5_0, "q5_0", 32, sizeof(BlockQ5_0)}, {TensorType::Q5_1, "q5_1", 32, sizeof(BlockQ5_1)},
    {TensorType::Q4_K, "q4_K", 256, sizeof(BlockQ4_K)}, {TensorType::Q5_K, "q5_K", 256, sizeof(BlockQ5_K)},
    {TensorType::Q6_K, "q6_K", 256, sizeof(BlockQ6_K)},
};

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// Independent definition of IEEE binary16: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals 2^-14 * m/1024.
double half_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double sign = s ? -1.0 : 1.0;
  if (e == 0x1F) return m ? std::nan("") : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m / 1024.0, -14);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

TEST(HalfFloat, EveryBitPatternConvertsToItsExactValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = f16_to_f32(uint16_t(h));
    const double want = half_value(uint16_t(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "h=" << h;
      ASSERT_EQ(bits_of(got) & 0x00400000u, 0x00400000u) << "NaN must come out quiet, h=" << h;
      ASSERT_EQ(std::signbit(got), bool(h & 0x8000)) << "h=" << h;
    } else {
      ASSERT_EQ(bits_of(got), bits_of(float(want))) << "h=" << h;  // float(want) is exact
    }
  }
}

TEST(HalfFloat, RowConversionMatchesScalarConversionOnEveryBitPattern) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = uint16_t(h);
  std::vector<float> row(65536);
  dequantize_row(TensorType::F16, all.data(), row.data(), 65536);
  for (uint32_t h = 0; h < 65536; ++h) ASSERT_EQ(bits_of(row[h]), bits_of(f16_to_f32(uint16_t(h)))) << "h=" << h;
}

TEST(HalfFloat, RoundTripsAndRoundsHalfwayToEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double v = half_value(uint16_t(h));
    if (std::isnan(v)) {
      ASSERT_EQ(f32_to_f16(float(v)) & 0x7FFF, 0x7E00) << "h=" << h;
      continue;
    }
    ASSERT_EQ(f32_to_f16(float(v)), h) << "h=" << h;
    const int e = (h >> 10) & 0x1F;
    if (e == 0x1F || (h & 0x7FFF) == 0x7BFF) continue;  // no next finite half above inf / 65504
    // The midpoint to the next half (away from zero) is exact in float and ties to the even mantissa.
    const double next = half_value(uint16_t(h + 1));
    const float mid = float((v + next) / 2);
    const uint16_t even = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
    ASSERT_EQ(f32_to_f16(mid), even) << "midpoint above h=" << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, float(v))), h) << "just below midpoint above h=" << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, float(next))), uint16_t(h + 1)) << "just above, h=" << h;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // the midpoint between 65504 and 2^16 rounds up to inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xFC00);
}

TEST(BFloat16, EveryBitPatternConvertsAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int e = (h >> 7) & 0xFF, m = h & 0x7F;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const float got = bf16_to_f32(uint16_t(h));
    if (e == 0xFF && m != 0) {
      ASSERT_TRUE(std::isnan(got)) << "h=" << h;
      ASSERT_EQ(f32_to_bf16(got), uint16_t(h | 0x40)) << "NaN keeps its payload and becomes quiet, h=" << h;
      continue;
    }
    const double want = e == 0xFF  ? sign * INFINITY
                        : e == 0   ? sign * std::ldexp(m / 128.0, -126)
                                   : sign * std::ldexp(1.0 + m / 128.0, e - 127);
    ASSERT_EQ(bits_of(got), bits_of(float(want))) << "h=" << h;
    ASSERT_EQ(f32_to_bf16(got), h) << "h=" << h;
    if (e < 0xFE || (e == 0xFE && m < 0x7F)) {  // midpoint to the next bfloat16 ties to even
      const float mid = std::bit_cast<float>((h << 16) | 0x8000u);
      ASSERT_EQ(f32_to_bf16(mid), (h & 1) ? h + 1 : h) << "h=" << h;
      ASSERT_EQ(f32_to_bf16(std::bit_cast<float>((h << 16) | 0x8001u)), h + 1) << "h=" << h;
      ASSERT_EQ(f32_to_bf16(std::bit_cast<float>((h << 16) | 0x7FFFu)), h) << "h=" << h;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// The trait table and the block decoders, against facts written here from ggml's definitions.

TEST(WeightFormatTable, ListsEverySupportedTypeWithGgufGeometryAndGgmlActivations) {
  // ggml's vec_dot_type of each weight type: what its CPU dot products multiply the weights with.
  const std::pair<TensorType, ActivationFormat> expected[] = {
      {TensorType::F32, ActivationFormat::F32},   {TensorType::F16, ActivationFormat::F16},
      {TensorType::BF16, ActivationFormat::BF16}, {TensorType::Q8_0, ActivationFormat::Q8_0},
      {TensorType::Q4_0, ActivationFormat::Q8_0}, {TensorType::Q4_1, ActivationFormat::Q8_1},
      {TensorType::Q5_0, ActivationFormat::Q8_0}, {TensorType::Q5_1, ActivationFormat::Q8_1},
      {TensorType::Q4_K, ActivationFormat::Q8_K}, {TensorType::Q5_K, ActivationFormat::Q8_K},
      {TensorType::Q6_K, ActivationFormat::Q8_K},
  };
  ASSERT_EQ(std::size(kWeightFormats), std::size(expected));
  for (const auto& [type, activation] : expected) {
    const WeightFormat* format = find_weight_format(type);
    ASSERT_NE(format, nullptr) << tensor_type_name(type);
    EXPECT_EQ(format->type, type);
    EXPECT_EQ(&format->geometry, tensor_type_info(type)) << tensor_type_name(type) << ": gguf's entry, not a copy";
    EXPECT_EQ(format->activation, activation) << tensor_type_name(type);
    EXPECT_EQ(&weight_format(type, "test"), format);
  }
  EXPECT_EQ(find_weight_format(TensorType::Q8_K), nullptr);
  EXPECT_THROW(weight_format(TensorType::IQ4_NL, "test"), Error);
  EXPECT_EQ(activation_group(ActivationFormat::Q8_0), 32);
  EXPECT_EQ(activation_group(ActivationFormat::Q8_1), 32);
  EXPECT_EQ(activation_group(ActivationFormat::Q8_K), 256);
  EXPECT_EQ(activation_group(ActivationFormat::F16), 0);
}

TEST(WeightFormatTable, VisitorReachesTheDecoderOfEachTypeAndRejectsOthers) {
  for (const auto& c : kAllTypes) {
    const int unit = visit_weight_type(c.type, "test", [](auto type) {
      return WeightBlock<decltype(type)::value>::kUnitElements;
    });
    EXPECT_EQ(unit, std::max(c.block_elements, kRunElements)) << c.name;
  }
  EXPECT_THROW(visit_weight_type(TensorType::Q2_K, "test", [](auto) { return 0; }), Error);
}

uint16_t u16_at(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

// Element i of a block, decoded from ggml's byte layouts (field offsets counted by hand from the block structs),
// one element at a time and with ggml's operation order; written apart from weight_blocks.h.
float reference_element(TensorType type, const uint8_t* block, int i) {
  auto half = [&](int offset) { return f16_to_f32(u16_at(block + offset)); };
  auto nibble = [](const uint8_t* qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; };
  auto fifth_bit = [](const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; };
  // Q4_K / Q5_K: 6-bit scale and min of sub-block s from the 12 bytes at block + 4.
  auto scale_min = [&](int s, int* sc, int* m) {
    const uint8_t* q = block + 4;
    if (s < 4) {
      *sc = q[s] & 63, *m = q[s + 4] & 63;
    } else {
      *sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4), *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
  };
  switch (type) {
    case TensorType::Q8_0: return float(int8_t(block[2 + i])) * half(0);
    case TensorType::Q4_0: return float(nibble(block + 2, i) - 8) * half(0);
    case TensorType::Q4_1: { const float p = float(nibble(block + 4, i)) * half(0); return p + half(2); }
    case TensorType::Q5_0: return float((nibble(block + 6, i) | (fifth_bit(block + 2, i) << 4)) - 16) * half(0);
    case TensorType::Q5_1: {
      const float p = float(nibble(block + 8, i) | (fifth_bit(block + 4, i) << 4)) * half(0);
      return p + half(2);
    }
    case TensorType::Q4_K: case TensorType::Q5_K: {
      const bool five = type == TensorType::Q5_K;
      const uint8_t* qs = block + (five ? 48 : 16);
      const int s = i / 32, l = i % 32;
      int sc, m;
      scale_min(s, &sc, &m);
      int q = (s % 2 == 0) ? (qs[32 * (s / 2) + l] & 15) : (qs[32 * (s / 2) + l] >> 4);
      if (five) q |= ((block[16 + l] >> s) & 1) << 4;
      const float p = (half(0) * float(sc)) * float(q);
      return p - half(2) * float(m);
    }
    case TensorType::Q6_K: {
      const uint8_t *ql = block, *qh = block + 128;
      const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
      const int h = i / 128, k = (i % 128) / 32, l = i % 32;
      const uint8_t low_byte = ql[64 * h + 32 * (k % 2) + l];
      const int low = k < 2 ? (low_byte & 15) : (low_byte >> 4);
      const int q = (low | (((qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
      return half(208) * float(scales[8 * h + (i % 128) / 16]) * float(q);
    }
    default: return NAN;
  }
}

TEST(WeightBlocks, DecodeEveryElementLikeTheLayoutDefinition) {
  std::mt19937 rng(31);
  for (const auto& c : kAllTypes) {
    if (c.block_elements == 1) continue;  // plain types: the half/bfloat16 tests above
    const size_t n_blocks = 512;
    std::vector<uint8_t> bytes(n_blocks * c.block_bytes);
    for (auto& b : bytes) b = uint8_t(rng());
    for (size_t i = 0; i < n_blocks; ++i) {  // finite scales; every other byte random
      for (size_t offset : {size_t(0), size_t(2), size_t(208)}) {
        if (offset + 2 > c.block_bytes || (offset == 208) != (c.type == TensorType::Q6_K)) continue;
        const uint16_t h = f32_to_f16(std::ldexp(float(rng() % 1000 + 1), -int(rng() % 12) - 4));
        std::memcpy(bytes.data() + i * c.block_bytes + offset, &h, 2);
      }
    }
    std::vector<float> decoded(n_blocks * c.block_elements);
    dequantize_row(c.type, bytes.data(), decoded.data(), int64_t(decoded.size()));
    for (size_t i = 0; i < decoded.size(); ++i) {
      const float want = reference_element(c.type, bytes.data() + (i / c.block_elements) * c.block_bytes,
                                           int(i % c.block_elements));
      ASSERT_EQ(bits_of(decoded[i]), bits_of(want)) << c.name << " element " << i << ": " << decoded[i] << " vs "
                                                    << want;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Quantize -> dequantize error, without llama.cpp.

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double relative_rmse(const std::vector<float>& want, const std::vector<float>& got) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    ref += double(want[i]) * want[i];
  }
  return std::sqrt(err / ref);
}

std::vector<float> round_trip(TensorType type, const std::vector<float>& x, size_t block_bytes, int per_block) {
  std::vector<uint8_t> packed(x.size() / per_block * block_bytes);
  quantize_row(type, x.data(), packed.data(), int64_t(x.size()));
  std::vector<float> y(x.size());
  dequantize_row(type, packed.data(), y.data(), int64_t(x.size()));
  return y;
}

// Relative RMSE bounds on unit Gaussian data, about 20% above what our quantizers measure (f16 2.1e-4, bf16
// 1.65e-3, q8_0 0.0053, q4_0 0.086, q4_1 0.078, q5_0 0.042, q5_1 0.038, q4_K 0.071, q5_K 0.036, q6_K 0.017).
double error_bound(TensorType type) {
  switch (type) {
    case TensorType::F32: return 0.0;
    case TensorType::F16: return 2.6e-4;
    case TensorType::BF16: return 2.0e-3;
    case TensorType::Q8_0: return 0.0064;
    case TensorType::Q4_0: return 0.103;
    case TensorType::Q4_1: return 0.094;
    case TensorType::Q5_0: return 0.051;
    case TensorType::Q5_1: return 0.046;
    case TensorType::Q4_K: return 0.085;
    case TensorType::Q5_K: return 0.043;
    case TensorType::Q6_K: return 0.021;
    default: return 0.0;
  }
}

TEST(Quantize, RoundTripErrorWithinBoundForEveryType) {
  const std::vector<float> x = gaussian(256 * 64, 7);
  for (const auto& c : kAllTypes) {
    const double rmse = relative_rmse(x, round_trip(c.type, x, c.block_bytes, c.block_elements));
    EXPECT_LE(rmse, error_bound(c.type)) << c.name;
    if (c.type == TensorType::F32) {
      EXPECT_EQ(rmse, 0.0);
    }
  }
}

TEST(Quantize, ZeroAndConstantBlocksStayExactOrClose) {
  for (const auto& c : kAllTypes) {
    std::vector<float> zeros(256, 0.0f);
    const auto y = round_trip(c.type, zeros, c.block_bytes, c.block_elements);
    for (float v : y) ASSERT_EQ(v, 0.0f) << c.name;
    // One large outlier per block must not wreck the type's ability to represent it.
    std::vector<float> spiky = gaussian(256, 3, 0.01f);
    spiky[5] = 4.0f;
    const auto z = round_trip(c.type, spiky, c.block_bytes, c.block_elements);
    EXPECT_NEAR(z[5], 4.0f, 0.3f) << c.name;
  }
}

// The activation reference (shared by the CPU kernels' group arithmetic and the GPU's) against ggml's
// definitions written independently in ggml_activations.h: equal values; 8-bit values in range and
// scale * q equal to the rounded value; sum32 as each format defines it.
TEST(ActivationReference, MatchesGgmlDefinitionsForEveryFormat) {
  std::vector<float> x = gaussian(256 * 12, 5);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;
  std::fill(x.begin() + 512, x.begin() + 768, 0.0f);                     // all-zero groups
  for (int i = 0; i < 32; ++i) x[size_t(1024 + i)] = 0.5f * float(i - 16);  // ties at x * 127 / amax
  const ActivationFormat all[] = {ActivationFormat::F32, ActivationFormat::F16, ActivationFormat::BF16,
                                  ActivationFormat::Q8_0, ActivationFormat::Q8_1, ActivationFormat::Q8_K};
  for (ActivationFormat format : all) {
    const std::vector<float> want = testing::ggml_activations(format, x);
    std::vector<float> got(x.size());
    round_activations(format, x.data(), int64_t(x.size()), got.data());
    // Exact equality (a zero's sign aside: the definition's nearbyint keeps it, an integer 0 does not).
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], want[i]) << int(format) << " " << i;
    const int group = activation_group(format);
    if (group == 0) continue;
    std::vector<int8_t> q(x.size());
    std::vector<float> scale(x.size() / size_t(group)), sum32(x.size() / 32);
    quantize_activations(format, x.data(), int64_t(x.size()), q.data(), scale.data(), sum32.data());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_GE(q[i], -127);
      ASSERT_EQ(scale[i / size_t(group)] * float(q[i]), want[i]) << int(format) << " " << i;
    }
    for (size_t k = 0; k < sum32.size(); ++k) {
      int sum = 0;
      for (size_t i = 32 * k; i < 32 * k + 32; ++i) sum += q[i];
      const float d = scale[32 * k / size_t(group)];
      // Q8_1 stores f16(d * sum) with the unrounded d = amax / 127: within an f16 rounding of the exact value.
      const float exact = d * float(sum);
      if (format == ActivationFormat::Q8_1) {
        EXPECT_NEAR(sum32[k], exact, std::fabs(exact) * 0x1.0p-10 + 1e-30) << k;
        EXPECT_EQ(sum32[k], f16_to_f32(f32_to_f16(sum32[k]))) << "an f16 value";
      } else {
        EXPECT_EQ(bits_of(sum32[k]), bits_of(exact)) << int(format) << " sum " << k;
      }
    }
  }
  std::vector<float> out(100);
  EXPECT_THROW(round_activations(ActivationFormat::Q8_0, x.data(), 100, out.data()), Error);
  std::vector<int8_t> q(256);
  EXPECT_THROW(quantize_activations(ActivationFormat::F16, x.data(), 256, q.data(), out.data(), out.data()), Error);
}

TEST(Quantize, RejectsPartialBlocksAndUnsupportedTypes) {
  std::vector<float> x(48, 1.0f);
  std::vector<uint8_t> out(1024);
  EXPECT_THROW(quantize_row(TensorType::Q4_K, x.data(), out.data(), 48), Error);
  EXPECT_THROW(dequantize_row(TensorType::Q8_0, out.data(), x.data(), 40), Error);
  EXPECT_THROW(dequantize_row(TensorType::IQ2_XXS, out.data(), x.data(), 256), Error);
  EXPECT_FALSE(is_supported_weight_type(TensorType::Q2_K));
  for (const auto& c : kAllTypes) EXPECT_TRUE(is_supported_weight_type(c.type)) << c.name;
}

// ---------------------------------------------------------------------------------------------------------
// Bit-exactness against llama.cpp's libggml-base.

// The leading fields of ggml's `struct ggml_type_traits` (its public header), in the header's order.
struct GgmlTypeTraitsPrefix {
  const char* type_name;
  int64_t blck_size;
  int64_t blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  void (*to_float)(const void* x, float* y, int64_t k);
  void (*from_float_ref)(const float* x, void* y, int64_t k);
};
using GetTypeTraits = const GgmlTypeTraitsPrefix* (*)(int type);

class GgmlBase {
 public:
  GgmlBase() {
    path_ = (resources::llama_cpp_prefix() / "lib/libggml-base.so").string();
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_) get_traits_ = reinterpret_cast<GetTypeTraits>(dlsym(handle_, "ggml_get_type_traits"));
  }
  ~GgmlBase() {
    if (handle_) dlclose(handle_);
  }
  bool ok() const { return get_traits_ != nullptr; }
  const std::string& path() const { return path_; }
  const GgmlTypeTraitsPrefix* traits(TensorType t) const { return get_traits_(int(t)); }

 private:
  std::string path_;
  void* handle_ = nullptr;
  GetTypeTraits get_traits_ = nullptr;
};

std::string why_skipped(const GgmlBase& lib) {
  return "llama.cpp's libggml-base.so not loadable at " + lib.path() +
         " (build it with scripts/build-llama-cpp or set SPARROW_LLAMA_CPP to its prefix)";
}

using testing::half_fields;

uint16_t random_finite_half(std::mt19937& rng) {
  for (;;) {
    const uint16_t h = uint16_t(rng());
    if (((h >> 10) & 0x1F) != 0x1F) return h;
  }
}

// Random blocks: arbitrary quant bytes, finite f16 scales; plain f16/bf16 rows of finite values.
std::vector<uint8_t> random_blocks(const TypeCase& c, size_t n_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n_blocks * c.block_bytes);
  for (auto& b : bytes) b = uint8_t(rng());
  for (size_t i = 0; i < n_blocks; ++i) {
    uint8_t* block = bytes.data() + i * c.block_bytes;
    if (c.type == TensorType::F16) {
      const uint16_t h = random_finite_half(rng);
      std::memcpy(block, &h, 2);
    } else if (c.type == TensorType::BF16) {
      uint16_t h;
      do h = uint16_t(rng()); while (((h >> 7) & 0xFF) == 0xFF);
      std::memcpy(block, &h, 2);
    }
    for (size_t offset : half_fields(c.type)) {
      const uint16_t h = random_finite_half(rng);
      std::memcpy(block + offset, &h, 2);
    }
  }
  return bytes;
}

TEST(GgmlBitExact, TraitsAgreeOnBlockGeometry) {
  GgmlBase lib;
  REQUIRE_LLAMA_CPP_REFERENCE(lib.ok(), why_skipped(lib));
  for (const auto& c : kAllTypes) {
    const auto* t = lib.traits(c.type);
    ASSERT_NE(t, nullptr) << c.name;
    EXPECT_STREQ(t->type_name, c.name);
    EXPECT_EQ(t->blck_size, c.block_elements) << c.name;
    EXPECT_EQ(t->type_size, c.block_bytes) << c.name;
  }
}

TEST(GgmlBitExact, DequantizeRowMatchesGgmlToFloat) {
  GgmlBase lib;
  REQUIRE_LLAMA_CPP_REFERENCE(lib.ok(), why_skipped(lib));
  for (const auto& c : kAllTypes) {
    if (c.type == TensorType::F32) continue;  // ggml has no to_float for f32: it is a plain copy
    const auto* t = lib.traits(c.type);
    ASSERT_NE(t->to_float, nullptr) << c.name;
    const size_t n_blocks = c.block_elements == 1 ? 65536 : 4096;
    const auto bytes = random_blocks(c, n_blocks, 1234 + uint32_t(c.type));
    const int64_t n = int64_t(n_blocks) * c.block_elements;
    std::vector<float> ours(n), theirs(n);
    dequantize_row(c.type, bytes.data(), ours.data(), n);
    t->to_float(bytes.data(), theirs.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits_of(ours[i]), bits_of(theirs[i]))
          << c.name << " element " << i << " (block " << i / c.block_elements << "): ours " << ours[i]
          << ", ggml " << theirs[i];
    }
    EXPECT_EQ(std::memcmp(ours.data(), theirs.data(), n * sizeof(float)), 0) << c.name;
  }
}

// Our quantizers need not match ggml's bit for bit, but their error must be of the same size; and ggml's
// blocks must decode identically through our dequantize_row (the layouts agree on real encoder output).
TEST(GgmlBitExact, QuantizeErrorComparableToGgml) {
  GgmlBase lib;
  REQUIRE_LLAMA_CPP_REFERENCE(lib.ok(), why_skipped(lib));
  const std::vector<float> x = gaussian(256 * 64, 99);
  for (const auto& c : kAllTypes) {
    if (c.type == TensorType::F32) continue;
    const auto* t = lib.traits(c.type);
    ASSERT_NE(t->from_float_ref, nullptr) << c.name;
    std::vector<uint8_t> packed(x.size() / c.block_elements * c.block_bytes);
    t->from_float_ref(x.data(), packed.data(), int64_t(x.size()));
    std::vector<float> ours(x.size()), theirs(x.size());
    dequantize_row(c.type, packed.data(), ours.data(), int64_t(x.size()));
    t->to_float(packed.data(), theirs.data(), int64_t(x.size()));
    EXPECT_EQ(std::memcmp(ours.data(), theirs.data(), x.size() * sizeof(float)), 0) << c.name;
    const double ggml_rmse = relative_rmse(x, theirs);
    const double our_rmse = relative_rmse(x, round_trip(c.type, x, c.block_bytes, c.block_elements));
    EXPECT_LE(our_rmse, 1.10 * ggml_rmse + 1e-7) << c.name << ": ours " << our_rmse << ", ggml " << ggml_rmse;
  }
}

}  // namespace
}  // namespace sparrow::formats
