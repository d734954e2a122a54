// formats/weight_int8.h against the reference decoder: for every block type with an 8-bit integer form and
// random blocks (fixed seeds), scale * code + min, formed with the decoder's float operations, equals
// dequantize_row bit for bit; the codes lie within kMaxAbsCode; and the real number scale * code + min (what an
// integer product multiplies by) equals the decoded float exactly where weight_int8.h says the decoder is exact,
// and within half an ulp elsewhere.

// value() repeats the decoder's a * b + c as two rounded operations: keep GCC from fusing them (as
// weight_formats.cpp does), before the includes so that it covers the inlined header functions.
#pragma GCC optimize("fp-contract=off")

#include "formats/weight_int8.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/weight_formats.h"
#include "random_weights.h"

namespace sparrow::formats {
namespace {

using testing::half_fields;

// n_units random units of type T: random bytes, f16 fields finite with random sign and magnitudes in
// [2^-14, 2^4] (normal halves of many exponents), plus a few tiny ones (subnormal halves) and zeros.
template <TensorType T>
std::vector<uint8_t> random_units(int n_units, uint32_t seed) {
  using Unit = typename WeightInt8<T>::Unit;
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(sizeof(Unit) * size_t(n_units));
  for (uint8_t& b : bytes) b = uint8_t(rng());
  const size_t file_block = tensor_type_info(T)->block_bytes;
  std::uniform_real_distribution<float> exponent(-14.0f, 4.0f);
  for (size_t block = 0; block < bytes.size() / file_block; ++block) {
    for (size_t offset : half_fields(T)) {
      float magnitude = std::exp2(exponent(rng));
      if (block % 17 == 3) magnitude = 0x1.0p-20f;  // a subnormal half
      if (block % 29 == 5) magnitude = 0.0f;
      const uint16_t h = f32_to_f16((rng() & 1 ? 1.0f : -1.0f) * magnitude);
      std::memcpy(bytes.data() + block * file_block + offset, &h, 2);
    }
  }
  return bytes;
}

// Whether the decoder's arithmetic is exact for T, so that the real scale * code + min is the decoded float.
constexpr bool decode_is_exact(TensorType type) {
  return type == TensorType::Q8_0 || type == TensorType::Q4_0 || type == TensorType::Q5_0 || type == TensorType::Q6_K;
}

template <TensorType T>
void check_type(uint32_t seed) {
  using W = WeightInt8<T>;
  using Unit = typename W::Unit;
  constexpr int kUnits = 64, kUnitElements = WeightBlock<T>::kUnitElements;
  const std::vector<uint8_t> bytes = random_units<T>(kUnits, seed);
  std::vector<float> decoded(size_t(kUnits) * kUnitElements);
  dequantize_row(T, bytes.data(), decoded.data(), int64_t(decoded.size()));
  const std::string name = tensor_type_name(T);
  int64_t mismatches = 0, inexact = 0;
  for (int u = 0; u < kUnits; ++u) {
    Unit unit;
    std::memcpy(&unit, bytes.data() + size_t(u) * sizeof(Unit), sizeof(Unit));
    for (int s = 0; s < W::kSubBlocks; ++s) {
      int8_t codes[W::kSubBlock];
      const SubBlockScale scale = W::decode_sub_block(unit, s, codes);
      if (!W::kHasMin) {
        ASSERT_EQ(scale.min, 0.0f) << name << " unit " << u << " sub-block " << s;
      }
      for (int j = 0; j < W::kSubBlock; ++j) {
        const size_t i = size_t(u) * kUnitElements + size_t(s) * W::kSubBlock + size_t(j);
        ASSERT_LE(std::abs(int(codes[j])), W::kMaxAbsCode) << name << " element " << i;
        const float got = weight_int8_value<W::kHasMin>(scale, codes[j]), want = decoded[i];
        // Bit for bit, but +0 and -0 alike (decode's float(q) * d against value's d * q).
        if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(want) && !(got == 0.0f && want == 0.0f)) {
          if (mismatches++ < 5) {
            ADD_FAILURE() << name << " unit " << u << " sub-block " << s << " element " << j << ": scale "
                          << scale.scale << " * code " << int(codes[j]) << " + min " << scale.min << " = " << got
                          << ", dequantize_row gives " << want;
          }
        }
        // The real number an integer product multiplies by, against the decoded float: equal where the
        // decoder is exact, else within half an ulp (2^-24 relative; 2^-150 absolute below the normal floats).
        const double real = double(scale.scale) * codes[j] + double(scale.min);
        const double error = std::fabs(real - double(want));
        if (real != double(want)) ++inexact;
        if (decode_is_exact(T)) {
          ASSERT_EQ(real, double(want)) << name << " element " << i;
        } else {
          ASSERT_LE(error, std::ldexp(std::fabs(double(want)), -24) + 0x1.0p-150) << name << " element " << i;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << name;
  std::printf("weight_int8 %-5s %d units: %lld elements differ from dequantize_row, %lld decoded inexactly\n",
              name.c_str(), kUnits, (long long)mismatches, (long long)inexact);
}

TEST(WeightInt8, ScaleTimesCodePlusMinIsDequantizeRowBitForBit) {
  check_type<TensorType::Q8_0>(1);
  check_type<TensorType::Q4_0>(2);
  check_type<TensorType::Q4_1>(3);
  check_type<TensorType::Q5_0>(4);
  check_type<TensorType::Q5_1>(5);
  check_type<TensorType::Q4_K>(6);
  check_type<TensorType::Q5_K>(7);
  check_type<TensorType::Q6_K>(8);
}

// Every supported block type of the format table has an integer form, and no float type claims one.
template <size_t kIndex = 0>
void expect_coverage() {
  if constexpr (kIndex < std::size(kWeightFormats)) {
    constexpr TensorType kType = kWeightFormats[kIndex].type;
    constexpr bool kBlockType = tensor_type_info(kType)->block_elements > 1;
    EXPECT_EQ(WeightInt8<kType>::kSupported, kBlockType) << tensor_type_name(kType);
    if constexpr (WeightInt8<kType>::kSupported) {
      // Sub-blocks never straddle an activation group boundary in a way the GEMM cannot index: 32-element
      // groups (Q8_0 / Q8_1) hold whole sub-blocks of 32; 256-element groups (Q8_K) hold whole sub-blocks.
      constexpr int kGroup = activation_group(kWeightFormats[kIndex].activation);
      EXPECT_EQ(kGroup % WeightInt8<kType>::kSubBlock, 0) << tensor_type_name(kType);
    }
    expect_coverage<kIndex + 1>();
  }
}

TEST(WeightInt8, CoversEveryBlockTypeOfTheFormatTable) { expect_coverage(); }

}  // namespace
}  // namespace sparrow::formats
