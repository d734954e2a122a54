#pragma once
// Warp-cooperative staging of a run of weight bytes into shared memory, for the kernels that then decode the
// staged blocks (the GEMVs of matmul.cu and matmul_int8.cu).
#include <cstdint>

namespace sparrow::cuda {

// 16 bytes from global src to shared dst (both 16-byte aligned) without waiting for them: cp.async on sm_80 and
// newer (L1 bypassed: weights are read once), a plain copy before. Complete after commit_copies and
// wait_copies.
__device__ __forceinline__ void copy_async_16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned to = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src) : "memory");
#else
  *static_cast<uint4*>(dst) = __ldg(static_cast<const uint4*>(src));
#endif
}

// Closes the calling thread's group of copies issued since the last commit.
__device__ __forceinline__ void commit_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of the calling thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Starts copying n bytes from global src to shared dst, where dst and src are equal modulo 16 (so that block
// fields keep their alignment): the 16-byte granules wholly inside [src, src + n) go as one asynchronous copy
// per lane, the ragged ends (fewer than 16 bytes each) byte by byte at once. Called by all 32 lanes of a warp;
// the bytes are there once each lane has committed and waited for its copies and the warp has synced.
__device__ inline void stage_row_bytes_async(uint8_t* dst, const uint8_t* src, int n, int lane) {
  constexpr int kWarp = 32;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(src), end = begin + uintptr_t(n);
  const uintptr_t first = (begin + 15) & ~uintptr_t(15), last = end & ~uintptr_t(15);
  if (first >= last) {
    for (int i = lane; i < n; i += kWarp) dst[i] = src[i];
    return;
  }
  const int head = int(first - begin), tail = int(end - last);
  const int granules = int((last - first) / 16);
  const uint4* from = reinterpret_cast<const uint4*>(first);
  uint4* to = reinterpret_cast<uint4*>(dst + head);
  for (int i = lane; i < granules; i += kWarp) copy_async_16(to + i, from + i);
  if (lane < head) dst[lane] = src[lane];
  if (lane < tail) dst[n - tail + lane] = src[n - tail + lane];
}

// stage_row_bytes_async, waited for: the bytes are there once the warp has synced.
__device__ inline void stage_row_bytes(uint8_t* dst, const uint8_t* src, int n, int lane) {
  stage_row_bytes_async(dst, src, n, lane);
  commit_copies();
  wait_copies<0>();
}

}  // namespace sparrow::cuda
