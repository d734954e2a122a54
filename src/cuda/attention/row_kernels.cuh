#pragma once
// The per-row kernels around the fused attention: storing K/V rows into the cache, preparing queries, and merging
// the split-K partial results. Each is one CTA per row: the codecs' encode, prepare_query and finish are
// block-cooperative (src/cuda/kv/device_codec.cuh) and work on shared memory.
#include <cstdint>

#include "cuda/dependent_launch.cuh"
#include "cuda/device_position.h"
#include "cuda/kv/device_codec.cuh"

namespace sparrow::cuda::rows {

constexpr int kThreads = 128;

// Rows of K or V for store_kernel: src [n_rows][n_kv_heads][head_dim] encoded into cache; center (null: none)
// is subtracted first.
struct StoreRows {
  const float* src;
  const float* center;
  uint8_t* cache;
};

// Row r of src (rows first_row..) encoded into block (head, slot of its position) of cache. One CTA per (row, KV
// head), and per tensor: blockIdx.y 0 takes k, 1 takes v (launched where both have codec C).
template <formats::KvCodec C>
__global__ void __launch_bounds__(kThreads)
    store_kernel(StoreRows k, StoreRows v, int64_t first_row, DevicePosition first_position, int32_t n_kv_heads,
                 int32_t head_dim, int64_t capacity, int64_t block_bytes) {
  extern __shared__ float4 smem_quads[];
  float* x = reinterpret_cast<float*>(smem_quads);
  float* scratch = x + head_dim;
  const StoreRows& rows = blockIdx.y == 0 ? k : v;
  const float* src = rows.src;
  const float* center = rows.center;
  uint8_t* cache = rows.cache;
  const int64_t row = first_row + blockIdx.x / n_kv_heads;
  const int32_t head = int32_t(blockIdx.x % n_kv_heads);
  const float* in = src + (row * n_kv_heads + head) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += kThreads)
    x[i] = center ? in[i] - center[int64_t(head) * head_dim + i] : in[i];
  __syncthreads();
  const int64_t slot = (first_position.get() + row) % capacity;
  DeviceCodec<C>::encode(x, head_dim, cache + (int64_t(head) * capacity + slot) * block_bytes, scratch);
}

// prepared[row] = scale * prepare_query(q[row]) for each of the n_tokens * n_heads query rows; one CTA per row.
template <formats::KvCodec K>
__global__ void __launch_bounds__(kThreads)
    prepare_query_kernel(const float* q, int32_t head_dim, int32_t prepared_floats, float scale, float* prepared) {
  extern __shared__ float4 smem_quads[];
  float* query = reinterpret_cast<float*>(smem_quads);
  float* out = query + head_dim;
  float* scratch = out + prepared_floats;
  const int64_t row = blockIdx.x;
  for (int i = threadIdx.x; i < head_dim; i += kThreads) query[i] = q[row * head_dim + i];
  __syncthreads();
  DeviceCodec<K>::prepare_query(query, head_dim, out, scratch);
  __syncthreads();
  for (int i = threadIdx.x; i < prepared_floats; i += kThreads) prepared[row * prepared_floats + i] = scale * out[i];
}

// The weights that combine the n_splits partial results of one row (their state (max m_s, sum l_s) at
// partial_state[s * n_rows + row]): e^(m_s - m) / sum_s e^(m_s - m) l_s, with m the largest m_s; an empty split
// (max -inf, sum 0) gets 0. Called by the 32 lanes of one warp; writes split_weight[0, n_splits).
__device__ inline void split_weights(const float2* partial_state, int32_t n_splits, int64_t n_rows, int64_t row,
                                     float* split_weight) {
  const int lane = threadIdx.x % 32;
  float max = -INFINITY;
  for (int s = lane; s < n_splits; s += 32) max = fmaxf(max, __ldcg(&partial_state[s * n_rows + row]).x);
  for (int offset = 16; offset > 0; offset /= 2) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
  float sum = 0;
  for (int s = lane; s < n_splits; s += 32) {
    const float2 state = __ldcg(&partial_state[s * n_rows + row]);
    split_weight[s] = state.y > 0 ? expf(state.x - max) : 0.0f;
    sum += state.y * split_weight[s];
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __syncwarp();
  const float inv_sum = sum > 0 ? 1.0f / sum : 0.0f;
  for (int s = lane; s < n_splits; s += 32) split_weight[s] *= inv_sum;
}

// out[row] = finish(sum_s split_weight[s] * acc_s), acc_s the row's partial accumulator of split s (at
// partial_acc[(s * n_rows + row) * v_floats]): the row leaves the V basis. Block-cooperative; split_weight, acc
// (v_floats), result (head_dim) and scratch (DeviceCodec<V>::smem_floats) are shared memory, and split_weight
// is visible to the whole CTA when it is called. Partials are read through L2 (__ldcg): other CTAs of the same
// kernel may have written them.
template <formats::KvCodec V>
__device__ void merge_row(const float* partial_acc, const float* split_weight, int32_t n_splits, int64_t n_rows,
                          int64_t row, int32_t head_dim, int32_t v_floats, float* acc, float* result, float* scratch,
                          float* out) {
  for (int i = threadIdx.x; i < v_floats; i += blockDim.x) {
    float total = 0;
    for (int s = 0; s < n_splits; ++s) {
      if (split_weight[s] != 0) total += split_weight[s] * __ldcg(&partial_acc[(s * n_rows + row) * v_floats + i]);
    }
    acc[i] = total;
  }
  __syncthreads();
  DeviceCodec<V>::finish(acc, head_dim, result, scratch);
  __syncthreads();
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) out[row * head_dim + i] = result[i];
}

// out[row] for each of the n_tokens * n_heads rows, one CTA per row, from the splits that the fused attention left
// in scratch (when its CTAs did not merge them themselves, flash_kernel.cuh). Shared memory: acc [v_floats],
// result [head_dim], the codec's scratch, then one weight per split.
template <formats::KvCodec V>
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const float* partial_acc, const float2* partial_state, int32_t n_splits, int64_t n_rows,
                 int32_t head_dim, int32_t v_floats, float* out) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  extern __shared__ float4 smem_quads[];
  float* acc = reinterpret_cast<float*>(smem_quads);
  float* result = acc + v_floats;
  float* scratch = result + head_dim;
  float* split_weight = scratch + DeviceCodec<V>::smem_floats(head_dim);
  const int64_t row = blockIdx.x;
  if (threadIdx.x < 32) split_weights(partial_state, n_splits, n_rows, row, split_weight);
  __syncthreads();
  merge_row<V>(partial_acc, split_weight, n_splits, n_rows, row, head_dim, v_floats, acc, result, scratch, out);
}

}  // namespace sparrow::cuda::rows
