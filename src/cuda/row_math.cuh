#pragma once
// Row arithmetic shared by the kernels that normalize rows: the row kernels of elementwise.cu and the decode
// GEMV's residual epilogue (matmul_int8.cu), which must round exactly as add_rms_norm's own kernel does.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

namespace sparrow::cuda {

constexpr int kMaxRowThreads = 512;
constexpr int kResidentQuads = 4;  // float4s of a row per thread in the register-resident row kernels

// Threads for a kernel that gives one block to a row of `row_items` (floats or float4s): a whole number of
// warps, at most kMaxRowThreads.
__host__ __device__ inline int row_threads(int64_t row_items) {
  const int64_t threads = (row_items + 31) / 32 * 32;
  return int(threads < 32 ? 32 : threads > kMaxRowThreads ? kMaxRowThreads : threads);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether rows of dim floats at these addresses can be held in registers by row_threads(dim / 4) threads.
inline bool row_fits_registers(int64_t dim, std::initializer_list<const void*> pointers) {
  if (dim % 4 != 0 || dim / 4 > int64_t(kMaxRowThreads) * kResidentQuads) return false;
  for (const void* p : pointers)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

__device__ __forceinline__ float4 load4(const float* p, int64_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ void store4(float* p, int64_t i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float squares4(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float4 scale4(float4 v, float s) {
  return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}
__device__ __forceinline__ float4 times4(float4 v, float4 w) {
  return make_float4(v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w);
}
// v * inv, times weight[4 i .. 4 i + 3] where there is a weight: a normalized float4 of a row.
__device__ __forceinline__ float4 normalized4(float4 v, float inv, const float* weight, int64_t i) {
  return weight ? times4(scale4(v, inv), load4(weight, i)) : scale4(v, inv);
}
// x + y, rounded once: never contracted into an FMA with the product that made y (the CPU adds in a separate
// op, so a fused multiply-add would round differently from it).
__device__ __forceinline__ float add_rounded(float x, float y) { return __fadd_rn(x, y); }
__device__ __forceinline__ float4 add_rounded4(float4 a, float4 b) {
  return make_float4(add_rounded(a.x, b.x), add_rounded(a.y, b.y), add_rounded(a.z, b.z), add_rounded(a.w, b.w));
}
// The layer output scale as scale() applies it: one rounded product (exact for 1), never fused into an add.
__device__ __forceinline__ float4 scale_rounded4(float4 v, float s) {
  return make_float4(__fmul_rn(v.x, s), __fmul_rn(v.y, s), __fmul_rn(v.z, s), __fmul_rn(v.w, s));
}
// 1 / rms of a row of dim floats from its sum of squares.
__device__ __forceinline__ float inverse_rms_of(float sum_of_squares, int64_t dim, float eps) {
  return 1.0f / sqrtf(sum_of_squares / float(dim) + eps);
}

// Backend::add_rms_norm's rows on the device: x and r [n_rows][dim], the weights [dim] or null, next
// [n_rows][dim] or null; every pointer 16-byte aligned and dim as row_fits_registers allows.
struct ResidualRows {
  float* x;
  float* r;
  const float* r_weight;
  const float* next_weight;
  float* next;
  int dim;
  float eps, x_scale;
};

// add_rms_norm on rows [0, n_rows) by the calling CTA, any whole number of warps, every thread calling, with
// the bits of add_rms_norm_resident_kernel (elementwise.cu). That kernel runs a row on T = row_threads(dim / 4)
// threads, thread t holding float4s t, t + T, ... and adding their squares in that order, a warp tree over each
// warp, then a tree over the warps' sums in warp 0. Here warp w plays its warps w, w + n_warps, ... and each
// warp takes the tree over all the warps' sums itself. The rows are read again where that kernel keeps them in
// registers, r through L2 (__ldcg): other CTAs wrote it.
__device__ inline void residual_step_by_cta(const ResidualRows& s, int n_rows) {
  __shared__ float block_sums[2][kMaxRowThreads / 32];  // per played warp: r's squares, then x's
  const int quads = s.dim / 4, played = row_threads(quads), played_warps = played / 32;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, n_warps = int(blockDim.x) >> 5;
  auto total = [&](const float* sums) { return warp_sum(lane < played_warps ? sums[lane] : 0.0f); };
  const float4* __restrict__ r4 = reinterpret_cast<const float4*>(s.r);
  for (int row = 0; row < n_rows; ++row) {
    const int64_t base = int64_t(row) * quads;  // in float4s
    __syncthreads();  // the row before's sums have been read
    for (int pw = warp; pw < played_warps; pw += n_warps) {
      float squares = 0.0f;
      for (int i = pw * 32 + lane; i < quads; i += played) squares += squares4(__ldcg(r4 + base + i));
      squares = warp_sum(squares);
      if (lane == 0) block_sums[0][pw] = squares;
    }
    __syncthreads();
    const float inv = inverse_rms_of(total(block_sums[0]), s.dim, s.eps);
    for (int pw = warp; pw < played_warps; pw += n_warps) {
      float x_squares = 0.0f;
      for (int i = pw * 32 + lane; i < quads; i += played) {
        const float4 v = normalized4(__ldcg(r4 + base + i), inv, s.r_weight, i);
        store4(s.r, base + i, v);
        const float4 h = scale_rounded4(add_rounded4(load4(s.x, base + i), v), s.x_scale);
        store4(s.x, base + i, h);
        x_squares += squares4(h);
      }
      x_squares = warp_sum(x_squares);
      if (lane == 0) block_sums[1][pw] = x_squares;
    }
    if (s.next == nullptr) continue;  // the same for every thread
    __syncthreads();
    const float x_inv = inverse_rms_of(total(block_sums[1]), s.dim, s.eps);
    for (int pw = warp; pw < played_warps; pw += n_warps) {
      for (int i = pw * 32 + lane; i < quads; i += played)  // x as this thread wrote it above
        store4(s.next, base + i, normalized4(load4(s.x, base + i), x_inv, s.next_weight, i));
    }
  }
}

}  // namespace sparrow::cuda
