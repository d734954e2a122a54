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

// Starts copying the 16-byte granules that cover [src, src + n) to dst (16-byte aligned), so that the byte at src
// lands at dst + (src % 16), every granule as one asynchronous copy: none of the warp's lanes waits on a load,
// where stage_row_bytes_async's byte-by-byte ends made each step cost a whole memory latency. A granule's
// bytes outside [src, src + n) are read too where they lie in [lo, hi), the span the caller knows to be
// readable (the whole matrix); a granule reaching outside it (at most the first and the last of the span) has
// only its bytes inside [src, src + n) copied, by plain loads. Called by all 32 lanes of a warp; complete as
// for stage_row_bytes_async.
__device__ inline void stage_granules_async(uint8_t* dst, const uint8_t* src, int n, const uint8_t* lo,
                                            const uint8_t* hi, int lane) {
  constexpr int kWarp = 32;
  const uintptr_t first = reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15);
  const int granules = int((reinterpret_cast<uintptr_t>(src) + uintptr_t(n) + 15 - first) / 16);
  for (int i = lane; i < granules; i += kWarp) {
    const uint8_t* from = reinterpret_cast<const uint8_t*>(first) + 16 * i;
    uint8_t* to = dst + 16 * i;
    if (from >= lo && from + 16 <= hi) {
      copy_async_16(to, from);
    } else {
      for (int b = 0; b < 16; ++b) {
        if (from + b >= src && from + b < src + n) to[b] = from[b];
      }
    }
  }
}

}  // namespace sparrow::cuda
