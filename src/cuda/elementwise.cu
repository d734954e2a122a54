// The element-wise and row kernels of the CUDA backend (see elementwise.h for what each computes).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/dependent_launch.cuh"
#include "cuda/elementwise.h"
#include "cuda/gelu.cuh"
#include "cuda/row_math.cuh"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

constexpr int kElementwiseThreads = 256;
constexpr int kBlocksPerMultiprocessor = 8;  // enough resident blocks to hide memory latency

// Blocks for a grid-stride loop over `work` items: one item per thread where that takes few blocks, otherwise
// as many blocks as the device keeps resident.
unsigned grid_for(const LaunchTarget& target, int64_t work, int threads) {
  const int64_t wanted = (work + threads - 1) / threads;
  const int64_t resident = int64_t(target.multiprocessors) * kBlocksPerMultiprocessor;
  return unsigned(std::clamp<int64_t>(wanted, 1, resident));
}

// ---- element-wise maps --------------------------------------------------------------------------------------

// y[i] = f(a[i]); y may equal a.
template <class F>
struct UnaryMap {
  float* y;
  const float* a;
  F f;
  __device__ void apply1(int64_t i) const { y[i] = f(a[i]); }
  __device__ void apply4(int64_t i) const {
    const float4 v = load4(a, i);
    store4(y, i, make_float4(f(v.x), f(v.y), f(v.z), f(v.w)));
  }
  bool vectorizable() const { return aligned16(y) && aligned16(a); }
};

// y[i] = f(a[i], b[i]); y may equal a or b.
template <class F>
struct BinaryMap {
  float* y;
  const float* a;
  const float* b;
  F f;
  __device__ void apply1(int64_t i) const { y[i] = f(a[i], b[i]); }
  __device__ void apply4(int64_t i) const {
    const float4 u = load4(a, i), v = load4(b, i);
    store4(y, i, make_float4(f(u.x, v.x), f(u.y, v.y), f(u.z, v.z), f(u.w, v.w)));
  }
  bool vectorizable() const { return aligned16(y) && aligned16(a) && aligned16(b); }
};

// Float4 items [0, n_vec4), then scalar items [first_scalar, n): the tail of a vectorized map, or all of it.
template <class Map>
__global__ void map_kernel(Map map, int64_t n_vec4, int64_t first_scalar, int64_t n) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = start; i < n_vec4; i += stride) map.apply4(i);
  for (int64_t i = first_scalar + start; i < n; i += stride) map.apply1(i);
}

template <class Map>
void launch_map(const LaunchTarget& target, const Map& map, int64_t n) {
  if (n <= 0) return;
  const int64_t n_vec4 = map.vectorizable() ? n / 4 : 0;
  const int64_t first_scalar = 4 * n_vec4;
  const int64_t work = std::max(n_vec4, n - first_scalar);
  map_kernel<<<grid_for(target, work, kElementwiseThreads), kElementwiseThreads, 0, target.stream>>>(
      map, n_vec4, first_scalar, n);
  SPARROW_CUDA_CHECK_LAUNCH();
}

