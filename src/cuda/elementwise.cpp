// Host side of the element-wise kernels: the GELU table they read.
#include <cmath>

#include "cuda/elementwise.h"
#include "formats/weight_formats.h"

namespace sparrow::cuda {
namespace {

// The CPU backend's gelu_tanh before its f16 rounding; the same float expression, so the same bits.
float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}

uint16_t gelu_of_code(uint16_t code) {
  return formats::f32_to_f16(gelu_tanh(formats::f16_to_f32(code)));
}

}  // namespace

std::vector<uint16_t> gelu_f16_table() {
  std::vector<uint16_t> table(kGeluTableEntries);
  for (uint32_t magnitude = 0; magnitude <= kGeluLastCode; ++magnitude) {
    table[magnitude] = gelu_of_code(uint16_t(magnitude));
    table[kGeluLastCode + 1 + magnitude] = gelu_of_code(uint16_t(0x8000 | magnitude));
  }
  return table;
}

}  // namespace sparrow::cuda
