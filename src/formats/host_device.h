#pragma once
// Marks the small inline functions of formats/ (block decoding, codebook lookups, seeded generators) that CUDA
// kernels call as well as the CPU, so each layout is decoded in one place for every backend.
#if defined(__CUDACC__)
#define SPARROW_HOST_DEVICE __host__ __device__
#else
#define SPARROW_HOST_DEVICE
#endif
