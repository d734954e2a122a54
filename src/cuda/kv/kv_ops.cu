// The batched KV codec ops (kv_ops.h) as kernels over DeviceCodec<C>, launched through with_device_codec.
//
// Shapes: encode, decode, prepare_query and finish run one CTA per vector (grid-stride past 2^20 vectors), the
// input staged in shared memory. Score gives each warp a block: it expands the block's basis row into shared
// memory once and dots it with every prepared query (prepared first, by the prepare kernel, into a temporary
// buffer). Accumulate runs one CTA per weight sequence: its warps expand 8 blocks at a time and every thread
// adds them, in block order, into the accumulator columns it owns, as the reference accumulates from zero.
#include "cuda/kv/kv_ops.h"

#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/kv/codecs.cuh"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

using formats::KvCodec;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kv::kWarpSize;
constexpr int64_t kMaxGrid = int64_t(1) << 20;

int grid_for(int64_t n) { return int(std::min(n, kMaxGrid)); }

// ---------------------------------------------------------------------------------------------------------
// Kernels.

template <KvCodec C>
__global__ void __launch_bounds__(kThreads)
    encode_kernel(int d, const float* x, int64_t n, uint8_t* blocks, int64_t block_bytes) {
  extern __shared__ float smem[];
  float* v = smem;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    for (int e = int(threadIdx.x); e < d; e += kThreads) v[e] = x[i * d + e];
    __syncthreads();
    DeviceCodec<C>::encode(v, d, blocks + i * block_bytes, smem + d);
    __syncthreads();
  }
}

template <KvCodec C>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(int d, const uint8_t* blocks, int64_t n, int64_t block_bytes, float* x) {
  extern __shared__ float smem[];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    DeviceCodec<C>::decode(blocks + i * block_bytes, d, x + i * d, smem);
    __syncthreads();
  }
}

template <KvCodec C>
__global__ void __launch_bounds__(kThreads)
    prepare_kernel(int d, const float* q, int64_t n, int64_t query_floats, float* prepared) {
  extern __shared__ float smem[];
  float* v = smem;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    for (int e = int(threadIdx.x); e < d; e += kThreads) v[e] = q[i * d + e];
    __syncthreads();
    DeviceCodec<C>::prepare_query(v, d, prepared + i * query_floats, smem + d);
    __syncthreads();
  }
}

template <KvCodec C>
__global__ void __launch_bounds__(kThreads)
    finish_kernel(int d, const float* acc, int64_t n, int64_t acc_floats, float* out) {
  extern __shared__ float smem[];
  float* v = smem;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    for (int64_t e = threadIdx.x; e < acc_floats; e += kThreads) v[e] = acc[i * acc_floats + e];
    __syncthreads();
    DeviceCodec<C>::finish(v, d, out + i * d, smem + acc_floats);
    __syncthreads();
  }
}

// scores[q][j] = <prepared[q], row(block j)>; shared memory: one basis row per warp.
template <KvCodec C>
__global__ void __launch_bounds__(kThreads)
    score_kernel(int d, const float* prepared, int64_t n_queries, int query_floats, const uint8_t* blocks,
                 int64_t n_blocks, int64_t block_bytes, float* scores) {
  extern __shared__ float smem[];
  float* row = smem + kv::warp_id() * query_floats;
  for (int64_t j = int64_t(blockIdx.x) * kWarps + kv::warp_id(); j < n_blocks; j += int64_t(gridDim.x) * kWarps) {
    DeviceCodec<C>::expand(blocks + j * block_bytes, d, row);
    for (int64_t q = 0; q < n_queries; ++q) {
      const float* pq = prepared + q * query_floats;
      float partial = 0;
      for (int c = kv::lane_id(); c < query_floats; c += kv::kWarpSize) partial += pq[c] * row[c];
      const float sum = kv::warp_sum(partial);
      if (kv::lane_id() == 0) scores[q * n_blocks + j] = sum;
    }
    __syncwarp();  // every lane has read the row before the next expand overwrites it
  }
}

