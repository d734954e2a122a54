#pragma once
// The 8-bit activation formats' quantization on the device, four threads per 32 consecutive elements (a "unit"): the
// standalone kernel of activations.cu and the decode GEMV's prologue (matmul_int8.cu) both run this, so that
// the codes a GEMV quantizes for itself are the bits cuda::quantize_activations writes. The per-group
// arithmetic is formats/activation_blocks.h's, which the CPU kernels and the reference use too.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/activations.h"
#include "formats/activation_blocks.h"

namespace sparrow::cuda {

// Elements per thread: a unit's 32 go to four threads, so that a short row (a decode GEMV's 1536 elements)
// keeps all of a CTA's threads busy and each one's serial chain of loads and roundings is a quarter as long.
constexpr int kQuantizeSliceElements = 8;
constexpr int kQuantizeSlicesPerUnit = 32 / kQuantizeSliceElements;

// Threads quantize_units wants for n_units units: one per slice.
__host__ __device__ constexpr int64_t quantize_threads(int64_t n_units) { return n_units * kQuantizeSlicesPerUnit; }

// Quantizes units [0, n_units) of x (n_units * 32 floats; groups never straddle a row, so rows of whole groups
// may be laid end to end): thread `thread` of n_threads (a multiple of 32, the threads of whole warps, all of
// which call this) takes slices of 8 elements thread, thread + n_threads, ...; the lanes of a group (4 for
// 32-element groups, 32 for Q8_K's 256) combine their maxima, and those of a unit their codes' sums, by
// shuffles (exact in any order). Writes out's non-null fields (activations.h; q 16-byte aligned): the codes
// q[32 u ..], each group's scale[g], each unit's sum32[u] (formats::activation_sum32) and the values
// scale * code into rounded.
template <formats::ActivationFormat F>
__device__ __forceinline__ void quantize_units(const float* __restrict__ x, int64_t n_units,
                                               const ActivationOutputs& out, int64_t thread, int64_t n_threads) {
  constexpr int kSlice = kQuantizeSliceElements;
  constexpr int kLanesPerGroup = formats::activation_group(F) / kSlice;
  static_assert(kLanesPerGroup >= kQuantizeSlicesPerUnit && 32 % kLanesPerGroup == 0, "a group's slices share a warp");
  const int64_t n_slices = quantize_threads(n_units);
  for (int64_t base = 0; base < n_slices; base += n_threads) {  // the same trip count in every lane
    const int64_t slice = base + thread;
    const bool active = slice < n_slices;  // a whole group's lanes are active or not together
    float v[kSlice] = {};
    if (active) {
      const float4* from = reinterpret_cast<const float4*>(x + slice * kSlice);
      const float4 a = from[0], b = from[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kSlice; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int offset = 1; offset < kLanesPerGroup; offset *= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    }
    const formats::ActivationGroupScale s = formats::activation_group_scale(F, amax);
    uint32_t words[kSlice / 4];
    int sum = 0;
#pragma unroll
    for (int i = 0; i < kSlice / 4; ++i) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int level = formats::quantize_activation(s, v[4 * i + j]);
        sum += level;
        if (active && out.rounded != nullptr) out.rounded[slice * kSlice + 4 * i + j] = s.scale * float(level);
        word |= uint32_t(uint8_t(int8_t(level))) << (8 * j);
      }
      words[i] = word;
    }
#pragma unroll
    for (int offset = 1; offset < kQuantizeSlicesPerUnit; offset *= 2) {
      sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    }
    if (!active) continue;
    if (out.q != nullptr) *reinterpret_cast<uint2*>(out.q + slice * kSlice) = make_uint2(words[0], words[1]);
    const int64_t unit = slice / kQuantizeSlicesPerUnit;
    if (out.sum32 != nullptr && slice % kQuantizeSlicesPerUnit == 0) {
      out.sum32[unit] = formats::activation_sum32(F, s, sum);
    }
    if (out.scale != nullptr && slice % kLanesPerGroup == 0) out.scale[slice / kLanesPerGroup] = s.scale;
  }
}

}  // namespace sparrow::cuda
