#pragma once
// The KV codec ops on device buffers, batched as Backend::kv_encode .. kv_finish declare them (src/ops/backend.h:
// same arguments, same semantics), each a few kernel launches on `stream`. Every op throws
// sparrow::Error, before touching the device, for a head dim other than 64, 128, 256, 512, a negative count or
// a null buffer. Like the references, qjl (keys only) runs its V ops too; refusing it as a V cache is the
// cache's check (KvCodecInfo::keys_only).
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/kv/kv_codec.h"

namespace sparrow::cuda {

// Binds the codec tables (kv/device_tables.cuh) of every translation unit that launches codec kernels on the
// current device, the QJL projections included: a launch inside a CUDA graph capture cannot bind them (binding
// copies and synchronizes). Once per device and process; CudaBackend's constructor calls it.
void bind_kv_tables();

// n head vectors x[n][d] -> blocks[n][block_bytes(d)].
void kv_encode(formats::KvCodec codec, int d, const float* x, int64_t n, uint8_t* blocks, cudaStream_t stream);
// blocks[n] -> x[n][d].
void kv_decode(formats::KvCodec codec, int d, const uint8_t* blocks, int64_t n, float* x, cudaStream_t stream);
// scores[i][j] = score(prepare_query(queries[i]), blocks[j]) for i < n_queries, j < n_blocks.
void kv_score(formats::KvCodec codec, int d, const float* queries, int64_t n_queries, const uint8_t* blocks,
              int64_t n_blocks, float* scores, cudaStream_t stream);
// acc[s][accumulator_floats(d)] = sum over j of weights[s][j] * block j, accumulated from zero in block order,
// for s < n_sequences.
void kv_accumulate(formats::KvCodec codec, int d, const float* weights, int64_t n_sequences, const uint8_t* blocks,
                   int64_t n_blocks, float* acc, cudaStream_t stream);
// out[s][d] = finish(acc[s]) for s < n.
void kv_finish(formats::KvCodec codec, int d, const float* acc, int64_t n, float* out, cudaStream_t stream);
// prepared[i][query_floats(d)] = prepare_query(q[i]) for i < n.
void kv_prepare_query(formats::KvCodec codec, int d, const float* q, int64_t n, float* prepared,
                      cudaStream_t stream);

}  // namespace sparrow::cuda
