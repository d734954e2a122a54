// Shard 2 of the fused attention kernel's instances: the K codecs whose shard_of is 2 (flash_launch.h).
#include "cuda/attention/flash_shard.cuh"

template void sparrow::cuda::flash::launch_shard<2>(sparrow::formats::KvCodec, sparrow::formats::KvCodec,
                                                     const sparrow::cuda::flash::Params&, unsigned, size_t,
                                                     cudaStream_t);