struct Plus {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Times {
  float s;
  __device__ float operator()(float a) const { return a * s; }
};
struct Softcap {
  float cap;
  __device__ float operator()(float a) const { return cap * tanhf(a / cap); }
};

struct Gelu {
  const uint16_t* table;
  __device__ float operator()(float gate) const { return gelu_lookup(table, gate); }
};
struct GeluTimes {
  const uint16_t* table;
  __device__ float operator()(float gate, float up) const { return gelu_lookup(table, gate) * up; }
};

// ---- block reductions ---------------------------------------------------------------------------------------

// The sum of v over the block (blockDim.x a multiple of 32), as a tree: pairwise within each warp, then over
// the warps' sums; every thread gets it.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x >> 5) ? warp_sums[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// ---- row kernels --------------------------------------------------------------------------------------------

// One block per row. Each thread reads its elements twice (sum of squares, then the scaled write), so y may
// equal x: every element is written by the thread that read it, after the block's reduction.
template <bool kVec4>
__global__ void rms_norm_kernel(const float* x, const float* weight, int64_t dim, float eps, float* y) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  float squares = 0.0f;
  if constexpr (kVec4) {
    for (int64_t i = threadIdx.x; i < dim / 4; i += blockDim.x) {
      const float4 v = load4(xr, i);
      squares += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) squares += xr[i] * xr[i];
  }
  const float inv = 1.0f / sqrtf(block_sum(squares) / float(dim) + eps);
  if constexpr (kVec4) {
    for (int64_t i = threadIdx.x; i < dim / 4; i += blockDim.x) {
      float4 v = load4(xr, i);
      v = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
      if (weight) {
        const float4 w = load4(weight, i);
        v = make_float4(v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w);
      }
      store4(yr, i, v);
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = weight ? xr[i] * inv * weight[i] : xr[i] * inv;
  }
}

// The residual step (elementwise.h), one block per row: r's sum of squares, then r normalized in place and
// added to x while x's new sum of squares is taken, then x normalized into next. Each thread writes only the
// elements it read, so the passes need no synchronization beyond the block sums.
__global__ void add_rms_norm_kernel(float* x, float* r, const float* r_weight, int64_t dim, float eps,
                                    const float* next_weight, float* next, float x_scale) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  float* xr = x + int64_t(blockIdx.x) * dim;
  float* rr = r + int64_t(blockIdx.x) * dim;
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) squares += rr[i] * rr[i];
  const float inv = 1.0f / sqrtf(block_sum(squares) / float(dim) + eps);
  float x_squares = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = r_weight ? rr[i] * inv * r_weight[i] : rr[i] * inv;
    rr[i] = v;
    const float h = __fmul_rn(add_rounded(xr[i], v), x_scale);  // as scale() rounds it (exact for 1)
    xr[i] = h;
    x_squares += h * h;
  }
  if (next == nullptr) return;  // the same for every thread of the block
  float* nr = next + int64_t(blockIdx.x) * dim;
  const float x_inv = 1.0f / sqrtf(block_sum(x_squares) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) nr[i] = next_weight ? xr[i] * x_inv * next_weight[i] : xr[i] * x_inv;
}

// The row kernels below hold a row in registers, as float4s, when it fits: every input is then loaded once, up
// front, so a row costs one memory round trip instead of one per pass. A decode step runs these on one row at a
// time, where the latency of each pass, not bandwidth, is the cost.
// 1 / rms of a row from each thread's share of its sum of squares (block_sum: every thread of the block calls it).
__device__ float inverse_rms(float squares, int64_t dim, float eps) {
  return inverse_rms_of(block_sum(squares), dim, eps);
}

// rms_norm with the row in registers (row_fits_registers): y may equal x.
__global__ void rms_norm_resident_kernel(const float* x, const float* weight, int64_t dim, float eps, float* y) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  const int64_t quads = dim / 4;
  float4 v[kResidentQuads];
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kResidentQuads; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < quads) {
      v[k] = load4(xr, i);
      squares += squares4(v[k]);
    }
  }
  const float inv = inverse_rms(squares, dim, eps);
#pragma unroll
  for (int k = 0; k < kResidentQuads; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < quads) store4(yr, i, normalized4(v[k], inv, weight, i));
  }
}

// add_rms_norm with the rows in registers (row_fits_registers).
__global__ void add_rms_norm_resident_kernel(float* x, float* r, const float* r_weight, int64_t dim, float eps,
                                             const float* next_weight, float* next, float x_scale) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  float* xr = x + int64_t(blockIdx.x) * dim;
  float* rr = r + int64_t(blockIdx.x) * dim;
  const int64_t quads = dim / 4;
  float4 rv[kResidentQuads], xv[kResidentQuads];
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kResidentQuads; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < quads) {
      rv[k] = load4(rr, i);
      xv[k] = load4(xr, i);
      squares += squares4(rv[k]);
    }
  }
  const float inv = inverse_rms(squares, dim, eps);
  float x_squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kResidentQuads; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < quads) {
      const float4 v = normalized4(rv[k], inv, r_weight, i);
      store4(rr, i, v);
      xv[k] = scale_rounded4(add_rounded4(xv[k], v), x_scale);
      store4(xr, i, xv[k]);
      x_squares += squares4(xv[k]);
    }
  }
  if (next == nullptr) return;  // the same for every thread of the block
  float* nr = next + int64_t(blockIdx.x) * dim;
  const float x_inv = inverse_rms(x_squares, dim, eps);
