// Activation rounding and quantization (activations.h). The 8-bit formats run a thread per 8 consecutive
// elements (quantize_units.cuh, shared with the decode GEMV's prologue); a group's max |x| is combined by warp
// shuffles (exact in any order), and the per-group arithmetic is formats/activation_blocks.h's, which the CPU
// kernels and the reference use too.
#include "cuda/activations.h"

#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/dependent_launch.cuh"
#include "cuda/quantize_units.cuh"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

using formats::ActivationFormat;

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

// A thread per 8 elements (quantize_units.cuh).
template <ActivationFormat F>
__global__ void __launch_bounds__(kThreads)
    quantize_units_kernel(const float* __restrict__ x, int64_t n_units, ActivationOutputs out) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  quantize_units<F>(x, n_units, out, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

unsigned grid_for(int64_t threads) {
  return unsigned(std::clamp<int64_t>((threads + kThreads - 1) / kThreads, 1, int64_t(1) << 20));
}

template <ActivationFormat F>
void launch_groups(cudaStream_t stream, const float* x, int64_t n, const ActivationOutputs& out) {
  const int64_t n_units = n / 32;
  quantize_units_kernel<F><<<grid_for(quantize_threads(n_units)), kThreads, 0, stream>>>(x, n_units, out);
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
  if (group != 0 && reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    throw Error("quantize_activations: activations are not 16-byte aligned");
  }
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
