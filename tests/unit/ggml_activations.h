#pragma once
// The activations as llama.cpp's ggml multiplies them with each weight type (its vec_dot_type), written here
// from ggml's definitions and independently of src/formats/, as the reference the CPU kernels and
// formats::round_activations are tested against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "formats/weight_formats.h"

namespace sparrow::testing {

// Q8_0 / Q8_1 (legacy weight types, groups of 32): q = round_half_even(x * 127 / max|x|), scale
// f16(max|x| / 127); Q8_K (K-quants, groups of 256): iscale = 127 / max|x|, q = round_half_even(x * iscale),
// scale 1 / iscale; f16 and bf16 weights: x rounded to the weight's type; f32: x itself.
inline std::vector<float> ggml_activations(formats::ActivationFormat format, const std::vector<float>& x) {
  using formats::ActivationFormat;
  std::vector<float> out(x.size());
  if (format == ActivationFormat::F16 || format == ActivationFormat::BF16) {
    for (size_t i = 0; i < x.size(); ++i)
      out[i] = format == ActivationFormat::F16 ? formats::f16_to_f32(formats::f32_to_f16(x[i]))
                                               : formats::bf16_to_f32(formats::f32_to_bf16(x[i]));
    return out;
  }
  if (format == ActivationFormat::F32) return x;
  const size_t group = format == ActivationFormat::Q8_K ? 256 : 32;
  for (size_t g = 0; g < x.size(); g += group) {
    float amax = 0;
    for (size_t i = g; i < g + group; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    const float scale = group == 32 ? formats::f16_to_f32(formats::f32_to_f16(amax / 127.0f))
                                    : (amax != 0.0f ? 1.0f / inverse : 0.0f);
    for (size_t i = g; i < g + group; ++i) out[i] = scale * std::nearbyint(x[i] * inverse);
  }
  return out;
}

}  // namespace sparrow::testing
