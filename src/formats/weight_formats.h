#pragma once
// Weight block types with llama.cpp-identical layouts, and their reference (scalar, obviously correct)
// dequantization and quantization. CPU and CUDA kernels include these layouts; they never redefine them.
#include <cstddef>
#include <cstdint>

#include "gguf/tensor_types.h"

namespace sparrow::formats {

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK_K = 256, K_SCALE_SIZE = 12;

// IEEE half and bfloat16 as stored in files.
using f16_bits = uint16_t;
using bf16_bits = uint16_t;
float f16_to_f32(f16_bits h);
f16_bits f32_to_f16(float f);   // round to nearest even, like ggml's GGML_FP32_TO_FP16
float bf16_to_f32(bf16_bits h);
bf16_bits f32_to_bf16(float f);  // round to nearest even, NaN kept quiet, like ggml

struct BlockQ4_0 { f16_bits d; uint8_t qs[QK4_0 / 2]; };
struct BlockQ4_1 { f16_bits d, m; uint8_t qs[QK4_1 / 2]; };
struct BlockQ5_0 { f16_bits d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct BlockQ5_1 { f16_bits d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct BlockQ8_0 { f16_bits d; int8_t qs[QK8_0]; };
struct BlockQ4_K { f16_bits d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { f16_bits d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; f16_bits d; };
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// Unpacks the 6-bit scale and min of sub-block `sub` (0..7) from the 12 scale bytes of a Q4_K/Q5_K block.
void unpack_scale_min_k4(const uint8_t scales[K_SCALE_SIZE], int sub, uint8_t* scale, uint8_t* min);

// True for the weight types Sparrow computes with: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K.
bool is_supported_weight_type(TensorType type);

// Reference dequantization of n elements (n a multiple of the block size). Bit-exact with ggml's to_float.
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);
// Reference quantization of n elements (any supported type); used by mkmodel and tests.
void quantize_row(TensorType type, const float* src, void* dst, int64_t n);

}  // namespace sparrow::formats
