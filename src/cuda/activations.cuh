#pragma once
// The 8-bit activation quantization of one group, as device code: what quantize_activations runs per group
// (activations.cu) and what the decode GEMV runs in its prologue when it quantizes its own input
// (matmul_int8.cu). The arithmetic is formats/activation_blocks.h's, shared with the CPU and the reference.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/activations.h"
#include "formats/activation_blocks.h"

namespace sparrow::cuda {

// Group g of x (the activation_group(F) floats at x + g * group) quantized by one warp, lane l holding the
// group's elements [l * group / 32, (l + 1) * group / 32): the group's max |x| and each 32 elements' sum of
// codes come from warp shuffles (max and integer sums are exact in any order). Writes the group's entries of
// out.q, out.rounded, out.scale and out.sum32 (any may be null), indexed as quantize_activations lays them out.
// All 32 lanes call it with the same g.
template <formats::ActivationFormat F>
__device__ __forceinline__ void quantize_group(const float* __restrict__ x, int64_t g, int lane,
                                               const ActivationOutputs& out) {
  constexpr int kWarp = 32;
  constexpr int kGroup = formats::activation_group(F), kPerLane = kGroup / kWarp;
  constexpr int kLanesPer32 = 32 / kPerLane;  // lanes that share one 32-element sum
  const float* xg = x + g * kGroup + lane * kPerLane;
  float v[kPerLane];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    v[k] = xg[k];
    amax = fmaxf(amax, fabsf(v[k]));
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  const formats::ActivationGroupScale s = formats::activation_group_scale(F, amax);
  int sum = 0;
  const int64_t first = g * kGroup + lane * kPerLane;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int level = formats::quantize_activation(s, v[k]);
    sum += level;
    if (out.q != nullptr) out.q[first + k] = int8_t(level);
    if (out.rounded != nullptr) out.rounded[first + k] = s.scale * float(level);
  }
  for (int offset = kLanesPer32 / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  if (lane % kLanesPer32 == 0 && out.sum32 != nullptr) out.sum32[first / 32] = formats::activation_sum32(F, s, sum);
  if (lane == 0 && out.scale != nullptr) out.scale[g] = s.scale;
}

}  // namespace sparrow::cuda
