// Activation rounding and quantization (activations.h). The 8-bit formats run one warp per group: the lanes
// hold group / 32 consecutive elements each, the group's max |x| and each 32 elements' sum of values come from
// warp shuffles (max and integer sums are exact in any order), and the per-group arithmetic is
// formats/activation_blocks.h's, which the CPU kernels and the reference use too.
#include "cuda/activations.h"

#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

using formats::ActivationFormat;

constexpr int kWarp = 32;
constexpr int kThreads = 256;

template <ActivationFormat F>
__global__ void __launch_bounds__(kThreads)
    round_to_half_kernel(const float* __restrict__ x, int64_t n, float* __restrict__ rounded,
                         uint16_t* __restrict__ half) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint16_t bits = F == ActivationFormat::F16 ? formats::f32_to_f16(x[i]) : formats::f32_to_bf16(x[i]);
    if (rounded != nullptr) rounded[i] = F == ActivationFormat::F16 ? formats::f16_to_f32(bits) : formats::bf16_to_f32(bits);
    if (half != nullptr) half[i] = bits;
  }
}

// One warp per group of kGroup elements; lane l holds elements [l * kPerLane, (l + 1) * kPerLane) of it.
template <ActivationFormat F>
__global__ void __launch_bounds__(kThreads)
    quantize_groups_kernel(const float* __restrict__ x, int64_t n_groups, ActivationOutputs out) {
  constexpr int kGroup = formats::activation_group(F), kPerLane = kGroup / kWarp;
  constexpr int kLanesPer32 = 32 / kPerLane;  // lanes that share one 32-element sum
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t g = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (g >= n_groups) return;  // whole warps leave together: kThreads is a multiple of the warp
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
  if (lane % kLanesPer32 == 0 && out.sum32 != nullptr) {
    out.sum32[first / 32] = formats::activation_sum32(F, s, sum);
  }
  if (lane == 0 && out.scale != nullptr) out.scale[g] = s.scale;
}

unsigned grid_for(int64_t threads) {
  return unsigned(std::clamp<int64_t>((threads + kThreads - 1) / kThreads, 1, int64_t(1) << 20));
}

template <ActivationFormat F>
void launch_groups(cudaStream_t stream, const float* x, int64_t n, const ActivationOutputs& out) {
  const int64_t n_groups = n / formats::activation_group(F);
  if (n_groups * kWarp > (int64_t(1) << 20) * kThreads) throw Error("quantize_activations: too many activations");
  quantize_groups_kernel<F><<<grid_for(n_groups * kWarp), kThreads, 0, stream>>>(x, n_groups, out);
  SPARROW_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize_activations(cudaStream_t stream, ActivationFormat format, const float* x, int64_t n_tokens,
                          int64_t n_in, const ActivationOutputs& out) {
  const int group = formats::activation_group(format);
  if (n_tokens < 0 || n_in <= 0 || (group != 0 && n_in % group != 0)) {
    throw Error("quantize_activations: " + std::to_string(n_tokens) + " x " + std::to_string(n_in) +
                " activations do not split into groups of " + std::to_string(group));
  }
  const int64_t n = n_tokens * n_in;
  if (n == 0) return;
  switch (format) {
    case ActivationFormat::F32:
      if (out.rounded != nullptr && out.rounded != x) {
        SPARROW_CUDA_CHECK(cudaMemcpyAsync(out.rounded, x, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      }
      return;
    case ActivationFormat::F16:
      round_to_half_kernel<ActivationFormat::F16><<<grid_for(n), kThreads, 0, stream>>>(x, n, out.rounded, out.half);
      SPARROW_CUDA_CHECK_LAUNCH();
      return;
    case ActivationFormat::BF16:
      round_to_half_kernel<ActivationFormat::BF16><<<grid_for(n), kThreads, 0, stream>>>(x, n, out.rounded, out.half);
      SPARROW_CUDA_CHECK_LAUNCH();
      return;
    case ActivationFormat::Q8_0: return launch_groups<ActivationFormat::Q8_0>(stream, x, n, out);
    case ActivationFormat::Q8_1: return launch_groups<ActivationFormat::Q8_1>(stream, x, n, out);
    case ActivationFormat::Q8_K: return launch_groups<ActivationFormat::Q8_K>(stream, x, n, out);
  }
  throw Error("quantize_activations: unknown activation format");
}

}  // namespace sparrow::cuda