// acc[s] = sum over j, in order, of weights[s][j] * row(block j); shared memory: kWarps rows, then the sums.
template <KvCodec C>
__global__ void __launch_bounds__(kThreads)
    accumulate_kernel(int d, const float* weights, int64_t n_sequences, const uint8_t* blocks, int64_t n_blocks,
                      int64_t block_bytes, int acc_floats, float* acc) {
  extern __shared__ float smem[];
  float* rows = smem;
  float* sum = smem + kWarps * acc_floats;
  for (int64_t s = blockIdx.x; s < n_sequences; s += gridDim.x) {
    const float* w = weights + s * n_blocks;
    for (int c = int(threadIdx.x); c < acc_floats; c += kThreads) sum[c] = 0.0f;
    for (int64_t first = 0; first < n_blocks; first += kWarps) {
      const int batch = int(std::min<int64_t>(kWarps, n_blocks - first));
      if (kv::warp_id() < batch)
        DeviceCodec<C>::expand(blocks + (first + kv::warp_id()) * block_bytes, d, rows + kv::warp_id() * acc_floats);
      __syncthreads();
      for (int c = int(threadIdx.x); c < acc_floats; c += kThreads) {
        float total = sum[c];
        for (int r = 0; r < batch; ++r) total += w[first + r] * rows[r * acc_floats + c];
        sum[c] = total;
      }
      __syncthreads();
    }
    for (int c = int(threadIdx.x); c < acc_floats; c += kThreads) acc[s * acc_floats + c] = sum[c];
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------------------------
// Argument checks, before anything touches the device.

const formats::KvCodecInfo& checked_codec(const char* op, KvCodec codec, int d) {
  const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
  if (!formats::kv_head_dim_supported(d)) {
    throw Error(std::string(op) + ": kv codec " + std::string(info.name) + ": head dim " + std::to_string(d) +
                " is not supported (expected 64, 128, 256 or 512)");
  }
  return info;
}

void check_buffer(const char* op, const char* name, const void* buffer, int64_t count) {
  if (count < 0) throw Error(std::string(op) + ": negative " + name + " count " + std::to_string(count));
  if (count > 0 && buffer == nullptr) throw Error(std::string(op) + ": " + name + " is null");
}

// A temporary device buffer freed in stream order.
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, cudaStream_t stream) : stream_(stream) {
    SPARROW_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
  }
  ~StreamBuffer() { cudaFreeAsync(data_, stream_); }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  float* floats() const { return static_cast<float*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

template <KvCodec C>
void launch_prepare(int d, const float* q, int64_t n, int64_t query_floats, float* prepared, cudaStream_t stream) {
  const size_t smem = sizeof(float) * size_t(d + DeviceCodec<C>::smem_floats(d));
  prepare_kernel<C><<<grid_for(n), kThreads, smem, stream>>>(d, q, n, query_floats, prepared);
  SPARROW_CUDA_CHECK_LAUNCH();
}

}  // namespace

void kv_encode(KvCodec codec, int d, const float* x, int64_t n, uint8_t* blocks, cudaStream_t stream) {
  const formats::KvCodecInfo& info = checked_codec("kv_encode", codec, d);
  check_buffer("kv_encode", "x", x, n);
  check_buffer("kv_encode", "blocks", blocks, n);
  if (n == 0) return;
  const int64_t block_bytes = int64_t(info.block_bytes(d));
  with_device_codec(codec, [&](auto tag) {
    constexpr KvCodec C = decltype(tag)::value;
    const size_t smem = sizeof(float) * size_t(d + DeviceCodec<C>::smem_floats(d));
    encode_kernel<C><<<grid_for(n), kThreads, smem, stream>>>(d, x, n, blocks, block_bytes);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

void kv_decode(KvCodec codec, int d, const uint8_t* blocks, int64_t n, float* x, cudaStream_t stream) {
  const formats::KvCodecInfo& info = checked_codec("kv_decode", codec, d);
  check_buffer("kv_decode", "blocks", blocks, n);
  check_buffer("kv_decode", "x", x, n);
  if (n == 0) return;
  const int64_t block_bytes = int64_t(info.block_bytes(d));
  with_device_codec(codec, [&](auto tag) {
    constexpr KvCodec C = decltype(tag)::value;
    const size_t smem = sizeof(float) * size_t(DeviceCodec<C>::smem_floats(d));
    decode_kernel<C><<<grid_for(n), kThreads, smem, stream>>>(d, blocks, n, block_bytes, x);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

void kv_prepare_query(KvCodec codec, int d, const float* q, int64_t n, float* prepared, cudaStream_t stream) {
  const formats::KvCodecInfo& info = checked_codec("kv_prepare_query", codec, d);
  check_buffer("kv_prepare_query", "q", q, n);
  check_buffer("kv_prepare_query", "prepared", prepared, n);
  if (n == 0) return;
  const int64_t query_floats = int64_t(info.query_floats(d));
  with_device_codec(codec, [&](auto tag) {
    launch_prepare<decltype(tag)::value>(d, q, n, query_floats, prepared, stream);
  });
}

void kv_score(KvCodec codec, int d, const float* queries, int64_t n_queries, const uint8_t* blocks,
              int64_t n_blocks, float* scores, cudaStream_t stream) {
  const formats::KvCodecInfo& info = checked_codec("kv_score", codec, d);
  check_buffer("kv_score", "queries", queries, n_queries);
  check_buffer("kv_score", "blocks", blocks, n_blocks);
  check_buffer("kv_score", "scores", scores, n_queries * n_blocks);
  if (n_queries == 0 || n_blocks == 0) return;
  const int query_floats = int(info.query_floats(d));
  const int64_t block_bytes = int64_t(info.block_bytes(d));
  StreamBuffer prepared(sizeof(float) * size_t(n_queries) * size_t(query_floats), stream);
  with_device_codec(codec, [&](auto tag) {
    constexpr KvCodec C = decltype(tag)::value;
    launch_prepare<C>(d, queries, n_queries, query_floats, prepared.floats(), stream);
    const size_t smem = sizeof(float) * size_t(kWarps) * size_t(query_floats);
    score_kernel<C><<<grid_for((n_blocks + kWarps - 1) / kWarps), kThreads, smem, stream>>>(
        d, prepared.floats(), n_queries, query_floats, blocks, n_blocks, block_bytes, scores);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

void kv_accumulate(KvCodec codec, int d, const float* weights, int64_t n_sequences, const uint8_t* blocks,
                   int64_t n_blocks, float* acc, cudaStream_t stream) {
  const formats::KvCodecInfo& info = checked_codec("kv_accumulate", codec, d);
  check_buffer("kv_accumulate", "weights", weights, n_sequences * n_blocks);
  check_buffer("kv_accumulate", "blocks", blocks, n_blocks);
  check_buffer("kv_accumulate", "acc", acc, n_sequences);
  if (n_sequences == 0) return;
  const int acc_floats = int(info.accumulator_floats(d));
  const int64_t block_bytes = int64_t(info.block_bytes(d));
  with_device_codec(codec, [&](auto tag) {
    constexpr KvCodec C = decltype(tag)::value;
    const size_t smem = sizeof(float) * size_t(kWarps + 1) * size_t(acc_floats);
    accumulate_kernel<C><<<grid_for(n_sequences), kThreads, smem, stream>>>(d, weights, n_sequences, blocks,
                                                                           n_blocks, block_bytes, acc_floats, acc);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

void kv_finish(KvCodec codec, int d, const float* acc, int64_t n, float* out, cudaStream_t stream) {
  const formats::KvCodecInfo& info = checked_codec("kv_finish", codec, d);
  check_buffer("kv_finish", "acc", acc, n);
  check_buffer("kv_finish", "out", out, n);
  if (n == 0) return;
  const int64_t acc_floats = int64_t(info.accumulator_floats(d));
  with_device_codec(codec, [&](auto tag) {
    constexpr KvCodec C = decltype(tag)::value;
    const size_t smem = sizeof(float) * size_t(acc_floats + DeviceCodec<C>::smem_floats(d));
    finish_kernel<C><<<grid_for(n), kThreads, smem, stream>>>(d, acc, n, acc_floats, out);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace sparrow::cuda
