// The f16 / bf16 prefill GEMM (matmul_half.h).
//
// Launch: grid (ceil(n_out / 128), ceil(n_tokens / 64)), 256 threads (8 warps), the tile of mma_tile.cuh: a CTA
// computes 128 output rows x 64 tokens, walking n_in in steps of kTileK = 64 elements. Per step, the CTA's threads copy the
// step's 128 weight rows and 64 token rows into shared memory (16-byte pieces; rows past n_out, tokens past
// n_tokens and elements past n_in as zeros), and the pieces of the next step are loaded into registers while this
// step is computed. Warp w owns rows 32 (w % 4) .. + 32 and tokens 32 (w / 4) .. + 32 of the tile: 2 x 4 mma
// tiles of 16 rows x 8 tokens. For each 16 elements of the step, one m16n8k16 mma per tile from a zero
// accumulator, whose result is added to the tile's fp32 sums with a rounded add (matmul_half.h says why). The sum
// of an output is therefore its 16-element partial sums added in order, whatever the tile shape or token count.
// Shared memory: 128 + 64 staged rows of 72 halves (64 + 8 of padding: the 8 rows that one fragment load touches
// start in 8 different 4-bank groups), 27 KiB, static.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .f16 / .bf16 operands), for lane 4 g + q:
// A (16 rows x 16 k, row-major) a0 = A[g][2q, 2q+1], a1 = A[g+8][2q, 2q+1], a2 = A[g][2q+8, 2q+9],
// a3 = A[g+8][2q+8, 2q+9]; B (16 k x 8 tokens, column-major) b0 = B[2q, 2q+1][g], b1 = B[2q+8, 2q+9][g];
// C/D c0 = C[g][2q], c1 = C[g][2q+1], c2 = C[g+8][2q], c3 = C[g+8][2q+1]. Two consecutive k of one staged row are
// one 32-bit word, lower k in the lower half.
#include "cuda/matmul_half.h"

#include <climits>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/mma_tile.cuh"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

using namespace mma_tile;

constexpr int kTileK = 64;
constexpr int kStride = kTileK + 8;  // halves per staged row
constexpr int kPiece = 8;            // halves per 16-byte piece
constexpr int kPiecesPerRow = kTileK / kPiece;
constexpr int kWeightPieces = kTileRows * kPiecesPerRow / kThreads;  // per thread and step: 4
constexpr int kTokenPieces = kTileTokens * kPiecesPerRow / kThreads;  // 2
static_assert(kWeightPieces * kThreads == kTileRows * kPiecesPerRow, "the weight pieces split evenly");
static_assert(kTokenPieces * kThreads == kTileTokens * kPiecesPerRow, "the token pieces split evenly");
static_assert((kStride * 2) % 16 == 0, "16-byte aligned staged rows");

struct HalfTile {
  alignas(16) uint16_t w[kTileRows][kStride];
  alignas(16) uint16_t x[kTileTokens][kStride];
};

// The 8 halves at element e of row `row` of a matrix of n_rows x n_in, or zeros past its rows or n_in (n_in is a
// multiple of 8, so a piece is wholly inside a row or wholly past it). `aligned`: the matrix starts on a 16-byte
// boundary (its rows then do too: n_in is a multiple of 8).
__device__ __forceinline__ uint4 load_piece(const uint16_t* __restrict__ m, int64_t row, int64_t n_rows, int n_in,
                                            int e, bool aligned) {
  if (row >= n_rows || e >= n_in) return make_uint4(0, 0, 0, 0);
  const uint16_t* p = m + row * n_in + e;
  if (aligned) return __ldg(reinterpret_cast<const uint4*>(p));
  uint32_t word[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) word[i] = uint32_t(__ldg(p + 2 * i)) | (uint32_t(__ldg(p + 2 * i + 1)) << 16);
  return make_uint4(word[0], word[1], word[2], word[3]);
}

// Pieces of the step at element k0 that this thread stages: weight piece i is item threadIdx.x + i * kThreads
// (row item / kPiecesPerRow, piece item % kPiecesPerRow), token pieces likewise.
struct StepPieces {
  uint4 w[kWeightPieces];
  uint4 x[kTokenPieces];
};

__device__ __forceinline__ void load_step(StepPieces& pieces, const uint16_t* __restrict__ w, int n_out,
                                          const uint16_t* __restrict__ x, int n_tokens, int n_in, int64_t row0,
                                          int token0, int k0, bool w_aligned, bool x_aligned) {
#pragma unroll
  for (int i = 0; i < kWeightPieces; ++i) {
    const int item = int(threadIdx.x) + i * kThreads;
    pieces.w[i] = load_piece(w, row0 + item / kPiecesPerRow, n_out, n_in, k0 + kPiece * (item % kPiecesPerRow),
                             w_aligned);
  }
#pragma unroll
  for (int i = 0; i < kTokenPieces; ++i) {
    const int item = int(threadIdx.x) + i * kThreads;
    pieces.x[i] = load_piece(x, token0 + item / kPiecesPerRow, n_tokens, n_in, k0 + kPiece * (item % kPiecesPerRow),
                             x_aligned);
  }
}

