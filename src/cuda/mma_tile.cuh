#pragma once
// The CTA tile both tensor-core prefill GEMMs share (matmul_int8.cu on 8-bit codes, matmul_half.cu on f16 / bf16):
// 8 warps compute 128 output rows x 64 tokens; warp w owns rows 32 (w % 4) .. + 32 and tokens 32 (w / 4) .. + 32,
// 2 x 4 mma tiles of 16 rows x 8 tokens. Accumulator fragments (PTX ISA, m16n8k16 / m16n8k32), lane 4 g + q:
// c0 = C[g][2q], c1 = C[g][2q+1], c2 = C[g+8][2q], c3 = C[g+8][2q+1].
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/cuda_check.h"
#include "util/error.h"

namespace sparrow::cuda::mma_tile {

constexpr int kWarp = 32;
constexpr int kTileRows = 128;   // output rows per CTA
constexpr int kTileTokens = 64;  // tokens per CTA
constexpr int kWarpsAlongRows = 4, kWarpsAlongTokens = 2;
constexpr int kThreads = kWarpsAlongRows * kWarpsAlongTokens * kWarp;
constexpr int kWarpRows = kTileRows / kWarpsAlongRows;        // 32: two m16 tiles
constexpr int kWarpTokens = kTileTokens / kWarpsAlongTokens;  // 32: four n8 tiles
constexpr int kRowTiles = kWarpRows / 16, kTokenTiles = kWarpTokens / 8;
constexpr int kMaxTokenTiles = 65535;  // gridDim.y

// A thread's place in the tile.
struct WarpPlace {
  int g, q;                 // lane = 4 g + q
  int warp_row, warp_token;  // the warp's first row and token within the tile
  int64_t row0;             // the CTA's first row and token
  int token0;
};

__device__ __forceinline__ WarpPlace warp_place() {
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  return {lane / 4, lane % 4, (warp % kWarpsAlongRows) * kWarpRows, (warp / kWarpsAlongRows) * kWarpTokens,
          int64_t(blockIdx.x) * kTileRows, int(blockIdx.y) * kTileTokens};
}

// Writes the thread's accumulators to y[token][row] ([n_tokens][n_out]), skipping rows and tokens past the ends.
__device__ __forceinline__ void store_outputs(const float (&acc)[kRowTiles][kTokenTiles][4], const WarpPlace& p,
                                              int n_out, int n_tokens, float* __restrict__ y) {
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = p.row0 + p.warp_row + 16 * m + p.g + 8 * h;
#pragma unroll
      for (int n = 0; n < kTokenTiles; ++n) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int token = p.token0 + p.warp_token + 8 * n + 2 * p.q + j;
          if (row < n_out && token < n_tokens) y[int64_t(token) * n_out + row] = acc[m][n][2 * h + j];
        }
      }
    }
  }
}

// The launch grid for n_out rows and n_tokens tokens.
inline dim3 grid(int64_t n_out, int64_t n_tokens) {
  return dim3(unsigned((n_out + kTileRows - 1) / kTileRows), unsigned((n_tokens + kTileTokens - 1) / kTileTokens));
}

// Throws unless the current device and `kernel`'s binary are sm_80 or newer (mma.sync in these shapes): a build
// for older architectures compiles the kernels empty. `what` names the caller in the message.
inline void require_sm80(const void* kernel, const char* what) {
  int device = 0, major = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cudaFuncAttributes attributes{};
  SPARROW_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  if (major < 8 || attributes.binaryVersion < 80) {
    throw Error(std::string(what) + ": prefill needs sm_80 or newer (device compute capability " +
                std::to_string(major) + ".x, kernel built for sm_" + std::to_string(attributes.binaryVersion) + ")");
  }
}

}  // namespace sparrow::cuda::mma_tile
