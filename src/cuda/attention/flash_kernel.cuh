#pragma once
// The fused attention kernel (flash attention over the compressed cache), one template for decode and prefill.
//
// A CTA owns a block of query rows of one KV head and a range of keys. Rows of a KV head are numbered token-major,
// r = t * group + g (query head kv_head * group + g), so a block of rows holds whole GQA groups of consecutive
// tokens: every expanded K and V row in shared memory is read by all the query heads that share it. The CTA walks
// its key range in tiles of keys_per_tile keys:
//   1. warps expand the tile's K and V blocks into basis rows in shared memory (DeviceCodec::expand);
//   2. score: groups of keys_per_tile threads, one thread per key, take a (row, slice of the basis row) each and
//      compute a partial dot product against the prepared queries held in shared memory;
//   3. online softmax: a warp per row sums the slices, masks (causal, sliding window), and updates the row's
//      running max and sum, leaving the tile's weights and the accumulator's rescaling factor;
//   4. accumulate: each thread owns four consecutive accumulator columns of a few rows, in registers, and adds
//      the weighted V rows.
// At the end it writes its unnormalized accumulators and (max, sum) per row. Around it, the queries enter the K
// basis and the merged splits leave the V basis: with one_launch (a row block of few CTAs) in this kernel, each
// CTA preparing its own queries and the CTA of the block that finishes last merging the splits; otherwise in
// prepare_query_kernel and merge_kernel (row_kernels.cuh), one CTA per row. Decode has few rows, so its key
// range is split over many CTAs (flash-decoding); prefill has many row blocks, and each CTA's key range is
// clipped to what its rows' masks allow.
#include <cstdint>

#include "cuda/attention/row_kernels.cuh"
#include "cuda/dependent_launch.cuh"
#include "cuda/device_position.h"
#include "cuda/kv/device_codec.cuh"
#include "cuda/last_cta.cuh"

namespace sparrow::cuda::flash {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 16;               // query rows per CTA
constexpr int kMaxRowsPerThread = 16;      // accumulator float4s a thread keeps in registers
constexpr int kMaxAccumulatorFloats = 4 * kThreads;  // every thread owns at least one float4 column of a row
constexpr int kKeyRowPadding = 4;          // floats between K rows: float4 reads of 8 keys hit distinct banks

// Everything the kernel needs, computed once on the host (attention.cu).
struct Params {
  const float* q;         // [n_tokens * n_heads][head_dim], read when one_launch
  float scale;            // multiplies q.k
  const float* prepared;  // [n_tokens * n_heads][k_floats], scale folded in (when not one_launch)
  const uint8_t* k_cache;
  const uint8_t* v_cache;
  float* partial_acc;     // [n_splits][n_tokens * n_heads][v_floats], unnormalized
  float2* partial_state;  // [n_splits][n_tokens * n_heads]: (running max, sum of exp) of each partial
  float* out;             // [n_tokens * n_heads][head_dim], written here when one_launch
  // With one_launch and several splits: per (KV head, row block), how many of its CTAs have written their
  // partials; zero before the launch, and left zero by the last of them.
  int32_t* splits_done;
  int64_t capacity;
  int64_t k_block_bytes, v_block_bytes;
  int64_t n_tokens;
  int32_t head_dim, k_floats, v_floats;
  int32_t n_heads, group;
  DevicePosition first_position;  // of the first query token
  int32_t sliding_window;
  int32_t rows_per_cta, keys_per_tile, n_row_blocks, n_splits;
  // CTAs prepare their own queries (prepare_queries) and the last CTA of a row block merges its splits
  // (merge_rows); otherwise prepare_query_kernel and merge_kernel run before and after this kernel.
  bool one_launch;
  int32_t one_launch_floats;  // host: the shared floats those two steps need (they reuse the tile arrays)
};

__host__ __device__ inline int round_up4(int n) { return (n + 3) / 4 * 4; }

// Largest power of two p <= n (n >= 1).
__host__ __device__ inline int floor_pow2(int n) {
  int p = 1;
  while (2 * p <= n) p *= 2;
  return p;
}

// How many slices a row's dot product is cut into, so that rows x slices fills the CTA's groups of key threads.
__host__ __device__ inline int slices_per_row(int rows, int keys_per_tile) {
  const int groups = kThreads / keys_per_tile;
  return rows >= groups ? 1 : floor_pow2(groups / rows);
}

// Shared memory layout, in floats; every array starts 16-byte aligned.
struct SharedLayout {
  int k_stride;  // floats between expanded K rows
  int queries, k_rows, v_rows, partial_scores, weights, row_max, row_sum, correction, total;

