#pragma once
// The bit layouts of the weight types Sparrow computes with (llama.cpp-identical blocks) and their decoding,
// written once as host/device inline functions: the reference dequantization (weight_formats.cpp) and the CUDA
// kernels (src/cuda/) both decode through WeightBlock<T>::decode_run, so each layout is decoded in one place.
// Geometry (elements and bytes per block) is gguf/tensor_types.h's; the static_asserts below tie each struct
// to it.
//
// Decoding is by runs of kRunElements consecutive elements: a run never straddles a block, a sub-block or a
// scale group, so decoding one costs a few scale loads and eight quant extractions, and a GPU thread can own
// one run.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/host_device.h"
#include "gguf/tensor_types.h"

namespace sparrow::formats {

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK_K = 256, K_SCALE_SIZE = 12;
constexpr int kRunElements = 8;

// IEEE half and bfloat16 as stored in files.
using f16_bits = uint16_t;
using bf16_bits = uint16_t;

struct BlockQ4_0 { f16_bits d; uint8_t qs[QK4_0 / 2]; };
struct BlockQ4_1 { f16_bits d, m; uint8_t qs[QK4_1 / 2]; };
struct BlockQ5_0 { f16_bits d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct BlockQ5_1 { f16_bits d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct BlockQ8_0 { f16_bits d; int8_t qs[QK8_0]; };
struct BlockQ4_K { f16_bits d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { f16_bits d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; f16_bits d; };

// ---------------------------------------------------------------------------------------------------------
// Scalars.

// memcpy rather than std::bit_cast on the host: nvcc compiles CUDA sources as C++17.
SPARROW_HOST_DEVICE inline float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

SPARROW_HOST_DEVICE inline uint32_t bits_of_float(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// Exact for every half. Finite halves without branches: the 15 magnitude bits shifted into a float's exponent
// and mantissa are the value times 2^-112 (subnormal halves included); inf stays inf and NaN comes out quiet,
// as a float multiply would make it.
SPARROW_HOST_DEVICE inline float f16_to_f32(f16_bits h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t magnitude_bits = h & 0x7FFFu;
  if (magnitude_bits >= 0x7C00u) {
    const uint32_t mantissa = h & 0x3FFu;
    return float_from_bits(sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0u));
  }
  const float magnitude = float_from_bits(magnitude_bits << 13) * 0x1.0p112f;
  return float_from_bits(bits_of_float(magnitude) | sign);
}

SPARROW_HOST_DEVICE inline float bf16_to_f32(bf16_bits h) { return float_from_bits(uint32_t(h) << 16); }

// Float to half, rounded to nearest even like ggml's GGML_FP32_TO_FP16 (and the GPU's __float2half_rn); NaN
// becomes the canonical quiet NaN, magnitudes that round past 65504 become inf.
SPARROW_HOST_DEVICE inline f16_bits f32_to_f16(float f) {
  const uint32_t bits = bits_of_float(f);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000u) return uint16_t(sign | 0x7E00);
  if (magnitude >= 0x477FF000u) return uint16_t(sign | 0x7C00);
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal, in units of 2^-24, rounded to nearest even.
    // Adding 0.5 (2^-1) puts the units at the bottom of the float mantissa and lets the FPU round.
    const float shifted = float_from_bits(magnitude) + 0.5f;
    return uint16_t(sign | (bits_of_float(shifted) - bits_of_float(0.5f)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const uint32_t odd = (magnitude >> 13) & 1;
  const uint32_t rounded = magnitude + 0xFFF + odd;
  return uint16_t(sign | ((rounded - (112u << 23)) >> 13));
}

// Float to bfloat16, rounded to nearest even; NaN stays a (quiet) NaN. Like ggml.
SPARROW_HOST_DEVICE inline bf16_bits f32_to_bf16(float f) {
  const uint32_t bits = bits_of_float(f);
  if ((bits & 0x7FFFFFFF) > 0x7F800000u) return uint16_t((bits >> 16) | 0x0040);
  return uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// a * b + c with the product rounded to float before the add, never one fused multiply-add: ggml's reference
// dequantization rounds twice, and bit-exactness with it depends on that. Two statements keep clang (contract
// "on") from fusing; GCC is kept from it by fp-contract=off in the including file (weight_formats.cpp); CUDA's
// __fmul_rn / __fadd_rn are never fused.
SPARROW_HOST_DEVICE inline float product_plus(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  const float product = a * b;
  return product + c;
#endif
}

// The little-endian 32-bit word at p (any alignment).
SPARROW_HOST_DEVICE inline uint32_t load_u32_le(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// The 12 scale bytes of Q4_K/Q5_K hold eight 6-bit scales and eight 6-bit mins: sub-blocks 0..3 in the low
// six bits of bytes 0..3 (scales) and 4..7 (mins); sub-blocks 4..7 split into a low nibble in bytes 8..11
// and their top two bits in the spare high bits of bytes 0..7.
SPARROW_HOST_DEVICE inline void unpack_scale_min_k4(const uint8_t scales[K_SCALE_SIZE], int sub, uint8_t* scale,
                                                    uint8_t* min) {
  if (sub < 4) {
    *scale = scales[sub] & 63;
    *min = scales[sub + 4] & 63;
  } else {
    *scale = uint8_t((scales[sub + 4] & 0x0F) | ((scales[sub - 4] >> 6) << 4));
    *min = uint8_t((scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4));
  }
}

// ---------------------------------------------------------------------------------------------------------
// WeightBlock<T>: the decode unit of type T (one block; for plain types, a run of kRunElements elements) and
//   static void decode_run(const Unit& u, int first, float* out);
// which writes elements [first, first + kRunElements) of the unit (first a multiple of kRunElements) to out,
// with ggml's arithmetic: the same operations in the same order, so the results are ggml's to the bit.

template <TensorType T>
struct WeightBlock;

template <class Element>
struct PlainRun { Element v[kRunElements]; };

template <>
struct WeightBlock<TensorType::F32> {
  using Unit = PlainRun<float>;
  static constexpr int kUnitElements = kRunElements;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& u, int, float* out) {
    for (int k = 0; k < kRunElements; ++k) out[k] = u.v[k];
  }
};

template <>
struct WeightBlock<TensorType::F16> {
  using Unit = PlainRun<f16_bits>;
  static constexpr int kUnitElements = kRunElements;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& u, int, float* out) {
    for (int k = 0; k < kRunElements; ++k) out[k] = f16_to_f32(u.v[k]);
  }
};

template <>
struct WeightBlock<TensorType::BF16> {
  using Unit = PlainRun<bf16_bits>;
  static constexpr int kUnitElements = kRunElements;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& u, int, float* out) {
    for (int k = 0; k < kRunElements; ++k) out[k] = bf16_to_f32(u.v[k]);
  }
};

// Q8_0: value = d * q, q a signed byte.
template <>
struct WeightBlock<TensorType::Q8_0> {
  using Unit = BlockQ8_0;
  static constexpr int kUnitElements = QK8_0;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& b, int first, float* out) {
    const float d = f16_to_f32(b.d);
    for (int k = 0; k < kRunElements; ++k) out[k] = float(b.qs[first + k]) * d;
  }
};

// The 4-bit quant of element j (0..31) of a 32-element block: the low nibble of qs[j] for j < 16, else the high
// nibble of qs[j - 16].
SPARROW_HOST_DEVICE inline int nibble_of_32(const uint8_t qs[16], int j) {
  return j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
}

// Q4_0: value = (q - 8) * d.
template <>
struct WeightBlock<TensorType::Q4_0> {
  using Unit = BlockQ4_0;
  static constexpr int kUnitElements = QK4_0;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& b, int first, float* out) {
    const float d = f16_to_f32(b.d);
    for (int k = 0; k < kRunElements; ++k) out[k] = float(nibble_of_32(b.qs, first + k) - 8) * d;
  }
};

// Q4_1: value = q * d + m.
template <>
struct WeightBlock<TensorType::Q4_1> {
  using Unit = BlockQ4_1;
  static constexpr int kUnitElements = QK4_1;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& b, int first, float* out) {
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    for (int k = 0; k < kRunElements; ++k) out[k] = product_plus(float(nibble_of_32(b.qs, first + k)), d, m);
  }
};

// Q5: the fifth bit of element j (0..31) is bit j of the little-endian qh word.
SPARROW_HOST_DEVICE inline int q5_of_32(const uint8_t qs[16], uint32_t qh, int j) {
  return nibble_of_32(qs, j) | int(((qh >> j) & 1u) << 4);
}

// Q5_0: value = (q - 16) * d.
template <>
struct WeightBlock<TensorType::Q5_0> {
  using Unit = BlockQ5_0;
  static constexpr int kUnitElements = QK5_0;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& b, int first, float* out) {
    const float d = f16_to_f32(b.d);
    const uint32_t qh = load_u32_le(b.qh);
    for (int k = 0; k < kRunElements; ++k) out[k] = float(q5_of_32(b.qs, qh, first + k) - 16) * d;
  }
};

