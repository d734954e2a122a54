#pragma once
// Device ops of the stock codecs (formats/kv/stock_codecs.cpp): f32, f16, bf16 store the head vector itself;
// q8_0 and q4_0 store llama.cpp's weight blocks (formats/weight_formats.h) of W x, W the orthonormal
// Walsh-Hadamard transform, so their basis row is the dequantized block, a prepared query is W q and finish
// applies W once more.
//
// Parallel shape: element-wise ops spread elements over the CTA (or the warp, for expand); the quantizers give
// each 32-element block to one warp, one element per lane, and find its scale with a warp reduction (a maximum,
// the same in any order). f32 blocks are read as floats and f16/bf16 as 16-bit words, so their blocks must be
// 4- and 2-byte aligned (a cache of such blocks from cudaMalloc always is).
#include <cstddef>

#include "cuda/kv/device_codec.cuh"
#include "cuda/kv/primitives.cuh"
#include "formats/weight_formats.h"

namespace sparrow::cuda {
namespace kv {

// A codec that stores each element on its own (f32, f16, bf16): Element says how.
template <class Element>
struct PlainCodec {
  static __host__ __device__ int smem_floats(int) { return 0; }

  static __device__ void encode(float* x, int d, uint8_t* block, float*) {
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) Element::store(x[i], block, i);
    __syncthreads();
  }
  static __device__ void decode(const uint8_t* block, int d, float* x, float*) {
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) x[i] = Element::load(block, i);
    __syncthreads();
  }
  static __device__ void prepare_query(float* q, int d, float* prepared, float*) { block_copy(q, d, prepared); }
  static __device__ void finish(float* acc, int d, float* out, float*) { block_copy(acc, d, out); }
  static __device__ void expand(const uint8_t* block, int d, float* row) {
    for (int i = lane_id(); i < d; i += kWarpSize) row[i] = Element::load(block, i);
    __syncwarp();
  }
};

struct F32Element {
  static __device__ float load(const uint8_t* block, int i) { return reinterpret_cast<const float*>(block)[i]; }
  static __device__ void store(float v, uint8_t* block, int i) { reinterpret_cast<float*>(block)[i] = v; }
};
struct F16Element {
  static __device__ float load(const uint8_t* block, int i) {
    return __half2float(reinterpret_cast<const __half*>(block)[i]);
  }
  static __device__ void store(float v, uint8_t* block, int i) {
    reinterpret_cast<__half*>(block)[i] = __float2half_rn(v);
  }
};
struct Bf16Element {
  static __device__ float load(const uint8_t* block, int i) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(block)[i]);
  }
  static __device__ void store(float v, uint8_t* block, int i) {
    reinterpret_cast<__nv_bfloat16*>(block)[i] = __float2bfloat16_rn(v);
  }
};

// q8_0 and q4_0 of W x: d / 32 weight blocks. Block describes one weight block type.
template <class Block>
struct HadamardQuantizedCodec {
  static constexpr int kElements = 32;  // QK8_0 == QK4_0
  static __host__ __device__ int smem_floats(int d) { return d; }

  // x (shared) becomes W x in place, then warp w quantizes blocks w, w + warps, ...
  static __device__ void encode(float* x, int d, uint8_t* block, float*) {
    walsh_hadamard_orthonormal(x, d, x, x);
    for (int b = warp_id(); b < d / kElements; b += warps_per_block())
      Block::quantize(x[b * kElements + lane_id()], block + b * sizeof(typename Block::Layout));
    __syncthreads();
  }
  static __device__ void decode(const uint8_t* block, int d, float* x, float* smem) {
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) smem[i] = element(block, i);
    __syncthreads();
    walsh_hadamard_orthonormal(smem, d, smem, x);
  }
  static __device__ void prepare_query(float* q, int d, float* prepared, float* smem) {
    walsh_hadamard_orthonormal(q, d, smem, prepared);
  }
  static __device__ void finish(float* acc, int d, float* out, float* smem) {
    walsh_hadamard_orthonormal(acc, d, smem, out);
  }
  static __device__ void expand(const uint8_t* block, int d, float* row) {
    for (int i = lane_id(); i < d; i += kWarpSize) row[i] = element(block, i);
    __syncwarp();
  }
  // Element i of the dequantized basis row.
  static __device__ float element(const uint8_t* block, int i) {
    return Block::dequantize(block + (i / kElements) * sizeof(typename Block::Layout), i % kElements);
  }
};

// formats/weight_formats.cpp quantize_q8_0: d = amax / 127, q = round(x / d) clamped to +-127.
struct Q8_0Block {
  using Layout = formats::BlockQ8_0;
  static constexpr int kQuantsOffset = offsetof(formats::BlockQ8_0, qs);
  // Lane j holds element j of the block.
  static __device__ void quantize(float v, uint8_t* out) {
    float amax = fabsf(v);
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
      amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, offset));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (lane_id() == 0) store_f16(d, out);
    const int q = min(max(__float2int_rn(v * id), -127), 127);
    out[kQuantsOffset + lane_id()] = uint8_t(int8_t(q));
  }
  static __device__ float dequantize(const uint8_t* in, int j) {
    return float(int8_t(in[kQuantsOffset + j])) * load_f16(in);
  }
};

// formats/weight_formats.cpp quantize_q4_0: the element of largest magnitude (the first on ties) maps to -8,
// d = max / -8, q = round(x / d) + 8 clamped to 0..15; byte j holds elements j (low nibble) and j + 16.
struct Q4_0Block {
  using Layout = formats::BlockQ4_0;
  static constexpr int kQuantsOffset = offsetof(formats::BlockQ4_0, qs);
  static __device__ void quantize(float v, uint8_t* out) {
    float extreme = v;  // signed; |extreme| is the block's largest magnitude, at index `at`
    int at = lane_id();
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(kFullWarp, extreme, offset);
      const int other_at = __shfl_xor_sync(kFullWarp, at, offset);
      if (fabsf(other) > fabsf(extreme) || (fabsf(other) == fabsf(extreme) && other_at < at)) {
        extreme = other;
        at = other_at;
      }
    }
    const float d = extreme / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (lane_id() == 0) store_f16(d, out);
    const int q = min(max(__float2int_rn(v * id) + 8, 0), 15);
    const int high = __shfl_down_sync(kFullWarp, q, 16);
    if (lane_id() < 16) out[kQuantsOffset + lane_id()] = uint8_t(q | high << 4);
  }
  static __device__ float dequantize(const uint8_t* in, int j) {
    const int q = (in[kQuantsOffset + j % 16] >> (4 * (j / 16))) & 15;
    return float(q - 8) * load_f16(in);
  }
};

}  // namespace kv

template <>
struct DeviceCodec<formats::KvCodec::F32> : kv::PlainCodec<kv::F32Element> {};
template <>
struct DeviceCodec<formats::KvCodec::F16> : kv::PlainCodec<kv::F16Element> {};
template <>
struct DeviceCodec<formats::KvCodec::BF16> : kv::PlainCodec<kv::Bf16Element> {};
template <>
struct DeviceCodec<formats::KvCodec::Q8_0> : kv::HadamardQuantizedCodec<kv::Q8_0Block> {};
template <>
struct DeviceCodec<formats::KvCodec::Q4_0> : kv::HadamardQuantizedCodec<kv::Q4_0Block> {};

}  // namespace sparrow::cuda
