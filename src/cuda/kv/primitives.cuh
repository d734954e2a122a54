#pragma once
// Building blocks of the device codecs: fp16 fields at any byte offset, warp reductions, and the randomized
// Hadamard rotation of formats/kv/rotation.h as a shared-memory butterfly over one CTA.
//
// Rounding: encode and decode must give the references' bytes and values (sparrow verify compares them
// exactly), so these helpers repeat the references' float operations one for one: the same butterflies, the
// same products, and explicit __fmul_rn / __fadd_rn wherever nvcc would otherwise fuse a product into an add
// the host code rounds twice.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kv/device_tables.cuh"

namespace sparrow::cuda::kv {

constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kWarpSize = 32;

// ---------------------------------------------------------------------------------------------------------
// Stored fields. Blocks are byte arrays (a TurboQuant sub-block is 66 bytes), so fields are read bytewise.
// The hardware conversions round to nearest even like formats/weight_formats.h; only NaN payloads can differ,
// which no comparison looks at (any NaN matches any NaN).

__device__ inline float load_f16(const uint8_t* p) {
  return __half2float(__ushort_as_half(uint16_t(p[0] | p[1] << 8)));
}

// The bits pass through a volatile local: nvcc 13.0 for sm_90 folded uint8_t(__half_as_ushort(__float2half_rn(v)))
// into a float-to-u8 conversion of v itself (seen on an H200: 7.54 stored its low byte as 0x07, not 0x8a; an
// empty asm barrier did not stop it). A 16-bit store of the same bits was right, so the fold is in the byte
// extraction, which now reads from memory.
__device__ inline void store_f16(float value, uint8_t* p) {
  volatile uint16_t bits = __half_as_ushort(__float2half_rn(value));
  p[0] = uint8_t(bits & 0xFFu);
  p[1] = uint8_t(bits >> 8);
}

// The TurboQuant family's norm field (formats::turboquant::store_norm): saturates at the largest finite half;
// fminf, like std::fmin, turns NaN into 65504.
__device__ inline void store_norm(float norm, uint8_t* p) { store_f16(fminf(norm, 65504.0f), p); }

// Calls f(std::integral_constant<int, D>{}) for the head dim d (64, 128, 256 or 512): expand runs once per key
// and value the attention reads, and with D a constant its divisions and loops are shifts and unrolled code.
template <class F>
__device__ inline void with_head_dim(int d, F&& f) {
  switch (d) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: return f(std::integral_constant<int, 512>{});
  }
}

// ---------------------------------------------------------------------------------------------------------
// Reductions.

__device__ inline float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

__device__ inline int lane_id() { return int(threadIdx.x) % kWarpSize; }
__device__ inline int warp_id() { return int(threadIdx.x) / kWarpSize; }
__device__ inline int warps_per_block() { return int(blockDim.x) / kWarpSize; }

// sum over i < n of double(a[i]) * b[i], in index order like the references' double loops (a product of two
// floats is exact in double, so fma and multiply-then-add agree): one thread's sequential sum.
__device__ inline double ordered_dot(const float* a, const float* b, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += double(a[i]) * double(b[i]);
  return sum;
}

// sum over i < m of double(s[i * d + j]) * v[i]: column j of a row-major m x d matrix against v, in index
// order (formats::qjl::project_transposed).
__device__ inline double ordered_column_dot(const float* s, int d, int j, const float* v, int m) {
  double sum = 0;
  for (int i = 0; i < m; ++i) sum += double(s[size_t(i) * d + j]) * double(v[i]);
  return sum;
}

// ||y||^2 in double, in index order (the references' norms).
__device__ inline double ordered_sum_of_squares(const float* y, int n) { return ordered_dot(y, y, n); }

// ---------------------------------------------------------------------------------------------------------
// Rotations over one CTA, on d floats in shared memory. Every thread of the block calls them; they start by
// reading v (the caller has synchronized after writing it) and end with a barrier, so the result is visible to
// every thread.

// v <- H v, the unnormalized Walsh-Hadamard transform in Sylvester order: the reference's butterflies, stage by
// stage, so every element sees the same additions in the same order.
__device__ inline void walsh_hadamard(float* v, int d) {
  for (int h = 1; h < d; h *= 2) {
    for (int p = int(threadIdx.x); p < d / 2; p += int(blockDim.x)) {
      const int i = (p / h) * 2 * h + p % h;
      const float a = v[i], b = v[i + h];
      v[i] = a + b;
      v[i + h] = a - b;
    }
    __syncthreads();
  }
}

// 1 / sqrt(d) as the references compute it (double, then rounded once).
__device__ inline float hadamard_scale(int d) { return float(1.0 / sqrt(double(d))); }

// out = after . H . (before . in) / sqrt(d) (formats/kv/rotation.cpp signed_hadamard); null signs are +1.
// v: d floats of shared scratch (may be `in` or `out`); in and out may be shared or global and may alias.
__device__ inline void signed_hadamard(const float* in, int d, const float* before, const float* after, float* v,
                                       float* out) {
  for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) v[i] = before ? in[i] * before[i] : in[i];
  __syncthreads();
  walsh_hadamard(v, d);
  const float scale = hadamard_scale(d);
  for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) out[i] = v[i] * (after ? after[i] * scale : scale);
  __syncthreads();
}

// y = R x and x = R^T y (formats/kv/rotation.h); v: d floats of shared scratch.
__device__ inline void hadamard_rotate(const float* x, int d, float* v, float* y) {
  const int slot = head_dim_slot(d);
  signed_hadamard(x, d, kv_tables().hadamard_in[slot], kv_tables().hadamard_out[slot], v, y);
}
__device__ inline void hadamard_unrotate(const float* y, int d, float* v, float* x) {
  const int slot = head_dim_slot(d);
  signed_hadamard(y, d, kv_tables().hadamard_out[slot], kv_tables().hadamard_in[slot], v, x);
}
// y = W x, the plain orthonormal Walsh-Hadamard transform (q8_0, q4_0).
__device__ inline void walsh_hadamard_orthonormal(const float* x, int d, float* v, float* y) {
  signed_hadamard(x, d, nullptr, nullptr, v, y);
}

// dst[i] = src[i] for i < n over the CTA, then a barrier.
__device__ inline void block_copy(const float* src, int n, float* dst) {
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) dst[i] = src[i];
  __syncthreads();
}

}  // namespace sparrow::cuda::kv