__device__ __forceinline__ void store_step(HalfTile& tile, const StepPieces& pieces) {
#pragma unroll
  for (int i = 0; i < kWeightPieces; ++i) {
    const int item = int(threadIdx.x) + i * kThreads;
    *reinterpret_cast<uint4*>(&tile.w[item / kPiecesPerRow][kPiece * (item % kPiecesPerRow)]) = pieces.w[i];
  }
#pragma unroll
  for (int i = 0; i < kTokenPieces; ++i) {
    const int item = int(threadIdx.x) + i * kThreads;
    *reinterpret_cast<uint4*>(&tile.x[item / kPiecesPerRow][kPiece * (item % kPiecesPerRow)]) = pieces.x[i];
  }
}

__device__ __forceinline__ uint32_t load_word(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// d = A (16 x 16) * B (16 x 8), from a zero accumulator; fragments as in the file comment.
template <bool kBf16>
__device__ __forceinline__ void mma_k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const float zero = 0.0f;
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(zero));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(zero));
  }
#endif
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads, 2)
    half_mma_kernel(const uint16_t* __restrict__ w, int n_in, int n_out, const uint16_t* __restrict__ x,
                    int n_tokens, float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  __shared__ HalfTile tile;
  const WarpPlace place = warp_place();
  const int g = place.g, q = place.q;
  const bool w_aligned = reinterpret_cast<uintptr_t>(w) % 16 == 0;
  const bool x_aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;

  float acc[kRowTiles][kTokenTiles][4] = {};

  StepPieces pieces;
  load_step(pieces, w, n_out, x, n_tokens, n_in, place.row0, place.token0, 0, w_aligned, x_aligned);
  for (int k0 = 0; k0 < n_in; k0 += kTileK) {
    __syncthreads();  // every warp is done with the previous step's tile
    store_step(tile, pieces);
    __syncthreads();  // the tile is complete
    if (k0 + kTileK < n_in) {  // the next step's loads are in flight while this one is computed
      load_step(pieces, w, n_out, x, n_tokens, n_in, place.row0, place.token0, k0 + kTileK, w_aligned,
                x_aligned);
    }
    const int n_k16 = (min(kTileK, n_in - k0) + 15) / 16;  // the last may hold 8 staged zeros
    for (int s = 0; s < n_k16; ++s) {
      const int kk = 16 * s + 2 * q;
      uint32_t b[kTokenTiles][2];
#pragma unroll
      for (int n = 0; n < kTokenTiles; ++n) {
        const uint16_t* p = &tile.x[place.warp_token + 8 * n + g][kk];
        b[n][0] = load_word(p);
        b[n][1] = load_word(p + 8);
      }
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        const uint16_t* p = &tile.w[place.warp_row + 16 * m + g][kk];
        const uint32_t a[4] = {load_word(p), load_word(p + 8 * kStride), load_word(p + 8),
                               load_word(p + 8 * kStride + 8)};
#pragma unroll
        for (int n = 0; n < kTokenTiles; ++n) {
          float d[4];
          mma_k16<kBf16>(d, a, b[n]);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[m][n][i] = __fadd_rn(acc[m][n][i], d[i]);
        }
      }
    }
  }

  store_outputs(acc, place, n_out, n_tokens, y);
#endif
}

template <bool kBf16>
void launch(cudaStream_t stream, const uint16_t* w, int64_t n_in, int64_t n_out, const uint16_t* x,
            int64_t n_tokens, float* y) {
  require_sm80(reinterpret_cast<const void*>(half_mma_kernel<kBf16>), "cuda::matmul_half");
  half_mma_kernel<kBf16><<<grid(n_out, n_tokens), kThreads, 0, stream>>>(w, int(n_in), int(n_out), x, int(n_tokens), y);
  SPARROW_CUDA_CHECK_LAUNCH();
}

}  // namespace

void matmul_half(cudaStream_t stream, TensorType type, const uint16_t* w, int64_t n_in, int64_t n_out,
                 const uint16_t* x, int64_t n_tokens, float* y) {
  if (type != TensorType::F16 && type != TensorType::BF16) {
    throw Error("cuda::matmul_half: " + tensor_type_name(type) + " is not a 16-bit float type");
  }
  if (n_in <= 0 || n_in % 8 != 0 || n_in > INT_MAX || n_out <= 0 || n_out > INT_MAX || n_tokens < 0 ||
      (n_tokens + kTileTokens - 1) / kTileTokens > kMaxTokenTiles) {
    throw Error("cuda::matmul_half: shape " + std::to_string(n_in) + " x " + std::to_string(n_out) + " for " +
                std::to_string(n_tokens) + " tokens out of range (n_in a positive multiple of 8)");
  }
  if (n_tokens == 0) return;
  if (w == nullptr || x == nullptr || y == nullptr) throw Error("cuda::matmul_half: null pointer");
  if (type == TensorType::BF16) {
    launch<true>(stream, w, n_in, n_out, x, n_tokens, y);
  } else {
    launch<false>(stream, w, n_in, n_out, x, n_tokens, y);
  }
}

}  // namespace sparrow::cuda
