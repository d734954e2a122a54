#pragma once
// DeviceCodec for f32 and f16 (src/cuda/kv/device_codec.cuh): the codecs that keep the head vector as it is, so
// the basis row is the decoded vector itself, a prepared query is the query and finish is a copy.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kv/device_codec.cuh"

namespace sparrow::cuda {

// The ops that do not change basis, shared by every identity-basis codec: a block-strided copy.
struct IdentityBasis {
  static __host__ __device__ int smem_floats(int) { return 0; }
  static __device__ void prepare_query(float* q, int d, float* prepared, float*) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) prepared[i] = q[i];
  }
  static __device__ void finish(float* acc, int d, float* out, float*) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = acc[i];
  }
};

template <>
struct DeviceCodec<formats::KvCodec::F32> : IdentityBasis {
  static __device__ void encode(float* x, int d, uint8_t* block, float*) {
    float* dst = reinterpret_cast<float*>(block);
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = x[i];
  }
  static __device__ void decode(const uint8_t* block, int d, float* x, float*) {
    const float* src = reinterpret_cast<const float*>(block);
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = src[i];
  }
  static __device__ void expand(const uint8_t* block, int d, float* row) {
    const float* src = reinterpret_cast<const float*>(block);
    for (int i = threadIdx.x % 32; i < d; i += 32) row[i] = src[i];
  }
};

// IEEE half, rounded to nearest even as formats::f32_to_f16 rounds, so the bytes match the reference encoder's.
template <>
struct DeviceCodec<formats::KvCodec::F16> : IdentityBasis {
  static __device__ void encode(float* x, int d, uint8_t* block, float*) {
    __half* dst = reinterpret_cast<__half*>(block);
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = __float2half_rn(x[i]);
  }
  static __device__ void decode(const uint8_t* block, int d, float* x, float*) {
    const __half* src = reinterpret_cast<const __half*>(block);
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = __half2float(src[i]);
  }
  // Pairs of halves per lane: one 4-byte load per lane, a warp reads 128 contiguous bytes at a time.
  static __device__ void expand(const uint8_t* block, int d, float* row) {
    const __half2* src = reinterpret_cast<const __half2*>(block);
    for (int i = threadIdx.x % 32; i < d / 2; i += 32) {
      const float2 pair = __half22float2(src[i]);
      row[2 * i] = pair.x;
      row[2 * i + 1] = pair.y;
    }
  }
};

}  // namespace sparrow::cuda