// Q5_1: value = q * d + m.
template <>
struct WeightBlock<TensorType::Q5_1> {
  using Unit = BlockQ5_1;
  static constexpr int kUnitElements = QK5_1;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& b, int first, float* out) {
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    const uint32_t qh = load_u32_le(b.qh);
    for (int k = 0; k < kRunElements; ++k) out[k] = product_plus(float(q5_of_32(b.qs, qh, first + k)), d, m);
  }
};

// Q4_K and Q5_K: 8 sub-blocks of 32 elements, value = (d * scale) * q - (dmin * min). Element 64c + l (l < 32)
// is the low nibble of qs[32c + l], element 64c + 32 + l its high nibble; Q5_K's fifth bit of element e in
// sub-block s = e / 32 is bit s of qh[e % 32].
template <bool kFifthBit, class Block>
SPARROW_HOST_DEVICE inline void decode_k4_run(const Block& b, const uint8_t* qh, int first, float* out) {
  const int sub = first / 32, chunk = sub / 2, l0 = first % 32;
  uint8_t sc, mn;
  unpack_scale_min_k4(b.scales, sub, &sc, &mn);
  const float scale = f16_to_f32(b.d) * float(sc), min = f16_to_f32(b.dmin) * float(mn);
  const uint8_t* q = b.qs + 32 * chunk;
  for (int k = 0; k < kRunElements; ++k) {
    const int l = l0 + k;
    int level = (sub & 1) ? (q[l] >> 4) : (q[l] & 0x0F);
    if constexpr (kFifthBit) level += ((qh[l] >> sub) & 1) << 4;
    out[k] = product_plus(scale, float(level), -min);
  }
}