#pragma unroll
  for (int k = 0; k < kResidentQuads; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < quads) store4(nr, i, normalized4(xv[k], x_inv, next_weight, i));
  }
}

// RoPE's angles for one position into shared memory (cos_t[half], sin_t[half]), by the whole block.
// theta_i = position * theta_scale^i is built by repeated float multiplication, as the CPU backend and ggml do,
// by one thread: a product chain rounds differently from powf, and the difference grows with the position.
__device__ void rope_angles(int64_t position, int32_t half, float theta_scale, float freq_scale,
                            const float* freq_divisors, float* cos_t, float* sin_t) {
  if (threadIdx.x == 0) {
    float theta = float(position);
    for (int32_t i = 0; i < half; ++i) {
      cos_t[i] = theta;
      theta *= theta_scale;
    }
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float divisor = freq_divisors ? freq_divisors[i] : 1.0f;
    const float angle = freq_scale * (cos_t[i] / divisor);
    sincosf(angle, &sin_t[i], &cos_t[i]);
  }
  __syncthreads();
}

// The NEOX rotation of the pair (a, b) by the angle of (c, s), with explicitly rounded products so that no FMA
// contraction changes the CPU's rounding.
__device__ float2 rotate_pair(float a, float b, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

// One block per token: the token's angles once in shared memory, then every head's pairs rotated with them.
__global__ void rope_kernel(float* x, int32_t n_heads, int32_t head_dim, int32_t half, DevicePosition first_position,
                            float theta_scale, float freq_scale, const float* freq_divisors) {
  extern __shared__ float angles[];  // cos[half], then sin[half]
  float* cos_t = angles;
  float* sin_t = angles + half;
  const int64_t t = blockIdx.x;
  rope_angles(first_position.get() + t, half, theta_scale, freq_scale, freq_divisors, cos_t, sin_t);
  float* token = x + t * n_heads * int64_t(head_dim);
  for (int32_t e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
    const int32_t h = e / half, i = e % half;
    float* v = token + int64_t(h) * head_dim;
    const float2 rotated = rotate_pair(v[i], v[i + half], cos_t[i], sin_t[i]);
    v[i] = rotated.x;
    v[i + half] = rotated.y;
  }
}

// The tensors of one rms_norm_rope launch: tensor i holds heads [first_head[i], first_head[i + 1]) of the
// launch's heads per token.
struct HeadTensors {
  float* x[kMaxHeadTensors];
  const float* weight[kMaxHeadTensors];
  bool rotate[kMaxHeadTensors];
  int32_t first_head[kMaxHeadTensors + 1];
  int count;
};

// rms_norm per head, then RoPE (elementwise.h): one block per token, its angles in shared memory as in
// rope_kernel, one warp per head of every tensor: the head's sum of squares from a warp reduction, then its pairs
// normalized and rotated (elements past n_rot, and every element of a tensor that does not rotate, only
// normalized). Every element is read and written by one lane.
__global__ void rms_norm_rope_kernel(HeadTensors tensors, float eps, int32_t head_dim, int32_t half,
                                     DevicePosition first_position, float theta_scale, float freq_scale,
                                     const float* freq_divisors) {
  extern __shared__ float angles[];  // cos[half], then sin[half]
  float* cos_t = angles;
  float* sin_t = angles + half;
  const int64_t t = blockIdx.x;
  rope_angles(first_position.get() + t, half, theta_scale, freq_scale, freq_divisors, cos_t, sin_t);
  const int lane = threadIdx.x & 31, n_warps = int(blockDim.x >> 5);
  for (int32_t h = int32_t(threadIdx.x >> 5); h < tensors.first_head[tensors.count]; h += n_warps) {
    // The tensor of head h, chosen without indexing the parameters at run time.
    float* x = tensors.x[0];
    const float* weight = tensors.weight[0];
    bool rotate = tensors.rotate[0];
    int32_t first = tensors.first_head[0], end = tensors.first_head[1];
#pragma unroll
    for (int k = 1; k < kMaxHeadTensors; ++k) {
      if (k >= tensors.count || h < tensors.first_head[k]) continue;
      x = tensors.x[k], weight = tensors.weight[k], rotate = tensors.rotate[k];
      first = tensors.first_head[k], end = tensors.first_head[k + 1];
    }
    float* v = x + (t * (end - first) + (h - first)) * int64_t(head_dim);
    auto normalized = [&](int32_t e, float inv) { return weight ? v[e] * inv * weight[e] : v[e] * inv; };
    float squares = 0.0f;
    for (int32_t e = lane; e < head_dim; e += 32) squares += v[e] * v[e];
    const float inv = 1.0f / sqrtf(warp_sum(squares) / float(head_dim) + eps);
    const int32_t rotated = rotate ? half : 0;
    for (int32_t e = lane; e < rotated; e += 32) {
      const float2 r = rotate_pair(normalized(e, inv), normalized(e + half, inv), cos_t[e], sin_t[e]);
      v[e] = r.x;
      v[e + half] = r.y;
    }
    for (int32_t e = 2 * rotated + lane; e < head_dim; e += 32) v[e] = normalized(e, inv);
  }
}

// blockIdx.y strides over rows, the x dimension over the row (float4 items when kVec4).
template <bool kVec4>
__global__ void mul_rows_kernel(float* y, const float* x, int64_t n_rows, int64_t row_len, int64_t x_row_stride) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  const int64_t items = kVec4 ? row_len / 4 : row_len;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    float* yr = y + r * row_len;
    const float* xr = x + r * x_row_stride;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < items; i += stride) {
      if constexpr (kVec4) {
        const float4 a = load4(yr, i), b = load4(xr, i);
        store4(yr, i, make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w));
      } else {
        yr[i] *= xr[i];
      }
    }
  }
}

