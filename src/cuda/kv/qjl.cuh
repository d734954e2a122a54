#pragma once
// Device ops of the qjl key codec (formats/kv/qjl.{h,cpp}): [fp16 ||k||][m / 8 bytes of sign(S k)], m = 2d,
// and the sketch helpers tbq3p/tbq4p share (turboquant_ip.cuh).
//
// Keys only, as the reference: its decode and accumulate exist so that score(q', b) == <q, decode(b)>, and the
// batched ops run them like any codec's; whether a cache may store V with it is the caller's check (keys_only).
//
// Parallel shape: the projections S x (encode, prepare_query) take one thread per row and the transposed
// products S^T v (decode, finish) one thread per column, each summing in double in the reference's index
// order, so a sign bit flips only where the reference's own sum rounds to zero, and decode is the reference's
// to the bit. Expand writes the m signed, scaled ones, lane by lane.
#include <cmath>

#include "cuda/kv/device_codec.cuh"
#include "cuda/kv/primitives.cuh"
#include "formats/kv/qjl.h"

namespace sparrow::cuda {
namespace kv {

// qjl::projection(m, d) on the device; m = d or 2d.
__device__ inline const float* qjl_projection(int m, int d) {
  return kv_tables().qjl_projection[m / d - 1][head_dim_slot(d)];
}

// sqrt(pi/2) / m (formats::qjl::estimator_scale): double operations rounded once, as on the host.
__device__ inline float qjl_estimator_scale(int m) { return float(sqrt(M_PI / 2) / m); }

// bits[0, m / 8) = the signs of S x (bit set where the float projection is negative), S the m x d
// projection, x (d floats, shared). flags: m bytes of shared scratch. Ends with a barrier.
__device__ inline void sketch_signs(const float* x, int m, int d, uint8_t* flags, uint8_t* bits) {
  const float* s = qjl_projection(m, d);
  for (int i = int(threadIdx.x); i < m; i += int(blockDim.x))
    flags[i] = float(ordered_dot(s + size_t(i) * d, x, d)) < 0.0f;
  __syncthreads();
  for (int b = int(threadIdx.x); b < m / 8; b += int(blockDim.x)) {
    uint8_t byte = 0;
    for (int k = 0; k < 8; ++k) byte |= uint8_t(flags[8 * b + k] << k);
    bits[b] = byte;
  }
  __syncthreads();
}

// out[i] = float(S x)[i] for i < m; x: d floats, shared. Ends with a barrier.
__device__ inline void project(const float* x, int m, int d, float* out) {
  const float* s = qjl_projection(m, d);
  for (int i = int(threadIdx.x); i < m; i += int(blockDim.x)) out[i] = float(ordered_dot(s + size_t(i) * d, x, d));
  __syncthreads();
}

// out[j] = float(S^T v)[j] for j < d, plus add[j] when add is given (one float add after the rounding, as the
// references add the parts); v: m floats. Ends with a barrier.
__device__ inline void project_transposed(const float* v, int m, int d, const float* add, float* out) {
  const float* s = qjl_projection(m, d);
  for (int j = int(threadIdx.x); j < d; j += int(blockDim.x)) {
    const float r = float(ordered_column_dot(s, d, j, v, m));
    out[j] = add ? __fadd_rn(add[j], r) : r;
  }
  __syncthreads();
}

struct QjlCodec {
  static constexpr int kRowsPerDim = formats::qjl::kCodecRowsPerDim;

  static __host__ __device__ int smem_floats(int d) { return kRowsPerDim * d; }

  static __device__ void encode(float* x, int d, uint8_t* block, float* smem) {
    if (threadIdx.x == 0) store_norm(float(sqrt(ordered_sum_of_squares(x, d))), block);
    sketch_signs(x, kRowsPerDim * d, d, reinterpret_cast<uint8_t*>(smem), block + 2);
  }
  static __device__ void decode(const uint8_t* block, int d, float* x, float* smem) {
    const int m = kRowsPerDim * d;
    const float scaled_norm = scaled_sketch_norm(block, m);
    for (int i = int(threadIdx.x); i < m; i += int(blockDim.x))
      smem[i] = __fmul_rn(scaled_norm, formats::qjl::sign_at(block + 2, i));
    __syncthreads();
    project_transposed(smem, m, d, nullptr, x);
  }
  static __device__ void prepare_query(float* q, int d, float* prepared, float* smem) {
    block_copy(q, d, smem);
    project(smem, kRowsPerDim * d, d, prepared);
  }
  static __device__ void finish(float* acc, int d, float* out, float*) {
    project_transposed(acc, kRowsPerDim * d, d, nullptr, out);
  }
  static __device__ void expand(const uint8_t* block, int d, float* row) {
    const int m = kRowsPerDim * d;
    const float scaled_norm = scaled_sketch_norm(block, m);
    for (int i = lane_id(); i < m; i += kWarpSize) row[i] = __fmul_rn(scaled_norm, formats::qjl::sign_at(block + 2, i));
    __syncwarp();
  }

  // sqrt(pi/2)/m * ||k||: the key estimate in the sketch basis is this times the signs.
  static __device__ float scaled_sketch_norm(const uint8_t* block, int m) {
    return qjl_estimator_scale(m) * load_f16(block);
  }
};

}  // namespace kv

template <>
struct DeviceCodec<formats::KvCodec::QJL> : kv::QjlCodec {};

}  // namespace sparrow::cuda
