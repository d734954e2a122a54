#pragma once
// The definition of launch_shard (flash_launch.h), included only by the shard files that instantiate it.
#include <string>

#include "cuda/attention/flash_launch.h"
#include "cuda/attention/shared_memory.h"
#include "cuda/cuda_check.h"
#include "cuda/kv/codecs.cuh"
#include "util/error.h"

namespace sparrow::cuda::flash {

template <int kShard>
void launch_shard(formats::KvCodec k_codec, formats::KvCodec v_codec, const Params& params, unsigned n_ctas,
                  size_t shared, cudaStream_t stream) {
  using formats::KvCodec;
  if (shard_of(k_codec) != kShard)
    throw Error("attention: kv codec " + std::string(formats::kv_codec_info(k_codec).name) +
                " dispatched to the wrong kernel shard");
  with_device_codec(k_codec, [&](auto k) {
    constexpr KvCodec K = decltype(k)::value;
    if constexpr (shard_of(K) == kShard) {
      with_device_codec(v_codec, [&](auto v) {
        constexpr KvCodec V = decltype(v)::value;
        allow_shared_bytes(flash_attention_kernel<K, V>, shared);
        flash_attention_kernel<K, V><<<n_ctas, kThreads, shared, stream>>>(params);
        SPARROW_CUDA_CHECK_LAUNCH();
      });
    }
  });
}

}  // namespace sparrow::cuda::flash
