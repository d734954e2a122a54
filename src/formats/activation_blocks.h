#pragma once
// The forms activations take before they are multiplied with weights: ggml's vec_dot_type for each weight type
// (weight_formats.h's table names it per type), so that Sparrow's products match llama.cpp's. The per-group
// arithmetic is written here once, host/device, for the CPU kernels (cpu/matmul-inl.h), the CUDA kernels
// (cuda/activations.cu) and the reference (weight_formats.cpp).
#include <cmath>
#include <cstdint>

#include "formats/host_device.h"
#include "formats/weight_blocks.h"

namespace sparrow::formats {

enum class ActivationFormat : uint8_t {
  F32,   // as they are (f32 weights)
  F16,   // rounded to f16 (f16 weights)
  BF16,  // rounded to bf16 (bf16 weights)
  Q8_0,  // per 32 elements: an f16 scale max|x| / 127 and 8-bit values
  Q8_1,  // Q8_0 plus, per 32, f16(scale * sum of the values) (weights with a block minimum: Q4_1, Q5_1)
  Q8_K,  // per 256 elements: a float scale 1 / (127 / max|x|) and 8-bit values (the K-quants)
};

// Elements per activation scale of a quantized activation format, 0 for the float ones.
constexpr int activation_group(ActivationFormat a) {
  switch (a) {
    case ActivationFormat::Q8_0: case ActivationFormat::Q8_1: return 32;
    case ActivationFormat::Q8_K: return 256;
    default: return 0;
  }
}

// One group's quantization, from the group's max |x|, as ggml's quantize_row_q8_0 / q8_1 / q8_K compute it:
// q = round_to_nearest_even(x * inverse), and the value the weights are multiplied with is scale * q.
// Q8_0 / Q8_1 store scale = f16(max / 127); Q8_K stores scale = 1 / inverse in float.
struct ActivationGroupScale {
  float inverse;    // 127 / max, or 0 for an all-zero group
  float unrounded;  // max / 127 (Q8_0, Q8_1) or 1 / inverse (Q8_K): what Q8_1's sums are scaled by
  float scale;      // the stored scale
};

SPARROW_HOST_DEVICE inline ActivationGroupScale activation_group_scale(ActivationFormat format, float amax) {
  const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
  if (format == ActivationFormat::Q8_K) {
    const float d = amax != 0.0f ? 1.0f / inverse : 0.0f;
    return {inverse, d, d};
  }
  const float d = amax / 127.0f;
  return {inverse, d, f16_to_f32(f32_to_f16(d))};
}

// The 8-bit value of x in a group with this scale.
SPARROW_HOST_DEVICE inline int quantize_activation(const ActivationGroupScale& s, float x) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(__fmul_rn(x, s.inverse));
#else
  return int(std::nearbyint(x * s.inverse));  // the default rounding mode: to nearest even
#endif
}

// The per-32-element offset term the kernels multiply block offsets and minimums with, from sum_q (the sum of
// the 32 values): scale * sum_q for Q8_0 (exact up to one rounding), f16(unrounded * sum_q) as Q8_1 stores it,
// unrounded * sum_q for Q8_K.
SPARROW_HOST_DEVICE inline float activation_sum32(ActivationFormat format, const ActivationGroupScale& s,
                                                  int sum_q) {
  switch (format) {
    case ActivationFormat::Q8_1: return f16_to_f32(f32_to_f16(s.unrounded * float(sum_q)));
    case ActivationFormat::Q8_K: return s.unrounded * float(sum_q);
    default: return s.scale * float(sum_q);
  }
}

}  // namespace sparrow::formats