  __host__ __device__ SharedLayout(int rows, int keys, int k_floats, int v_floats) {
    k_stride = k_floats + kKeyRowPadding;
    queries = 0;
    k_rows = queries + rows * k_floats;
    v_rows = k_rows + keys * k_stride;
    partial_scores = v_rows + keys * v_floats;
    // rows x slices_per_row(rows) is at most max(rows, thread groups), for every rows up to the CTA's: the last
    // row block of a call may have fewer rows and more slices, in the same allocation.
    weights = partial_scores + (rows > kThreads / keys ? rows : kThreads / keys) * keys;
    row_max = weights + rows * keys;
    row_sum = row_max + round_up4(rows);
    correction = row_sum + round_up4(rows);
    total = correction + round_up4(rows);
  }
  __host__ __device__ size_t bytes() const { return size_t(total) * sizeof(float); }
};

// The rows, KV head and key range one CTA serves.
struct Work {
  int kv_head, split;
  int64_t row_block;
  int64_t row_begin, row_end;  // rows of this KV head, numbered t * group + g
  int64_t key_begin, key_end;  // positions
};

__device__ inline int64_t position_of_row(const Params& p, int64_t row) { return p.first_position.get() + row / p.group; }

// The first key a query at `position` sees.
__device__ inline int64_t first_visible_key(const Params& p, int64_t position) {
  return p.sliding_window > 0 ? max(int64_t(0), position - p.sliding_window + 1) : 0;
}

__device__ inline Work work_of_cta(const Params& p) {
  Work w;
  int64_t index = blockIdx.x;
  w.split = int(index % p.n_splits);
  index /= p.n_splits;
  w.row_block = index % p.n_row_blocks;
  w.kv_head = int(index / p.n_row_blocks);
  w.row_begin = w.row_block * p.rows_per_cta;
  w.row_end = min(w.row_begin + p.rows_per_cta, p.n_tokens * p.group);
  // Rows are token-major, so the first row sees the earliest first key and the last row the latest last key.
  const int64_t lo = first_visible_key(p, position_of_row(p, w.row_begin));
  const int64_t hi = position_of_row(p, w.row_end - 1) + 1;
  // Splits start on tile boundaries so that every split but the last reads whole tiles.
  const int64_t per_split = (hi - lo + p.n_splits - 1) / p.n_splits;
  const int64_t chunk = (per_split + p.keys_per_tile - 1) / p.keys_per_tile * p.keys_per_tile;
  w.key_begin = min(hi, lo + w.split * chunk);
  w.key_end = min(hi, w.key_begin + chunk);
  return w;
}

// Index of (token, query head) of a row among the n_tokens * n_heads rows of q, out and the partial results.
__device__ inline int64_t output_row(const Params& p, const Work& w, int64_t row) {
  return (row / p.group) * p.n_heads + int64_t(w.kv_head) * p.group + row % p.group;
}

__device__ inline float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ inline float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc))));
}

// The rows' prepared queries, from prepare_query_kernel's output.
__device__ inline void load_queries(const Params& p, const Work& w, int rows, float* queries) {
  const int quads = p.k_floats / 4;
  for (int i = threadIdx.x; i < rows * quads; i += kThreads) {
    const int r = i / quads, c = i % quads;
    const float4* src = reinterpret_cast<const float4*>(p.prepared + output_row(p, w, w.row_begin + r) * p.k_floats);
    reinterpret_cast<float4*>(queries + r * p.k_floats)[c] = src[c];
  }
}