// A block of kMeanColumns x kMeanRowGroups threads covers kMeanColumns adjacent columns (coalesced reads); its
// row groups sum interleaved rows in double, then one thread per column adds the groups in order.
constexpr int kMeanColumns = 32;
constexpr int kMeanRowGroups = 8;
__global__ void mean_rows_kernel(const float* x, int64_t n_rows, int64_t row_len, float* out) {
  __shared__ double partial[kMeanRowGroups][kMeanColumns];
  const int64_t column = int64_t(blockIdx.x) * kMeanColumns + threadIdx.x;
  double sum = 0.0;
  if (column < row_len)
    for (int64_t r = threadIdx.y; r < n_rows; r += kMeanRowGroups) sum += x[r * row_len + column];
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < row_len) {
    double total = 0.0;
    for (int g = 0; g < kMeanRowGroups; ++g) total += partial[g][threadIdx.x];
    out[column] = float(total / double(n_rows));
  }
}

struct InlineInts {
  int32_t values[kInlineInts];
};

__global__ void write_inline_ints_kernel(InlineInts ints, int n, int32_t* __restrict__ dst) {
  if (int(threadIdx.x) < n) dst[threadIdx.x] = ints.values[threadIdx.x];
}

}  // namespace

void write_inline_ints(const LaunchTarget& target, const int32_t* values, int n, int32_t* dst) {
  if (n < 0 || n > kInlineInts)
    throw Error("write_inline_ints: " + std::to_string(n) + " values (at most " + std::to_string(kInlineInts) + ")");
  if (n == 0) return;
  InlineInts ints{};
  for (int i = 0; i < n; ++i) ints.values[i] = values[i];
  write_inline_ints_kernel<<<1, kInlineInts, 0, target.stream>>>(ints, n, dst);
  SPARROW_CUDA_CHECK_LAUNCH();
}

