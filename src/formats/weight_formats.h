#pragma once
// The weight types Sparrow computes with, described once: one WeightFormat entry per type (the trait table
// the CPU and CUDA kernels share), their block layouts and decoding (weight_blocks.h), and the reference
// (scalar, obviously correct) conversions. Block geometry is gguf/tensor_types.h's, never restated here.
#include <cstddef>
#include <cstdint>
#include <string>
#include <iterator>
#include <type_traits>
#include <utility>

#include "formats/activation_blocks.h"
#include "formats/weight_blocks.h"
#include "gguf/tensor_types.h"
#include "util/error.h"

namespace sparrow::formats {

struct WeightFormat {
  TensorType type;
  const TensorTypeInfo& geometry;  // gguf's entry: name, elements and bytes per block
  ActivationFormat activation;     // what the CPU multiplies these weights with
  // Reference conversions of n elements (n a multiple of geometry.block_elements). dequantize_row is
  // bit-exact with ggml's to_float.
  void (*dequantize_row)(const void* src, float* dst, int64_t n);
  void (*quantize_row)(const float* src, void* dst, int64_t n);
};

// Reference (scalar) activation quantization of n elements of one token, n a multiple of the format's group
// (activation_blocks.h describes the formats): q[i], scale[g] and sum32[j] as the CPU kernels compute them.
// Only for the 8-bit formats.
void quantize_activations(ActivationFormat format, const float* x, int64_t n, int8_t* q, float* scale,
                          float* sum32);
// Reference rounding of n activations to what the CPU multiplies weights with: x itself (F32), x rounded to f16
// or bf16, or scale * q of the 8-bit formats.
void round_activations(ActivationFormat format, const float* x, int64_t n, float* out);

namespace detail {
// The reference conversions the table points to (weight_formats.cpp).
void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
template <TensorType T>
void dequantize_units(const void* src, float* dst, int64_t n);  // the block types, through WeightBlock<T>
void quantize_f32(const float* src, void* dst, int64_t n);
void quantize_f16(const float* src, void* dst, int64_t n);
void quantize_bf16(const float* src, void* dst, int64_t n);
void quantize_q8_0(const float* src, void* dst, int64_t n);
void quantize_q4_0(const float* src, void* dst, int64_t n);
void quantize_q4_1(const float* src, void* dst, int64_t n);
void quantize_q5_0(const float* src, void* dst, int64_t n);
void quantize_q5_1(const float* src, void* dst, int64_t n);
void quantize_q4_k(const float* src, void* dst, int64_t n);
void quantize_q5_k(const float* src, void* dst, int64_t n);
void quantize_q6_k(const float* src, void* dst, int64_t n);

constexpr WeightFormat entry(TensorType type, ActivationFormat activation,
                             void (*dequantize)(const void*, float*, int64_t),
                             void (*quantize)(const float*, void*, int64_t)) {
  return WeightFormat{type, *tensor_type_info(type), activation, dequantize, quantize};
}
}  // namespace detail

// The trait table: every supported type, constexpr so that kernels can read an entry at compile time.
inline constexpr WeightFormat kWeightFormats[] = {
    detail::entry(TensorType::F32, ActivationFormat::F32, detail::dequantize_f32, detail::quantize_f32),
    detail::entry(TensorType::F16, ActivationFormat::F16, detail::dequantize_f16, detail::quantize_f16),
    detail::entry(TensorType::BF16, ActivationFormat::BF16, detail::dequantize_bf16, detail::quantize_bf16),
    detail::entry(TensorType::Q8_0, ActivationFormat::Q8_0, detail::dequantize_units<TensorType::Q8_0>,
                  detail::quantize_q8_0),
    detail::entry(TensorType::Q4_0, ActivationFormat::Q8_0, detail::dequantize_units<TensorType::Q4_0>,
                  detail::quantize_q4_0),
    detail::entry(TensorType::Q4_1, ActivationFormat::Q8_1, detail::dequantize_units<TensorType::Q4_1>,
                  detail::quantize_q4_1),
    detail::entry(TensorType::Q5_0, ActivationFormat::Q8_0, detail::dequantize_units<TensorType::Q5_0>,
                  detail::quantize_q5_0),
    detail::entry(TensorType::Q5_1, ActivationFormat::Q8_1, detail::dequantize_units<TensorType::Q5_1>,
                  detail::quantize_q5_1),
    detail::entry(TensorType::Q4_K, ActivationFormat::Q8_K, detail::dequantize_units<TensorType::Q4_K>,
                  detail::quantize_q4_k),
    detail::entry(TensorType::Q5_K, ActivationFormat::Q8_K, detail::dequantize_units<TensorType::Q5_K>,
                  detail::quantize_q5_k),
    detail::entry(TensorType::Q6_K, ActivationFormat::Q8_K, detail::dequantize_units<TensorType::Q6_K>,
                  detail::quantize_q6_k),
};

// The entry of a supported type, or nullptr.
constexpr const WeightFormat* find_weight_format(TensorType type) {
  for (const WeightFormat& format : kWeightFormats)
    if (format.type == type) return &format;
  return nullptr;
}
// The entry of a supported type; throws an Error naming `what` and the type for any other.
const WeightFormat& weight_format(TensorType type, const char* what);

constexpr bool is_supported_weight_type(TensorType type) { return find_weight_format(type) != nullptr; }

// Reference dequantization / quantization of n elements through the table; throws for an unsupported type or
// an n that is not a whole number of blocks.
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);
void quantize_row(TensorType type, const float* src, void* dst, int64_t n);

// Calls f(std::integral_constant<TensorType, T>{}) for the runtime type (so that f can instantiate
// WeightBlock<T> kernels), walking the table: the one path from a runtime type to the compile-time decoders.
// Throws an Error naming `what` for an unsupported type.
template <size_t kIndex = 0, class F>
auto visit_weight_type(TensorType type, const char* what, F&& f)
    -> decltype(f(std::integral_constant<TensorType, TensorType::F32>{})) {
  if constexpr (kIndex == std::size(kWeightFormats)) {
    throw Error(std::string(what) + ": weight type " + tensor_type_name(type) + " is not supported");
  } else {
    constexpr TensorType kType = kWeightFormats[kIndex].type;
    if (type == kType) return f(std::integral_constant<TensorType, kType>{});
    return visit_weight_type<kIndex + 1>(type, what, std::forward<F>(f));
  }
}

}  // namespace sparrow::formats