// The rows' queries prepared here, as prepare_query_kernel writes them (scale * prepare_query(q)), staged
// through the K rows array, which the first tile overwrites after a barrier.
template <formats::KvCodec K>
__device__ void prepare_queries(const Params& p, const Work& w, int rows, const SharedLayout& s, float* smem) {
  float* query = smem + s.k_rows;
  float* scratch = query + p.head_dim;
  for (int r = 0; r < rows; ++r) {
    const float* q = p.q + output_row(p, w, w.row_begin + r) * p.head_dim;
    for (int i = threadIdx.x; i < p.head_dim; i += kThreads) query[i] = q[i];
    __syncthreads();
    float* prepared = smem + s.queries + r * p.k_floats;
    DeviceCodec<K>::prepare_query(query, p.head_dim, prepared, scratch);  // ends with a barrier
    for (int i = threadIdx.x; i < p.k_floats; i += kThreads) prepared[i] *= p.scale;
  }
}

// Step 1: warp j % kWarps expands key j of the tile (K and V) into its shared rows.
template <formats::KvCodec K, formats::KvCodec V>
__device__ void expand_tile(const Params& p, const Work& w, int64_t first_key, int n_keys, const SharedLayout& s,
                            float* smem) {
  const int warp = threadIdx.x / 32;
  for (int j = warp; j < n_keys; j += kWarps) {
    const int64_t block = int64_t(w.kv_head) * p.capacity + (first_key + j) % p.capacity;
    DeviceCodec<K>::expand(p.k_cache + block * p.k_block_bytes, p.head_dim, smem + s.k_rows + j * s.k_stride);
    DeviceCodec<V>::expand(p.v_cache + block * p.v_block_bytes, p.head_dim, smem + s.v_rows + j * p.v_floats);
  }
}

// Step 2: partial_scores[(r * slices + slice) * keys + j] = <query r, K row j> over the slice's columns.
__device__ inline void score_tile(const Params& p, int rows, int n_keys, const SharedLayout& s, float* smem) {
  const int keys = p.keys_per_tile;
  const int j = threadIdx.x % keys, group = threadIdx.x / keys, n_groups = kThreads / keys;
  if (j >= n_keys) return;
  const int slices = slices_per_row(rows, keys);
  const int slice_quads = p.k_floats / slices / 4;
  for (int item = group; item < rows * slices; item += n_groups) {
    const int r = item / slices, slice = item % slices;
    const float4* q = reinterpret_cast<const float4*>(smem + s.queries + r * p.k_floats) + slice * slice_quads;
    const float4* k = reinterpret_cast<const float4*>(smem + s.k_rows + j * s.k_stride) + slice * slice_quads;
    float even = 0, odd = 0;  // two chains, so consecutive FMAs do not wait on each other
    for (int c = 0; c + 1 < slice_quads; c += 2) {
      even = dot4(q[c], k[c], even);
      odd = dot4(q[c + 1], k[c + 1], odd);
    }
    if (slice_quads % 2) even = dot4(q[slice_quads - 1], k[slice_quads - 1], even);
    smem[s.partial_scores + item * keys + j] = even + odd;
  }
}

