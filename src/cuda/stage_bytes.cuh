#pragma once
// Warp-cooperative staging of a run of weight bytes into shared memory, for the kernels that then decode the
// staged blocks (the GEMVs of matmul.cu and matmul_int8.cu).
#include <cstdint>

namespace sparrow::cuda {

// Copies n bytes from global src to shared dst, where dst and src are equal modulo 16 (so that block fields keep
// their alignment): the 16-byte granules wholly inside [src, src + n) move as one 16-byte load per lane, the
// ragged ends (fewer than 16 bytes each) byte by byte. Called by all 32 lanes of a warp; the caller syncs.
__device__ inline void stage_row_bytes(uint8_t* dst, const uint8_t* src, int n, int lane) {
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
  for (int i = lane; i < granules; i += kWarp) to[i] = __ldg(from + i);
  if (lane < head) dst[lane] = src[lane];
  if (lane < tail) dst[n - tail + lane] = src[n - tail + lane];
}

}  // namespace sparrow::cuda
