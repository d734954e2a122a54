#pragma once
// The block weight types as 8-bit integer codes: within a sub-block s of kSubBlock (16 or 32) consecutive
// elements, every value is scale_s * code + min_s, with code a small signed integer and scale_s, min_s floats.
// This is the form an integer matrix product needs (cuda/matmul_int8.cu: the decode GEMV and the tensor-core GEMM): the codes are
// multiplied with the activations' 8-bit codes in int32, and the scale and min applied once per sub-block.
// Written once, host/device, for the kernels and the tests (tests/unit/weight_int8_test.cpp checks it against
// dequantize_row for every type).
//
//   type  sub-block  code                        scale              min
//   Q8_0  32         q (-128..127)               d                  0
//   Q4_0  32         nibble - 8 (-8..7)          d                  0
//   Q4_1  32         nibble (0..15)              d                  m
//   Q5_0  32         q5 - 16 (-16..15)           d                  0
//   Q5_1  32         q5 (0..31)                  d                  m
//   Q4_K  32         nibble (0..15)              d * scale_s        -(dmin * min_s)
//   Q5_K  32         q5 (0..31)                  d * scale_s        -(dmin * min_s)
//   Q6_K  16         q6 - 32 (-32..31)           d * scale_s        0
//
// Bit-compatibility. weight_int8_value(scale_min, code) below forms scale * code + min with exactly the float
// operations WeightBlock<T>::decode_run uses (the same scale and min, computed in the same order; product_plus where
// the decoder adds a min), so it equals the decoded float bit for bit for every element of every type (up to the sign
// of a zero: decode's float(q) * d and d * q here are the same product). An integer product is a different matter: it
// computes sum_i code_i * x_i exactly and applies scale and min once, i.e. it multiplies by the real number scale *
// code + min, not by its float rounding. The two are the same number where the decoder's arithmetic is exact, which is
// wherever it only multiplies: an f16 (11 significant bits) times a sub-block scale (at most 7) times a code (at most
// 7) has at most 24 significant bits and fits a float. So Q8_0, Q4_0, Q5_0 and Q6_K decode exactly. The min addition of
// Q4_1, Q5_1, Q4_K and Q5_K rounds: there the decoded float can differ from scale * code + min by half an ulp (2^-24
// relative). Error bounds for integer products therefore carry one extra 2^-24 relative term per element
// (tests/gpu/matmul_int8_test.cpp).
//
// WeightInt8<T>, for the types above (kSupported true; false for every other type):
//   Unit                      WeightBlock<T>::Unit (one file block; one 256-element super-block for K-quants)
//   kSubBlock                 elements per sub-block: 16 or 32
//   kSubBlocks                sub-blocks per unit
//   kHasMin                   whether min can be nonzero (else it is always 0 and may be skipped)
//   kMaxAbsCode               the largest |code|: bounds integer dot products
//   decode_sub_block(u, s, codes) -> SubBlockScale
//                             writes the kSubBlock codes of sub-block s (0 <= s < kSubBlocks) of unit u to codes
//                             and returns its {scale, min}.
#include <cstdint>

#include "formats/host_device.h"
#include "formats/weight_blocks.h"
#include "gguf/tensor_types.h"

// Full unrolling keeps a sub-block's codes in registers on the device; host compilers ignore the loops' hint.
#if defined(__CUDA_ARCH__)
#define SPARROW_INT8_UNROLL _Pragma("unroll")
#else
#define SPARROW_INT8_UNROLL
#endif