// Step 3: the online softmax of every row over the tile (one warp per row, lane j = key j).
__device__ inline void softmax_tile(const Params& p, const Work& w, int rows, int64_t first_key, int n_keys,
                                    const SharedLayout& s, float* smem) {
  const int keys = p.keys_per_tile, lane = threadIdx.x % 32;
  const int slices = slices_per_row(rows, keys);
  for (int r = threadIdx.x / 32; r < rows; r += kWarps) {
    const int64_t position = position_of_row(p, w.row_begin + r);
    const int64_t key = first_key + lane;
    const bool visible = lane < n_keys && key <= position && key >= first_visible_key(p, position);
    float score = -INFINITY;
    if (visible) {
      score = 0;
      for (int slice = 0; slice < slices; ++slice) score += smem[s.partial_scores + (r * slices + slice) * keys + lane];
    }
    const float old_max = smem[s.row_max + r];
    const float new_max = fmaxf(old_max, warp_max(score));
    // A row that has seen no key yet keeps max -inf: its weights are 0 and its (zero) accumulator stays as is.
    const bool any = new_max > -INFINITY;
    const float weight = visible ? __expf(score - new_max) : 0.0f;
    const float correction = any ? __expf(old_max - new_max) : 1.0f;  // 0 when old_max is -inf
    const float tile_sum = warp_sum(weight);
    if (lane < keys) smem[s.weights + r * keys + lane] = weight;
    // Every lane read row_max above; shuffles order no memory, so the warp meets before lane 0 overwrites it
    // (compute-sanitizer racecheck on the H200 flagged this read/write pair).
    __syncwarp();
    if (lane == 0) {
      smem[s.row_max + r] = new_max;
      smem[s.row_sum + r] = smem[s.row_sum + r] * correction + tile_sum;
      smem[s.correction + r] = correction;
    }
  }
}

// The accumulator columns and rows a thread owns: float4 column `quad` of rows first_row, first_row + row_step, ...
struct Ownership {
  int quad, first_row, row_step, n_rows;
  __device__ Ownership(int v_floats, int rows) {
    const int quads = v_floats / 4;  // <= kThreads: the host checks v_floats <= kMaxAccumulatorFloats
    quad = threadIdx.x % quads;
    first_row = threadIdx.x / quads;
    row_step = kThreads / quads;
    n_rows = first_row < rows ? (rows - first_row + row_step - 1) / row_step : 0;
  }
};

// Step 4: acc[row] = acc[row] * correction[row] + sum_j weight[row][j] * V row j.
__device__ inline void accumulate_tile(const Params& p, const Ownership& own, int n_keys, const SharedLayout& s,
                                       const float* smem, float4 (&acc)[kMaxRowsPerThread]) {
  const int keys = p.keys_per_tile;
#pragma unroll
  for (int i = 0; i < kMaxRowsPerThread; ++i) {
    if (i < own.n_rows) {
      const float c = smem[s.correction + own.first_row + i * own.row_step];
      acc[i].x *= c, acc[i].y *= c, acc[i].z *= c, acc[i].w *= c;
    }
  }
  const float4* v = reinterpret_cast<const float4*>(smem + s.v_rows) + own.quad;
  const int v_quads = p.v_floats / 4;
  for (int j = 0; j < n_keys; ++j) {
    const float4 x = v[j * v_quads];
#pragma unroll
    for (int i = 0; i < kMaxRowsPerThread; ++i) {
      if (i < own.n_rows) {
        const float wt = smem[s.weights + (own.first_row + i * own.row_step) * keys + j];
        acc[i].x = fmaf(wt, x.x, acc[i].x);
        acc[i].y = fmaf(wt, x.y, acc[i].y);
        acc[i].z = fmaf(wt, x.z, acc[i].z);
        acc[i].w = fmaf(wt, x.w, acc[i].w);
      }
    }
  }
}

__device__ inline void write_partials(const Params& p, const Work& w, const Ownership& own, const SharedLayout& s,
                                      const float* smem, const float4 (&acc)[kMaxRowsPerThread]) {
  const int64_t split_rows = int64_t(w.split) * p.n_tokens * p.n_heads;
#pragma unroll
  for (int i = 0; i < kMaxRowsPerThread; ++i) {
    if (i < own.n_rows) {
      const int64_t out = split_rows + output_row(p, w, w.row_begin + own.first_row + i * own.row_step);
      reinterpret_cast<float4*>(p.partial_acc + out * p.v_floats)[own.quad] = acc[i];
    }
  }
  const int rows = int(w.row_end - w.row_begin);
  for (int r = threadIdx.x; r < rows; r += kThreads)
    p.partial_state[split_rows + output_row(p, w, w.row_begin + r)] =
        make_float2(smem[s.row_max + r], smem[s.row_sum + r]);
}