void rms_norm(const LaunchTarget& target, const float* x, const float* weight, int64_t n_rows, int64_t dim,
              float eps, float* y) {
  if (n_rows <= 0) return;
  if (dim <= 0) throw Error("rms_norm: row length " + std::to_string(dim) + " is not positive");
  if (row_fits_registers(dim, {x, y, weight})) {
    rms_norm_resident_kernel<<<unsigned(n_rows), row_threads(dim / 4), 0, target.stream>>>(x, weight, dim, eps, y);
    SPARROW_CUDA_CHECK_LAUNCH();
    return;
  }
  const bool vec4 = dim % 4 == 0 && aligned16(x) && aligned16(y) && (!weight || aligned16(weight));
  const int threads = row_threads(vec4 ? dim / 4 : dim);
  if (vec4) rms_norm_kernel<true><<<unsigned(n_rows), threads, 0, target.stream>>>(x, weight, dim, eps, y);
  else rms_norm_kernel<false><<<unsigned(n_rows), threads, 0, target.stream>>>(x, weight, dim, eps, y);
  SPARROW_CUDA_CHECK_LAUNCH();
}

void add_rms_norm(const LaunchTarget& target, float* x, float* r, const float* r_weight, int64_t n_rows, int64_t dim,
                  float eps, const float* next_weight, float* next, float x_scale) {
  if (n_rows <= 0) return;
  if (dim <= 0) throw Error("add_rms_norm: row length " + std::to_string(dim) + " is not positive");
  if (row_fits_registers(dim, {x, r, r_weight, next_weight, next})) {
    add_rms_norm_resident_kernel<<<unsigned(n_rows), row_threads(dim / 4), 0, target.stream>>>(
        x, r, r_weight, dim, eps, next_weight, next, x_scale);
  } else {
    add_rms_norm_kernel<<<unsigned(n_rows), row_threads(dim / 4), 0, target.stream>>>(x, r, r_weight, dim, eps,
                                                                                       next_weight, next, x_scale);
  }
  SPARROW_CUDA_CHECK_LAUNCH();
}

namespace {

// RoPE's launch parameters, checked.
struct RopeLaunch {
  int32_t half;
  float theta_scale;
  size_t shared_bytes;  // the angles' cos and sin
};

RopeLaunch rope_launch(const char* op, int32_t head_dim, const RopeParams& params) {
  if (params.n_rot <= 0 || params.n_rot % 2 != 0 || params.n_rot > head_dim)
    throw Error(std::string(op) + ": n_rot " + std::to_string(params.n_rot) +
                " must be even, positive and at most the head dim " + std::to_string(head_dim));
  const int32_t half = params.n_rot / 2;
  // The same float expression as the CPU backend, evaluated on the host, so theta_scale has the same bits.
  return {half, std::pow(params.freq_base, -2.0f / float(params.n_rot)), 2 * size_t(half) * sizeof(float)};
}

}  // namespace

void rope(const LaunchTarget& target, float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
          DevicePosition first_position, const RopeParams& params) {
  const RopeLaunch launch = rope_launch("rope", head_dim, params);
  if (n_tokens <= 0 || n_heads <= 0) return;
  const int threads = row_threads(int64_t(n_heads) * launch.half);
  rope_kernel<<<unsigned(n_tokens), threads, launch.shared_bytes, target.stream>>>(
      x, n_heads, head_dim, launch.half, first_position, launch.theta_scale, params.freq_scale,
      params.freq_divisors);
  SPARROW_CUDA_CHECK_LAUNCH();
}

