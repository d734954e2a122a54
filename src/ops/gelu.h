#pragma once
// GELU (tanh approximation) as llama.cpp's CPU backend computes it, for every backend: a table over f16 inputs,
// each entry gelu_tanh of the input rounded to f16, indexed by the f16 rounding of x, with x <= -10 giving 0 and
// x >= 10 giving x. A lookup is cheaper than tanh, and matching the table keeps Sparrow's logits within
// llama.cpp's to 1e-5 where the exact function would differ by ~3e-4. Backends build their tables from
// gelu_table_entry, so they agree bit for bit.
#include <cmath>
#include <cstdint>

#include "formats/weight_blocks.h"

namespace sparrow {

// Inputs at or beyond this magnitude saturate (0 below, identity above); the rest are looked up.
constexpr float kGeluSaturation = 10.0f;

// The table's entry for the f16 input `code`: gelu_tanh in float, rounded to f16.
inline uint16_t gelu_table_entry(uint16_t code) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  const float x = formats::f16_to_f32(code);
  return formats::f32_to_f16(0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))));
}

// gelu as every backend computes it: saturated at or beyond kGeluSaturation, else the table's entry for the f16
// rounding of x. entry_of(code) gives the entry as a float (a precomputed table, or gelu_table_entry).
template <typename EntryOf>
float gelu_with_table(float x, const EntryOf& entry_of) {
  if (x <= -kGeluSaturation) return 0.0f;
  if (x >= kGeluSaturation) return x;
  return entry_of(formats::f32_to_f16(x));
}

// The same without a table: each entry computed when asked (for checks, not for kernels).
inline float gelu_looked_up(float x) {
  return gelu_with_table(x, [](uint16_t code) { return formats::f16_to_f32(gelu_table_entry(code)); });
}

}  // namespace sparrow