template <>
struct WeightBlock<TensorType::Q4_K> {
  using Unit = BlockQ4_K;
  static constexpr int kUnitElements = QK_K;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& b, int first, float* out) {
    decode_k4_run<false>(b, nullptr, first, out);
  }
};

template <>
struct WeightBlock<TensorType::Q5_K> {
  using Unit = BlockQ5_K;
  static constexpr int kUnitElements = QK_K;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& b, int first, float* out) {
    decode_k4_run<true>(b, b.qh, first, out);
  }
};

// Q6_K: 16 sub-blocks of 16 elements, value = (d * scale) * (q - 32), q 6 bits. Each half of 128 elements uses
// 64 ql bytes, 32 qh bytes and 8 scales; element 32k + l of the half (k 0..3, l 0..31) takes nibble (k >= 2) of
// ql[l + 32 (k & 1)] and bits 2k..2k+1 of qh[l].
template <>
struct WeightBlock<TensorType::Q6_K> {
  using Unit = BlockQ6_K;
  static constexpr int kUnitElements = QK_K;
  SPARROW_HOST_DEVICE static void decode_run(const Unit& b, int first, float* out) {
    const int half = first / 128, k = (first % 128) / 32, l0 = first % 32;
    const uint8_t* ql = b.ql + 64 * half + 32 * (k & 1);
    const uint8_t* qh = b.qh + 32 * half;
    const float scale = f16_to_f32(b.d) * float(b.scales[8 * half + 2 * k + l0 / 16]);
    for (int j = 0; j < kRunElements; ++j) {
      const int l = l0 + j;
      const int low = k < 2 ? (ql[l] & 0x0F) : (ql[l] >> 4);
      const int q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
      out[j] = scale * float(q);
    }
  }
};

// Every decode unit is a whole number of the file's blocks, as gguf/tensor_types.h sizes them. (No null check on
// the table entry: a type missing from it makes the dereference a compile error already, and gcc with
// -fsanitize=address does not treat that pointer comparison as a constant expression.)
template <TensorType T>
constexpr bool unit_matches_file_geometry() {
  constexpr const TensorTypeInfo* info = tensor_type_info(T);
  using W = WeightBlock<T>;
  return W::kUnitElements % info->block_elements == 0 &&
         W::kUnitElements % kRunElements == 0 &&
         sizeof(typename W::Unit) == size_t(W::kUnitElements / info->block_elements) * info->block_bytes;
}
static_assert(unit_matches_file_geometry<TensorType::F32>() && unit_matches_file_geometry<TensorType::F16>() &&
              unit_matches_file_geometry<TensorType::BF16>() && unit_matches_file_geometry<TensorType::Q8_0>() &&
              unit_matches_file_geometry<TensorType::Q4_0>() && unit_matches_file_geometry<TensorType::Q4_1>() &&
              unit_matches_file_geometry<TensorType::Q5_0>() && unit_matches_file_geometry<TensorType::Q5_1>() &&
              unit_matches_file_geometry<TensorType::Q4_K>() && unit_matches_file_geometry<TensorType::Q5_K>() &&
              unit_matches_file_geometry<TensorType::Q6_K>());

}  // namespace sparrow::formats