void rms_norm_rope(const LaunchTarget& target, std::span<const HeadTensor> tensors, float eps, int64_t n_tokens,
                   int32_t head_dim, DevicePosition first_position, const RopeParams& params) {
  const RopeLaunch launch = rope_launch("rms_norm_rope", head_dim, params);
  if (n_tokens <= 0) return;
  for (size_t first = 0; first < tensors.size(); first += kMaxHeadTensors) {
    HeadTensors launched{};
    for (const HeadTensor& t : tensors.subspan(first, std::min<size_t>(kMaxHeadTensors, tensors.size() - first))) {
      if (t.n_heads <= 0) continue;
      const int i = launched.count++;
      launched.x[i] = t.x;
      launched.weight[i] = t.weight;
      launched.rotate[i] = t.rotate;
      launched.first_head[i + 1] = launched.first_head[i] + t.n_heads;
    }
    if (launched.count == 0) continue;
    const int threads = 32 * std::min(launched.first_head[launched.count], kMaxRowThreads / 32);  // a warp per head
    rms_norm_rope_kernel<<<unsigned(n_tokens), threads, launch.shared_bytes, target.stream>>>(
        launched, eps, head_dim, launch.half, first_position, launch.theta_scale, params.freq_scale,
        params.freq_divisors);
    SPARROW_CUDA_CHECK_LAUNCH();
  }
}

void gelu_mul(const LaunchTarget& target, const uint16_t* gelu_table, const float* gate, const float* up, int64_t n,
              float* y) {
  if (up) launch_map(target, BinaryMap<GeluTimes>{y, gate, up, GeluTimes{gelu_table}}, n);
  else launch_map(target, UnaryMap<Gelu>{y, gate, Gelu{gelu_table}}, n);
}

void add(const LaunchTarget& target, float* y, const float* x, int64_t n) {
  launch_map(target, BinaryMap<Plus>{y, y, x, Plus{}}, n);
}

void scale(const LaunchTarget& target, float* y, float s, int64_t n) {
  launch_map(target, UnaryMap<Times>{y, y, Times{s}}, n);
}

void softcap(const LaunchTarget& target, float* y, float cap, int64_t n) {
  if (!(cap > 0.0f)) throw Error("softcap: cap " + std::to_string(cap) + " is not positive");
  launch_map(target, UnaryMap<Softcap>{y, y, Softcap{cap}}, n);
}

void mul_rows(const LaunchTarget& target, float* y, const float* x, int64_t n_rows, int64_t row_len,
              int64_t x_row_stride) {
  if (n_rows <= 0 || row_len <= 0) return;
  if (x_row_stride < row_len && n_rows > 1)
    throw Error("mul_rows: row stride " + std::to_string(x_row_stride) + " is shorter than the row length " +
                std::to_string(row_len));
  const bool vec4 = row_len % 4 == 0 && x_row_stride % 4 == 0 && aligned16(y) && aligned16(x);
  const int64_t items = vec4 ? row_len / 4 : row_len;
  const int threads = row_threads(items);
  const dim3 grid(unsigned((items + threads - 1) / threads), unsigned(std::min<int64_t>(n_rows, 65535)));
  if (vec4) mul_rows_kernel<true><<<grid, threads, 0, target.stream>>>(y, x, n_rows, row_len, x_row_stride);
  else mul_rows_kernel<false><<<grid, threads, 0, target.stream>>>(y, x, n_rows, row_len, x_row_stride);
  SPARROW_CUDA_CHECK_LAUNCH();
}

void mean_rows(const LaunchTarget& target, const float* x, int64_t n_rows, int64_t row_len, float* out) {
  if (n_rows <= 0) throw Error("mean_rows: the mean of " + std::to_string(n_rows) + " rows is undefined");
  if (row_len <= 0) return;
  const dim3 block(kMeanColumns, kMeanRowGroups);
  const unsigned blocks = unsigned((row_len + kMeanColumns - 1) / kMeanColumns);
  mean_rows_kernel<<<blocks, block, 0, target.stream>>>(x, n_rows, row_len, out);
  SPARROW_CUDA_CHECK_LAUNCH();
}

}  // namespace sparrow::cuda