// Whether this CTA is the last of its row block's splits to have written its partials (last_cta_to_finish), so
// that it sees all of them. Every thread gets the answer.
__device__ inline bool last_of_row_block(const Params& p, const Work& w) {
  if (p.n_splits == 1) {
    __syncthreads();  // the partials this CTA wrote are visible to all its threads
    return true;
  }
  return last_cta_to_finish(p.splits_done + int64_t(w.kv_head) * p.n_row_blocks + w.row_block, p.n_splits);
}

// The rows' splits combined and taken out of the V basis into p.out (merge_row), the tile arrays reused:
// split weights [rows][n_splits], then acc [v_floats], result [head_dim] and the codec's scratch.
template <formats::KvCodec V>
__device__ void merge_rows(const Params& p, const Work& w, int rows, float* smem) {
  const int64_t n_rows = p.n_tokens * p.n_heads;
  float* split_weight = smem;
  float* acc = smem + round_up4(rows * p.n_splits);
  float* result = acc + p.v_floats;
  float* scratch = result + p.head_dim;
  for (int r = threadIdx.x / 32; r < rows; r += kWarps)
    rows::split_weights(p.partial_state, p.n_splits, n_rows, output_row(p, w, w.row_begin + r),
                        split_weight + r * p.n_splits);
  __syncthreads();
  for (int r = 0; r < rows; ++r) {
    rows::merge_row<V>(p.partial_acc, split_weight + r * p.n_splits, p.n_splits, n_rows,
                       output_row(p, w, w.row_begin + r), p.head_dim, p.v_floats, acc, result, scratch, p.out);
    __syncthreads();  // acc and result are the next row's
  }
}

template <formats::KvCodec K, formats::KvCodec V>
__global__ void __launch_bounds__(kThreads) flash_attention_kernel(const Params p) {
  allow_dependents();  // when it merges, the output projection's GEMV may start streaming its weights
  extern __shared__ float4 smem_quads[];
  float* smem = reinterpret_cast<float*>(smem_quads);
  const Work w = work_of_cta(p);
  const int rows = int(w.row_end - w.row_begin);
  const SharedLayout s(rows, p.keys_per_tile, p.k_floats, p.v_floats);

  if (p.one_launch)
    prepare_queries<K>(p, w, rows, s, smem);
  else
    load_queries(p, w, rows, smem + s.queries);
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    smem[s.row_max + r] = -INFINITY;
    smem[s.row_sum + r] = 0;
  }
  const Ownership own(p.v_floats, rows);
  float4 acc[kMaxRowsPerThread];
#pragma unroll
  for (int i = 0; i < kMaxRowsPerThread; ++i) acc[i] = make_float4(0, 0, 0, 0);

  for (int64_t first_key = w.key_begin; first_key < w.key_end; first_key += p.keys_per_tile) {
    const int n_keys = int(min(int64_t(p.keys_per_tile), w.key_end - first_key));
    __syncthreads();  // the previous tile's rows are no longer read
    expand_tile<K, V>(p, w, first_key, n_keys, s, smem);
    __syncthreads();
    score_tile(p, rows, n_keys, s, smem);
    __syncthreads();
    softmax_tile(p, w, rows, first_key, n_keys, s, smem);
    __syncthreads();
    accumulate_tile(p, own, n_keys, s, smem, acc);
  }
  __syncthreads();
  write_partials(p, w, own, s, smem, acc);
  if (p.one_launch && last_of_row_block(p, w)) merge_rows<V>(p, w, rows, smem);
}

}  // namespace sparrow::cuda::flash
