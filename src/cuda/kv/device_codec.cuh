#pragma once
// The device side of the KV codecs (formats/kv/kv_codec.h defines each codec once: layout, constants,
// reference ops). Every codec C has a specialization DeviceCodec<C> in src/cuda/kv/ (one header per codec
// family) with the static members below; each computes what the reference op of the same name computes, on
// the same bytes, and `sparrow verify --backend cuda` checks them cell by cell against the references.
//
//   // Scratch in shared memory (floats) that encode / decode / prepare_query / finish need for head dim d.
//   static __host__ __device__ int smem_floats(int d);
//
//   // Block-cooperative: every thread of the CTA calls it (blockDim.x a multiple of 32, at most 512).
//   // x: d floats in shared memory (may be overwritten); smem: smem_floats(d) floats of shared scratch.
//   static __device__ void encode(float* x, int d, uint8_t* block, float* smem);
//   static __device__ void decode(const uint8_t* block, int d, float* x, float* smem);     // x: d floats
//   static __device__ void prepare_query(float* q, int d, float* prepared, float* smem);  // query_floats(d)
//   static __device__ void finish(float* acc, int d, float* out, float* smem);            // acc: accumulator_floats(d)
//
//   // Warp-cooperative: the 32 lanes of one warp call it together. Writes the codec's basis row of the block
//   // (query_floats(d) floats, shared or global memory): score(q', block) = <q', row> and
//   // accumulate(w, block, acc) adds w * row. The fused attention kernels read the cache only through this.
//   static __device__ void expand(const uint8_t* block, int d, float* row);
//
// Where things live, and when they are visible (refinements of the above, as src/cuda/kv/ implements them):
//  - encode's x must be in shared memory and is overwritten (rotated in place). Every other input (block, q,
//    acc) may be in shared or global memory and is only read; every output (block, x, prepared, out, row) may
//    be in shared or global memory.
//  - Block-cooperative ops read their inputs at once: the caller synchronizes (__syncthreads) after writing
//    them. Each op ends with a barrier, so its output is visible to the whole CTA when it returns.
//  - expand uses warp shuffles: all 32 lanes call it with the same arguments; it ends with __syncwarp.
//  - f32 blocks are read as floats and f16/bf16 blocks as 16-bit words: such blocks must be 4- and 2-byte
//    aligned (every block of a cache from cudaMalloc is). Other codecs' blocks may sit at any byte.
//
// Constants (codebooks, rotation signs, QJL projections) come from the same tables the references use
// (formats/kv/*.inc and the seeded generators), uploaded to each device once, never retyped. Device code finds
// them through a per-translation-unit __constant__ table (device_tables.cuh) that with_device_codec binds
// before it calls back, so kernels that use DeviceCodec<C> must be launched from inside with_device_codec (or
// after kv::bind_device_kv_tables(), e.g. before a CUDA graph capture).
#include <cstdint>

#include "formats/kv/kv_codec.h"

namespace sparrow::cuda {

template <formats::KvCodec C>
struct DeviceCodec;  // specialized per codec in src/cuda/kv/

// Calls f(std::integral_constant<formats::KvCodec, C>{}) for the runtime codec; the one switch over codecs on
// the device side (src/cuda/kv/codecs.cuh lists every codec).
template <class F>
void with_device_codec(formats::KvCodec codec, F&& f);

}  // namespace sparrow::cuda
