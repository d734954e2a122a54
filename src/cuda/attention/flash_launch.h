#pragma once
// The fused kernel has one instance per (K codec, V codec) pair. They are compiled in kShards translation units
// (flash_shard_*.cu), split by K codec, so that a parallel build compiles them side by side rather than in one
// long file; attention.cu calls the shard that holds the call's K codec.
#include <cuda_runtime.h>

#include "cuda/attention/flash_kernel.cuh"
#include "formats/kv/kv_codec.h"

namespace sparrow::cuda::flash {

constexpr int kShards = 4;
constexpr int shard_of(formats::KvCodec k) { return int(k) % kShards; }

// Launches flash_attention_kernel<K, V> for k_codec (whose shard must be kShard) and v_codec: n_ctas CTAs with
// `shared` bytes of dynamic shared memory each.
template <int kShard>
void launch_shard(formats::KvCodec k_codec, formats::KvCodec v_codec, const Params& params, unsigned n_ctas,
                  size_t shared, cudaStream_t stream);

}  // namespace sparrow::cuda::flash