namespace sparrow::formats {

struct SubBlockScale {
  float scale;
  float min;
};

// The float value of one element of a sub-block, with the decoder's arithmetic (see above).
template <bool kHasMin>
SPARROW_HOST_DEVICE inline float weight_int8_value(SubBlockScale s, int code) {
  if constexpr (kHasMin) {
    return product_plus(s.scale, float(code), s.min);
  } else {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(s.scale, float(code));
#else
    return s.scale * float(code);
#endif
  }
}

template <TensorType T>
struct WeightInt8 {
  static constexpr bool kSupported = false;
};

// Shared by the specializations: geometry from WeightBlock<T>.
template <TensorType T, int kSub, bool kMin, int kMaxCode>
struct WeightInt8Geometry {
  static constexpr bool kSupported = true;
  using Unit = typename WeightBlock<T>::Unit;
  static constexpr int kSubBlock = kSub;
  static constexpr int kSubBlocks = WeightBlock<T>::kUnitElements / kSub;
  static constexpr bool kHasMin = kMin;
  static constexpr int kMaxAbsCode = kMaxCode;
  static_assert(WeightBlock<T>::kUnitElements % kSub == 0, "a unit is whole sub-blocks");
};

template <>
struct WeightInt8<TensorType::Q8_0> : WeightInt8Geometry<TensorType::Q8_0, 32, false, 128> {
  SPARROW_HOST_DEVICE static SubBlockScale decode_sub_block(const Unit& b, int, int8_t* codes) {
    SPARROW_INT8_UNROLL
    for (int j = 0; j < 32; ++j) codes[j] = b.qs[j];
    return {f16_to_f32(b.d), 0.0f};
  }
};

template <>
struct WeightInt8<TensorType::Q4_0> : WeightInt8Geometry<TensorType::Q4_0, 32, false, 8> {
  SPARROW_HOST_DEVICE static SubBlockScale decode_sub_block(const Unit& b, int, int8_t* codes) {
    SPARROW_INT8_UNROLL
    for (int j = 0; j < 32; ++j) codes[j] = int8_t(nibble_of_32(b.qs, j) - 8);
    return {f16_to_f32(b.d), 0.0f};
  }
};

template <>
struct WeightInt8<TensorType::Q4_1> : WeightInt8Geometry<TensorType::Q4_1, 32, true, 15> {
  SPARROW_HOST_DEVICE static SubBlockScale decode_sub_block(const Unit& b, int, int8_t* codes) {
    SPARROW_INT8_UNROLL
    for (int j = 0; j < 32; ++j) codes[j] = int8_t(nibble_of_32(b.qs, j));
    return {f16_to_f32(b.d), f16_to_f32(b.m)};
  }
};

template <>
struct WeightInt8<TensorType::Q5_0> : WeightInt8Geometry<TensorType::Q5_0, 32, false, 16> {
  SPARROW_HOST_DEVICE static SubBlockScale decode_sub_block(const Unit& b, int, int8_t* codes) {
    const uint32_t qh = load_u32_le(b.qh);
    SPARROW_INT8_UNROLL
    for (int j = 0; j < 32; ++j) codes[j] = int8_t(q5_of_32(b.qs, qh, j) - 16);
    return {f16_to_f32(b.d), 0.0f};
  }
};

template <>
struct WeightInt8<TensorType::Q5_1> : WeightInt8Geometry<TensorType::Q5_1, 32, true, 31> {
  SPARROW_HOST_DEVICE static SubBlockScale decode_sub_block(const Unit& b, int, int8_t* codes) {
    const uint32_t qh = load_u32_le(b.qh);
    SPARROW_INT8_UNROLL
    for (int j = 0; j < 32; ++j) codes[j] = int8_t(q5_of_32(b.qs, qh, j));
    return {f16_to_f32(b.d), f16_to_f32(b.m)};
  }
};

// Q4_K / Q5_K sub-block s (decode_k4_run's layout): the low (s even) or high (s odd) nibbles of
// qs[32 (s / 2) .. + 32), plus, for Q5_K, bit s of qh[0 .. 32) as the fifth bit. The decoder's value is
// product_plus(d * scale_s, level, -(dmin * min_s)): the same scale, and min negated (exactly).
template <bool kFifthBit, class Block>
SPARROW_HOST_DEVICE inline SubBlockScale decode_k4_sub_block(const Block& b, const uint8_t* qh, int s,
                                                             int8_t* codes) {
  uint8_t sc, mn;
  unpack_scale_min_k4(b.scales, s, &sc, &mn);
  const uint8_t* q = b.qs + 32 * (s / 2);
  const int shift = (s & 1) * 4;
  SPARROW_INT8_UNROLL
  for (int l = 0; l < 32; ++l) {
    int level = (q[l] >> shift) & 0x0F;
    if constexpr (kFifthBit) level |= ((qh[l] >> s) & 1) << 4;
    codes[l] = int8_t(level);
  }
  const float scale = f16_to_f32(b.d) * float(sc), min = f16_to_f32(b.dmin) * float(mn);
  return {scale, -min};
}

template <>
struct WeightInt8<TensorType::Q4_K> : WeightInt8Geometry<TensorType::Q4_K, 32, true, 15> {
  SPARROW_HOST_DEVICE static SubBlockScale decode_sub_block(const Unit& b, int s, int8_t* codes) {
    return decode_k4_sub_block<false>(b, nullptr, s, codes);
  }
};

template <>
struct WeightInt8<TensorType::Q5_K> : WeightInt8Geometry<TensorType::Q5_K, 32, true, 31> {
  SPARROW_HOST_DEVICE static SubBlockScale decode_sub_block(const Unit& b, int s, int8_t* codes) {
    return decode_k4_sub_block<true>(b, b.qh, s, codes);
  }
};

// Q6_K sub-block s (16 elements, decode_run's layout): element 16 s + j lies in half h = s / 8, quarter
// k = (s % 8) / 2 of that half, at l = 16 (s & 1) + j; its low nibble is nibble (k >= 2) of ql[64 h + 32 (k & 1) + l],
// its top two bits bits 2k..2k+1 of qh[32 h + l]; its scale is scales[s] (decode_run's 8 h + 2 k + l / 16).
template <>
struct WeightInt8<TensorType::Q6_K> : WeightInt8Geometry<TensorType::Q6_K, 16, false, 32> {
  SPARROW_HOST_DEVICE static SubBlockScale decode_sub_block(const Unit& b, int s, int8_t* codes) {
    const int half = s / 8, k = (s % 8) / 2, l0 = 16 * (s & 1);
    const uint8_t* ql = b.ql + 64 * half + 32 * (k & 1) + l0;
    const uint8_t* qh = b.qh + 32 * half + l0;
    const int low_shift = k < 2 ? 0 : 4, high_shift = 2 * k;
    SPARROW_INT8_UNROLL
    for (int j = 0; j < 16; ++j) {
      const int low = (ql[j] >> low_shift) & 0x0F;
      codes[j] = int8_t((low | (((qh[j] >> high_shift) & 3) << 4)) - 32);
    }
    return {f16_to_f32(b.d) * float(b.scales[s]), 0.0f};
  }
};

}  // namespace sparrow::formats
