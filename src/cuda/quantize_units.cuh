#pragma once
// The 8-bit activation formats' quantization on the device, a thread per 32 consecutive elements ("unit"): the
// standalone kernel of activations.cu and the decode GEMV's prologue (matmul_int8.cu) both run this, so that
// the codes a GEMV quantizes for itself are the bits cuda::quantize_activations writes. The per-group
// arithmetic is formats/activation_blocks.h's, which the CPU kernels and the reference use too.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/activations.h"
#include "formats/activation_blocks.h"

namespace sparrow::cuda {

// Quantizes units [0, n_units) of x (n_units * 32 floats; groups never straddle a row, so rows of whole groups
// may be laid end to end): thread `thread` of n_threads (a multiple of 32, the threads of whole warps, all of
// which call this) takes units thread, thread + n_threads, ...; the group's lanes (1 for 32-element groups, 8
// for Q8_K's 256) combine their maxima by shuffles. Writes out's non-null fields (activations.h; q 16-byte
// aligned): the codes q[32 u ..], each group's scale[g], each unit's sum32[u] (formats::activation_sum32) and
// the values scale * code into rounded.
template <formats::ActivationFormat F>
__device__ __forceinline__ void quantize_units(const float* __restrict__ x, int64_t n_units,
                                               const ActivationOutputs& out, int64_t thread, int64_t n_threads) {
  constexpr int kLanesPerGroup = formats::activation_group(F) / 32;
  static_assert(kLanesPerGroup >= 1 && 32 % kLanesPerGroup == 0, "a group's units share one warp");
  for (int64_t base = 0; base < n_units; base += n_threads) {  // the same trip count in every lane
    const int64_t unit = base + thread;
    const bool active = unit < n_units;  // a whole group's lanes are active or not together
    float v[32];
    float amax = 0.0f;
    if (active) {
      const float4* from = reinterpret_cast<const float4*>(x + unit * 32);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 f = from[i];
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
      }
#pragma unroll
      for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int offset = 1; offset < kLanesPerGroup; offset *= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    }
    if (!active) continue;
    const formats::ActivationGroupScale s = formats::activation_group_scale(F, amax);
    uint32_t words[8];
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int level = formats::quantize_activation(s, v[4 * i + j]);
        sum += level;
        if (out.rounded != nullptr) out.rounded[unit * 32 + 4 * i + j] = s.scale * float(level);
        word |= uint32_t(uint8_t(int8_t(level))) << (8 * j);
      }
      words[i] = word;
    }
    if (out.q != nullptr) {
      uint4* to = reinterpret_cast<uint4*>(out.q + unit * 32);
      to[0] = make_uint4(words[0], words[1], words[2], words[3]);
      to[1] = make_uint4(words[4], words[5], words[6], words[7]);
    }
    if (out.sum32 != nullptr) out.sum32[unit] = formats::activation_sum32(F, s, sum);
    if (out.scale != nullptr && unit % kLanesPerGroup == 0) out.scale[unit / kLanesPerGroup] = s.scale;
  }
}

}  // namespace sparrow::cuda
