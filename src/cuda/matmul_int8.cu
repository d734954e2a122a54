// Products on 8-bit codes (matmul_int8.h) for the block weight types of formats/weight_int8.h: the decode GEMV
// (below, "Decode") and the tensor-core prefill GEMM.
//
// GEMM launch: grid (ceil(n_out / 128), ceil(n_tokens / 64)), 256 threads (8 warps), the tile of mma_tile.cuh: a
// CTA computes 128 output rows x 64 tokens, walking n_in in steps of kTileK = 128 elements (the last step may be
// shorter: n_in is only a multiple of the block, 32 for the legacy types). Per step:
//  - staging: each thread decodes whole weight sub-blocks straight from global memory through
//    WeightInt8<T>::decode_sub_block into shared memory (w_codes[row][k], int8, plus w_scale / w_min per
//    sub-block and row); the activations' codes are copied with 16-byte loads (x_codes[token][k]), and each
//    (token, sub-block) gets its activation scale and offset term (x_scale / x_offset). Rows past n_out and
//    tokens past n_tokens are staged as zeros and never written out.
//  - compute: warp w owns rows 32 (w % 4) .. + 32 and tokens 32 (w / 4) .. + 32 of the tile: 2 x 4 mma tiles
//    of 16 rows x 8 tokens. For every sub-block in order, one mma per tile over the sub-block's k range
//    (m16n8k32 for 32-element sub-blocks, m16n8k16 for 16-element ones) gives its exact int32 dot products;
//    they are then scaled and added to fp32 accumulators (below). The fp32 sum of an output is therefore the
//    per-sub-block terms added in sub-block order, the same order for every tile shape and token count.
// Shared memory: 128 and 64 rows of 144 bytes (128 codes + 16 bytes of padding, so that the 8 rows a fragment
// load touches start in 8 different 4-bank groups) plus the per-sub-block floats: 33 KiB (32-element
// sub-blocks) or 39 KiB (16-element), static.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32 / mma.m16n8k16", integer types), for lane
// = 4 g + q (g = groupID 0..7, q = threadID_in_group 0..3); A is 16 rows x k (row-major: weight rows, codes
// along k), B is k x 8 (column-major: a token's codes along k), C/D 16 x 8 int32:
//   m16n8k32  A: a0 = A[g][4q .. 4q+3], a1 = A[g+8][4q ..], a2 = A[g][16+4q ..], a3 = A[g+8][16+4q ..]
//             B: b0 = B[4q .. 4q+3][g], b1 = B[16+4q .. 16+4q+3][g]
//   m16n8k16  A: a0 = A[g][4q .. 4q+3], a1 = A[g+8][4q ..];  B: b0 = B[4q .. 4q+3][g]
//   C/D:      c0 = C[g][2q], c1 = C[g][2q+1], c2 = C[g+8][2q], c3 = C[g+8][2q+1]
// Four consecutive k of one row (of A) or one token (of B) are one 32-bit word of the staged tiles.
//
// int32 to float: the mma's accumulator input is the bit pattern of 1.5 * 2^23 (0x4B400000). A sub-block's dot
// product d satisfies |d| <= 32 * 128 * 128 = 2^19 < 2^22, so the int32 result, read as a float, is exactly
// 1.5 * 2^23 + d, and one exact float subtraction recovers d: no int-to-float conversion instruction (a
// quarter-rate one) per accumulator per sub-block.
#include "cuda/matmul_int8.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/dependent_launch.cuh"
#include "cuda/gelu.cuh"
#include "cuda/last_cta.cuh"
#include "cuda/mma_tile.cuh"
#include "cuda/quantize_units.cuh"
#include "cuda/row_math.cuh"
#include "cuda/stage_bytes.cuh"
#include "formats/weight_formats.h"
#include "formats/weight_int8.h"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

using formats::SubBlockScale;
using formats::WeightInt8;

using namespace mma_tile;

constexpr int kTileK = 128;               // elements of n_in per staging step: whole sub-blocks of 16 or 32
constexpr int kCodeStride = kTileK + 16;  // bytes per staged row of codes (see the bank note above)

constexpr int kFloatBiasBits = 0x4B400000;  // the float 1.5 * 2^23
constexpr float kFloatBias = 12582912.0f;

template <TensorType T>
constexpr int kUnitElements = formats::WeightBlock<T>::kUnitElements;
// Elements per activation scale for T's activation format (32 or 256).
template <TensorType T>
constexpr int kActivationGroup = formats::activation_group(formats::find_weight_format(T)->activation);

// One staging step's operands. Per-sub-block arrays are [sub-block][row or token], so that the 8 rows (or 4
// token pairs) a warp's lanes read for one sub-block are consecutive words.
template <int kSubBlock>
struct MmaTile {
  static constexpr int kSubBlocks = kTileK / kSubBlock;
  alignas(16) int8_t w_codes[kTileRows][kCodeStride];
  alignas(16) int8_t x_codes[kTileTokens][kCodeStride];
  float w_scale[kSubBlocks][kTileRows];
  float w_min[kSubBlocks][kTileRows];
  float x_scale[kSubBlocks][kTileTokens];
  float x_offset[kSubBlocks][kTileTokens];  // the activations' term for the weight minimum
};
static_assert(sizeof(MmaTile<16>) <= 48 * 1024 && sizeof(MmaTile<32>) <= 48 * 1024, "static shared memory");
static_assert(kTileK % 32 == 0 && kCodeStride % 16 == 0, "whole sub-blocks, 16-byte aligned rows");

__device__ __forceinline__ uint32_t load_word(const int8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Four codes as one little-endian word: element 4i + j in byte j.
__device__ __forceinline__ uint32_t pack_codes(const int8_t* c) {
  return uint32_t(uint8_t(c[0])) | (uint32_t(uint8_t(c[1])) << 8) | (uint32_t(uint8_t(c[2])) << 16) |
         (uint32_t(uint8_t(c[3])) << 24);
}

// d = A (16 x 32 codes) * B (32 x 8 codes) + 1.5 * 2^23 as int32 bits; fragments as in the file comment.
__device__ __forceinline__ void mma_k32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(kFloatBiasBits));
#endif
}

// d = A (16 x 16 codes) * B (16 x 8 codes) + 1.5 * 2^23 as int32 bits.
__device__ __forceinline__ void mma_k16(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b[0]), "r"(kFloatBiasBits));
#endif
}

// The activations' scale for the sub-block at element e of token `token` (n_in elements per token), and, for types
// with a minimum, its offset term (matmul_int8.h: x_sum).
struct ActivationTerms {
  float scale, offset;
};

// 16 bytes of activation codes: through the read-only cache from global memory, plainly from shared memory
// (which the read-only path cannot address).
template <bool kShared>
__device__ __forceinline__ uint4 load_codes16(const int8_t* p) {
  const uint4* v = reinterpret_cast<const uint4*>(p);
  if constexpr (kShared) {
    return *v;
  } else {
    return __ldg(v);
  }
}

template <TensorType T, bool kShared = false>
__device__ __forceinline__ ActivationTerms activation_terms(const int8_t* __restrict__ xq,
                                                               const float* __restrict__ x_scale,
                                                               const float* __restrict__ x_sum32, int64_t token,
                                                               int n_in, int e) {
  using W = WeightInt8<T>;
  constexpr int kSub = W::kSubBlock, kGroup = kActivationGroup<T>;
  const float scale = x_scale[token * (n_in / kGroup) + e / kGroup];
  float offset = 0.0f;
  if constexpr (W::kHasMin) {
    if constexpr (kSub == 32) {
      offset = x_sum32[token * (n_in / 32) + e / 32];  // ggml's per-32 term (activation_sum32)
    } else {
      // No per-16 sums are stored: scale times the sum of the 16 codes, as ggml forms Q8_K bsums' term.
      const uint4 v = load_codes16<kShared>(xq + token * n_in + e);
      const int ones = 0x01010101;
      int sum = __dp4a(int(v.x), ones, 0);
      sum = __dp4a(int(v.y), ones, sum);
      sum = __dp4a(int(v.z), ones, sum);
      sum = __dp4a(int(v.w), ones, sum);
      offset = __fmul_rn(scale, float(sum));
    }
  }
  return {scale, offset};
}

// Decodes sub-blocks [0, n_sub) of the step at element k0 of rows row0 .. row0 + kTileRows into the tile.
template <TensorType T>
__device__ __forceinline__ void stage_weights(MmaTile<WeightInt8<T>::kSubBlock>& tile, const uint8_t* __restrict__ w,
                                              size_t row_bytes, int64_t row0, int n_out, int k0, int n_sub) {
  using W = WeightInt8<T>;
  using Unit = typename W::Unit;
  constexpr int kSub = W::kSubBlock, kSubBlocks = kTileK / kSub;
  // Consecutive threads take consecutive sub-blocks of one row: neighbouring addresses in global memory.
  for (int item = int(threadIdx.x); item < kTileRows * kSubBlocks; item += kThreads) {
    const int r = item / kSubBlocks, s = item % kSubBlocks;
    if (s >= n_sub) continue;
    int8_t codes[kSub];
    SubBlockScale scale{0.0f, 0.0f};
    const int64_t row = row0 + r;
    if (row < n_out) {
      const int e = k0 + s * kSub;  // the sub-block's first element in the row
      const Unit* units = reinterpret_cast<const Unit*>(w + size_t(row) * row_bytes);
      scale = W::decode_sub_block(units[e / kUnitElements<T>], (e % kUnitElements<T>) / kSub, codes);
    } else {
#pragma unroll
      for (int j = 0; j < kSub; ++j) codes[j] = 0;
    }
    uint4* dst = reinterpret_cast<uint4*>(&tile.w_codes[r][s * kSub]);
#pragma unroll
    for (int i = 0; i < kSub / 16; ++i) {
      dst[i] = make_uint4(pack_codes(codes + 16 * i), pack_codes(codes + 16 * i + 4), pack_codes(codes + 16 * i + 8),
                          pack_codes(codes + 16 * i + 12));
    }
    tile.w_scale[s][r] = scale.scale;
    tile.w_min[s][r] = scale.min;
  }
}

// Copies the codes of the step's n_sub sub-blocks for tokens token0 .. token0 + kTileTokens, and their scales
// and offset terms, into the tile.
template <TensorType T>
__device__ __forceinline__ void stage_activations(MmaTile<WeightInt8<T>::kSubBlock>& tile,
                                                  const int8_t* __restrict__ xq, const float* __restrict__ x_scale,
                                                  const float* __restrict__ x_sum32, int n_in, int n_tokens,
                                                  int token0, int k0, int n_sub) {
  using W = WeightInt8<T>;
  constexpr int kSub = W::kSubBlock, kSubBlocks = kTileK / kSub;
  constexpr int kPieces = kTileK / 16;  // 16-byte pieces of a token's step
  const int valid_pieces = n_sub * kSub / 16;
  for (int item = int(threadIdx.x); item < kTileTokens * kPieces; item += kThreads) {
    const int t = item / kPieces, c = item % kPieces;
    if (c >= valid_pieces) continue;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (token0 + t < n_tokens) v = __ldg(reinterpret_cast<const uint4*>(xq + int64_t(token0 + t) * n_in + k0) + c);
    *reinterpret_cast<uint4*>(&tile.x_codes[t][16 * c]) = v;
  }
  for (int item = int(threadIdx.x); item < kTileTokens * kSubBlocks; item += kThreads) {
    const int s = item / kTileTokens, t = item % kTileTokens;
    if (s >= n_sub) continue;
    ActivationTerms terms{0.0f, 0.0f};
    if (token0 + t < n_tokens) terms = activation_terms<T>(xq, x_scale, x_sum32, token0 + t, n_in, k0 + s * kSub);
    tile.x_scale[s][t] = terms.scale;
    tile.x_offset[s][t] = terms.offset;
  }
}

template <TensorType T>
__global__ void __launch_bounds__(kThreads, 2)
    int8_mma_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n_in, int n_out,
                    const int8_t* __restrict__ xq, const float* __restrict__ x_scale,
                    const float* __restrict__ x_sum32, int n_tokens, float* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using W = WeightInt8<T>;
  constexpr int kSub = W::kSubBlock;
  static_assert(kSub == 16 || kSub == 32, "m16n8k16 or m16n8k32");
  static_assert(kSub * W::kMaxAbsCode * 128 < (1 << 22), "dot products stay exact in the float-bias conversion");
  __shared__ MmaTile<kSub> tile;
  const WarpPlace place = warp_place();
  const int g = place.g, q = place.q, warp_row = place.warp_row, warp_token = place.warp_token;
  const int64_t row0 = place.row0;
  const int token0 = place.token0;

  float acc[kRowTiles][kTokenTiles][4] = {};

  for (int k0 = 0; k0 < n_in; k0 += kTileK) {
    const int n_sub = min(kTileK, n_in - k0) / kSub;  // the same for the whole CTA
    __syncthreads();  // every warp is done with the previous step's tile
    stage_weights<T>(tile, w, row_bytes, row0, n_out, k0, n_sub);
    stage_activations<T>(tile, xq, x_scale, x_sum32, n_in, n_tokens, token0, k0, n_sub);
    __syncthreads();  // the tile is complete
    for (int s = 0; s < n_sub; ++s) {
      const int kk = s * kSub;
      uint32_t b[kTokenTiles][2];
#pragma unroll
      for (int n = 0; n < kTokenTiles; ++n) {
        const int8_t* p = &tile.x_codes[warp_token + 8 * n + g][kk + 4 * q];
        b[n][0] = load_word(p);
        b[n][1] = kSub == 32 ? load_word(p + 16) : 0u;
      }
      int d[kRowTiles][kTokenTiles][4];
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        const int8_t* p = &tile.w_codes[warp_row + 16 * m + g][kk + 4 * q];
        uint32_t a[4];
        a[0] = load_word(p);
        a[1] = load_word(p + 8 * kCodeStride);
        a[2] = kSub == 32 ? load_word(p + 16) : 0u;
        a[3] = kSub == 32 ? load_word(p + 8 * kCodeStride + 16) : 0u;
#pragma unroll
        for (int n = 0; n < kTokenTiles; ++n) {
          if constexpr (kSub == 32) {
            mma_k32(d[m][n], a, b[n]);
          } else {
            mma_k16(d[m][n], a, b[n]);
          }
        }
      }
      // This sub-block's terms: thread holds rows g, g + 8 of each row tile and tokens 2q, 2q + 1 of each
      // token tile (c0..c3 as in the file comment).
      float xs[kTokenTiles][2], xo[kTokenTiles][2];
#pragma unroll
      for (int n = 0; n < kTokenTiles; ++n) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = warp_token + 8 * n + 2 * q + j;
          xs[n][j] = tile.x_scale[s][t];
          xo[n][j] = W::kHasMin ? tile.x_offset[s][t] : 0.0f;
        }
      }
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp_row + 16 * m + g + 8 * h;
          const float ws = tile.w_scale[s][r], wm = tile.w_min[s][r];
#pragma unroll
          for (int n = 0; n < kTokenTiles; ++n) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int i = 2 * h + j;
              const float dot = __fsub_rn(__int_as_float(d[m][n][i]), kFloatBias);  // exact
              float sum = fmaf(__fmul_rn(ws, xs[n][j]), dot, acc[m][n][i]);
              if constexpr (W::kHasMin) sum = fmaf(wm, xo[n][j], sum);
              acc[m][n][i] = sum;
            }
          }
        }
      }
    }
  }

  store_outputs(acc, place, n_out, n_tokens, y);
#endif
}

// ---------------------------------------------------------------------------------------------------------
// Decode: the same sum on CUDA cores, one row at a time for each group of warps.
//
// The grid holds at most the CTAs (kGemvWarps warps each) that the GPU keeps resident at once. A CTA's warps form
// groups of `slices` warps (1, 2 or 4: gemv_slices), and group g of the grid's G groups takes rows g, g + G, g +
// 2G, ... of the launch's matrices (counted one matrix after another), so that at any moment neighbouring warps
// read neighbouring rows. Each row is cut into steps of at most kGemvUnits<T> units (about 2 KiB), and warp k of
// a group walks steps k, k + slices, ... of every row: long rows are read by several warps at once, so that all
// of a row's steps can be in flight together. A warp's work is a stream of steps, which pass through a ring of
// kGemvStages shared-memory buffers filled by cp.async: while the warp computes step i, the copies of steps
// i + 1 .. i + kGemvStages - 1 are in flight, so that a warp's reads of its next rows overlap its arithmetic
// instead of every warp waiting on one row's loads and then exiting. Per step, lane l takes sub-blocks l, l + 32,
// ...: decoded from shared memory four codes per word, dp4a against each token's activation codes (read from
// global memory: every warp reads the same few KiB, which stay in L1), the sub-block's term scaled into the
// lane's fp32 sum per token. After its last step of a row a shuffle tree adds the lanes' sums; with several
// slices, the group's first warp then adds the others' sums to its own in slice order (through shared memory,
// after a barrier of the group's warps). Then the epilogue (GemvEpilogue) writes them, or, for a gated product,
// gelu of them times a row of a buffer or, paired, keeps the gate's sums until the same warps have walked the up
// matrix's row (rows g, g + G, ... are then pairs of rows).

constexpr int kGemvWarps = 4;
constexpr int kGemvStages = 3;
constexpr int kGemvStepBytes = 2048;

template <TensorType T>
constexpr int kGemvUnits = int(sizeof(typename WeightInt8<T>::Unit)) >= kGemvStepBytes
                               ? 1
                               : kGemvStepBytes / int(sizeof(typename WeightInt8<T>::Unit));
// One staging buffer: a step, shifted to the row's address modulo 16 (the 16-byte granules covering it, as
// stage_granules_async copies them), in 16-byte words, with room for load_words to read a word past its end.
template <TensorType T>
constexpr int kGemvStagingWords = (kGemvUnits<T> * int(sizeof(typename WeightInt8<T>::Unit)) + 15 + 15) / 16;

// Steps of a row of n_in elements (kGemvUnits<T> units each, the last maybe fewer).
template <TensorType T>
__host__ __device__ constexpr int gemv_steps_per_row(int n_in) {
  return (n_in / kUnitElements<T> + kGemvUnits<T> - 1) / kGemvUnits<T>;
}

// The dot product of kSub weight codes with kSub activation codes (16-byte aligned).
template <int kSub, bool kShared>
__device__ __forceinline__ int dot_codes(const uint32_t (&w)[kSub / 4], const int8_t* __restrict__ x) {
  int dot = 0;
#pragma unroll
  for (int i = 0; i < kSub / 16; ++i) {
    const uint4 v = load_codes16<kShared>(x + 16 * i);
    dot = __dp4a(int(w[4 * i]), int(v.x), dot);
    dot = __dp4a(int(w[4 * i + 1]), int(v.y), dot);
    dot = __dp4a(int(w[4 * i + 2]), int(v.z), dot);
    dot = __dp4a(int(w[4 * i + 3]), int(v.w), dot);
  }
  return dot;
}

// What a GEMV launch writes for an output (GatedProduct): the row's sum; or, with a gelu table, gelu(sum) times
// the paired matrix's sum for the same row (paired: the launch's two matrices, gate then up, walked a row of
// each at a time by one warp, written to the first's y) or times mul[t * mul_stride + row]. With residual_done,
// the CTA that finishes last then runs the residual step (Backend::matmul_residual) on the one matrix's y.
struct GemvEpilogue {
  const uint16_t* gelu_table = nullptr;  // null: the plain sum
  bool paired = false;
  const float* mul = nullptr;
  int64_t mul_stride = 0;
  int32_t* residual_done = nullptr;  // zero before the launch, and after it (last_cta_to_finish)
  ResidualRows residual{};
};

// The matrices of one GEMV launch (all of one type and n_in, multiplied with the same activations): rows
// [first_row[m], first_row[m] + n_out[m]) of the launch's total_rows are matrix m's.
struct GemvMatrices {
  const uint8_t* w[kMaxGemvMatrices];
  float* y[kMaxGemvMatrices];
  int n_out[kMaxGemvMatrices];
  int first_row[kMaxGemvMatrices];
  int count, total_rows;
  GemvEpilogue epilogue;
};

// The launch's work items, which warps take in turn: its rows, or, paired, its pairs of rows.
__host__ __device__ inline int gemv_items(const GemvMatrices& matrices) {
  return matrices.epilogue.paired ? matrices.n_out[0] : matrices.total_rows;
}

// n little-endian words from the bytes at p (shared memory, any alignment): the aligned words around them,
// funnel-shifted into place. Reads up to 4 bytes past p + 4 n (the staging buffers leave that much room).
template <int N>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&words)[N]) {
  const uint32_t* aligned = reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
  const unsigned shift = unsigned(reinterpret_cast<uintptr_t>(p) & 3) * 8;
  uint32_t v[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) v[i] = aligned[i];
#pragma unroll
  for (int i = 0; i < N; ++i) words[i] = __funnelshift_r(v[i], v[i + 1], shift);
}

// Sub-block s of a staged unit: its codes four to a word (element 4i + j in byte j of words[i]) and its scale and
// min, the same as WeightInt8<T>::decode_sub_block gives. The common types are unpacked a word at a time (the
// bit layouts of formats/weight_int8.h); byte by byte, a warp's shared-memory loads were what limited the GEMV.
template <TensorType T>
__device__ __forceinline__ SubBlockScale staged_sub_block(const uint8_t* unit, int s,
                                                          uint32_t (&words)[WeightInt8<T>::kSubBlock / 4]) {
  using Unit = typename WeightInt8<T>::Unit;
  const Unit& b = *reinterpret_cast<const Unit*>(unit);
  if constexpr (T == TensorType::Q8_0) {
    load_words(reinterpret_cast<const uint8_t*>(b.qs), words);
    return {formats::f16_to_f32(b.d), 0.0f};
  } else if constexpr (T == TensorType::Q4_0) {  // low nibbles: elements 0..15, high: 16..31; code = nibble - 8
    uint32_t q[4];
    load_words(b.qs, q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      words[i] = __vsub4(q[i] & 0x0F0F0F0Fu, 0x08080808u);
      words[i + 4] = __vsub4((q[i] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
    return {formats::f16_to_f32(b.d), 0.0f};
  } else if constexpr (T == TensorType::Q4_K) {  // the low (s even) or high nibbles of qs[32 (s / 2) ..]
    uint32_t q[8];
    load_words(b.qs + 32 * (s / 2), q);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) words[i] = (q[i] >> shift) & 0x0F0F0F0Fu;
    uint8_t sc, mn;
    formats::unpack_scale_min_k4(b.scales, s, &sc, &mn);
    return {formats::f16_to_f32(b.d) * float(sc), -(formats::f16_to_f32(b.dmin) * float(mn))};
  } else if constexpr (T == TensorType::Q6_K) {  // a nibble of ql, two bits of qh above it; code = value - 32
    const int half = s / 8, k = (s % 8) / 2, l0 = 16 * (s & 1);
    uint32_t low[4], high[4];
    load_words(b.ql + 64 * half + 32 * (k & 1) + l0, low);
    load_words(b.qh + 32 * half + l0, high);
    const int low_shift = k < 2 ? 0 : 4, high_shift = 2 * k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t value = ((low[i] >> low_shift) & 0x0F0F0F0Fu) | (((high[i] >> high_shift) & 0x03030303u) << 4);
      words[i] = __vsub4(value, 0x20202020u);
    }
    return {formats::f16_to_f32(b.d) * float(b.scales[s]), 0.0f};
  } else {
    int8_t codes[WeightInt8<T>::kSubBlock];
    const SubBlockScale scale = WeightInt8<T>::decode_sub_block(b, s, codes);
#pragma unroll
    for (int i = 0; i < WeightInt8<T>::kSubBlock / 4; ++i) words[i] = pack_codes(codes + 4 * i);
    return scale;
  }
}

// a[m] without indexing the kernel's parameters at run time (which would copy them to the stack).
template <typename V>
__device__ __forceinline__ V pick(const V (&a)[kMaxGemvMatrices], int m) {
  V v = a[0];
#pragma unroll
  for (int k = 1; k < kMaxGemvMatrices; ++k) v = m == k ? a[k] : v;
  return v;
}

// Where a warp's step lies: matrix m, its row `row` and units [u0, u0 + n) of it, and whether it ends the row.
struct GemvStep {
  int m, row, u0, n;
  bool last;
};

// A warp's share of a GEMV launch: the items it takes part in (first_item, then every item_stride), and of each
// of their rows the steps slice, slice + slices, ... (own_steps of them).
struct GemvWalk {
  int first_item, item_stride;
  int slice, slices;
  int own_steps;  // per row
};

// A position in a warp's walk, moved one step at a time rather than found afresh from the step number, which
// takes integer divisions. A warp walks an item's rows one after another (paired: the gate's row, then the
// up's), its own steps of each.
struct GemvCursor {
  int item;  // the launch's item (row, or pair of rows)
  int part;  // paired: 0 for the gate's row, 1 for the up's
  int own;   // the warp's step of the row, 0 .. own_steps - 1

  __device__ __forceinline__ void advance(const GemvWalk& walk, bool paired) {
    if (++own < walk.own_steps) return;
    own = 0;
    if (paired && part == 0) {
      part = 1;
    } else {
      part = 0;
      item += walk.item_stride;
    }
  }
};

// The step at a cursor.
template <TensorType T>
__device__ __forceinline__ GemvStep locate_gemv_step(const GemvMatrices& matrices, const GemvWalk& walk, int n_units,
                                                     const GemvCursor& at) {
  const int step = walk.slice + at.own * walk.slices;
  int m = at.part, row = at.item;
  if (!matrices.epilogue.paired) {
    int m_first = 0;
#pragma unroll
    for (int k = 1; k < kMaxGemvMatrices; ++k) {
      if (k < matrices.count && at.item >= matrices.first_row[k]) m = k, m_first = matrices.first_row[k];
    }
    row = at.item - m_first;
  }
  const int u0 = step * kGemvUnits<T>;
  return {m, row, u0, min(kGemvUnits<T>, n_units - u0), at.own == walk.own_steps - 1};
}

// Waits for the `count` threads of group `group` (0 .. kGemvWarps - 1), on barrier 1 + group (0 is
// __syncthreads'). The ids are constants, so the kernel holds 5 barriers, not all 16.
__device__ __forceinline__ void group_barrier(int group, int count) {
  switch (group) {
    case 0: asm volatile("bar.sync 1, %0;\n" ::"r"(count) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;\n" ::"r"(count) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;\n" ::"r"(count) : "memory"); break;
    default: asm volatile("bar.sync 4, %0;\n" ::"r"(count) : "memory"); break;
  }
}

// After a group's warps have each summed their slice of a row (every lane holding the warp's sums): the group's
// first warp adds the other slices' sums to its own, in slice order, and returns true; the others return false.
// Two sets of shared sums alternate from row to row, so a set is written again only after the barrier of the
// row in between, which the first warp reaches after reading it.
template <int kTokens>
__device__ __forceinline__ bool add_slices(float (&acc)[kTokens], int n_tokens, const GemvWalk& walk,
                                           float (&sums)[2][kGemvWarps][kTokens], int& set) {
  const int warp = int(threadIdx.x) / kWarp, group = warp / walk.slices;
  if (threadIdx.x % kWarp == 0) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t)
      if (t < n_tokens) sums[set][warp][t] = acc[t];
  }
  group_barrier(group, walk.slices * kWarp);
  const bool first = walk.slice == 0;
  if (first) {
    for (int k = 1; k < walk.slices; ++k) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        if (t < n_tokens) acc[t] += sums[set][warp + k][t];
    }
  }
  set ^= 1;
  return first;
}

// A GEMV launch's activations: their codes as quantize_activations writes them (q, scale, sum32), or, where the
// kernel quantizes them itself, the floats x.
struct GemvActivations {
  const float* x;
  const int8_t* q;
  const float* scale;
  const float* sum32;
};

// Shared memory for n_tokens x n_in activations quantized in the GEMV's prologue: the codes, the groups' scales,
// the 32-element sums (the layout of ActivationOutputs, tokens one after another), 16-byte aligned.
template <TensorType T>
constexpr int gemv_quantized_bytes(int64_t n_in, int64_t n_tokens) {
  const int64_t n = n_in * n_tokens;
  return int((n + 4 * (n / kActivationGroup<T>) + 4 * (n / 32) + 15) / 16 * 16);
}
constexpr int kMaxGemvQuantizedBytes = 20 * 1024;  // within the 48 KiB a CTA has without opting in

template <TensorType T, bool kQuantizes, int kTokens>
__global__ void __launch_bounds__(kGemvWarps * kWarp)
    gemv_int8_kernel(GemvMatrices matrices, size_t row_bytes, int n_in, GemvActivations activations, int n_tokens,
                     int slices) {
  using W = WeightInt8<T>;
  using Unit = typename W::Unit;
  constexpr int kSub = W::kSubBlock, kUnitSubBlocks = W::kSubBlocks;
  __shared__ uint4 staging[kGemvWarps][kGemvStages][kGemvStagingWords<T>];
  extern __shared__ uint4 quantized[];  // kQuantizes: gemv_quantized_bytes
  __shared__ float slice_sums[2][kGemvWarps][kTokens];  // add_slices
  __shared__ GemvStep staged_steps[kGemvWarps][kGemvStages];     // where the step in each buffer lies
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int groups = kGemvWarps / slices, items = gemv_items(matrices);
  const int n_units = n_in / kUnitElements<T>;
  const int steps_per_row = gemv_steps_per_row<T>(n_in);
  GemvWalk walk;
  walk.first_item = int(blockIdx.x) * groups + warp / slices;
  walk.item_stride = int(gridDim.x) * groups;
  walk.slice = warp % slices;
  walk.slices = slices;
  walk.own_steps = (steps_per_row - walk.slice + slices - 1) / slices;  // >= 1: slices <= steps_per_row
  const bool has_rows = walk.first_item < items;  // the same for a group's warps
  const bool residual = matrices.epilogue.residual_done != nullptr;  // every thread stays to the end
  const int n_items = has_rows ? (items - walk.first_item + walk.item_stride - 1) / walk.item_stride : 0;
  const int n_steps = n_items * walk.own_steps * (matrices.epilogue.paired ? 2 : 1);

  // Step i's bytes go to buffer i % kGemvStages, at the offset of its source modulo 16.
  auto buffer = [&](int i) { return reinterpret_cast<uint8_t*>(staging[warp][i % kGemvStages]); };
  auto staged = [&](int i, const uint8_t* src) { return buffer(i) + (reinterpret_cast<uintptr_t>(src) & 15); };
  auto source = [&](const GemvStep& at) {
    return pick(matrices.w, at.m) + size_t(at.row) * row_bytes + size_t(at.u0) * sizeof(Unit);
  };
  // Every lane commits one group per step number, empty past the last step, so that waiting for all but the
  // newest kGemvStages - 1 groups always means step i's. Steps are issued in order, at the cursor, and where
  // each lies is kept beside its buffer for the computation.
  const bool paired = matrices.epilogue.paired;
  GemvCursor cursor{walk.first_item, 0, 0};
  auto issue = [&](int i) {
    if (i < n_steps) {
      const GemvStep at = locate_gemv_step<T>(matrices, walk, n_units, cursor);
      cursor.advance(walk, paired);
      if (lane == 0) staged_steps[warp][i % kGemvStages] = at;
      const uint8_t* src = source(at);
      const uint8_t* matrix = pick(matrices.w, at.m);
      stage_granules_async(buffer(i), src, at.n * int(sizeof(Unit)),
                           matrix, matrix + size_t(pick(matrices.n_out, at.m)) * row_bytes, lane);
    }
    commit_copies();
  };
  if (has_rows) {
    for (int i = 0; i + 1 < kGemvStages; ++i) issue(i);
  }
  // Only the weights (which nothing writes) are touched above: with a dependent launch they stream in while the
  // kernel before this one finishes writing the activations.
  wait_for_predecessor();
  // Warps never synchronize with each other, but for the prologue and the residual step.
  if (!kQuantizes && !has_rows && !residual) return;
  // The activations, quantized here while the first steps' copies are in flight.
  const int8_t* __restrict__ xq = activations.q;
  const float* __restrict__ x_scale = activations.scale;
  const float* __restrict__ x_sum32 = activations.sum32;
  if constexpr (kQuantizes) {
    const int n = n_tokens * n_in;
    int8_t* q = reinterpret_cast<int8_t*>(quantized);
    float* scale = reinterpret_cast<float*>(q + n);
    float* sum32 = scale + n / kActivationGroup<T>;
    quantize_units<formats::find_weight_format(T)->activation>(
        activations.x, n / 32, ActivationOutputs{.q = q, .scale = scale, .sum32 = sum32}, threadIdx.x, blockDim.x);
    __syncthreads();
    if (!has_rows && !residual) return;
    xq = q, x_scale = scale, x_sum32 = sum32;
  }

  float acc[kTokens], gate[kTokens];  // gate: a pair's first sum, paired
#pragma unroll
  for (int t = 0; t < kTokens; ++t) acc[t] = 0.0f;
  int slice_set = 0;
  const GemvEpilogue& epilogue = matrices.epilogue;
  for (int i = 0; i < n_steps; ++i) {
    __syncwarp();  // every lane is done with step i - 1, whose buffer step i + kGemvStages - 1 refills
    issue(i + kGemvStages - 1);
    wait_copies<kGemvStages - 1>();  // this lane's copies of step i have landed
    __syncwarp();                    // and so have every lane's
    const GemvStep at = staged_steps[warp][i % kGemvStages];
    const uint8_t* units = staged(i, source(at));
    for (int s = lane; s < at.n * kUnitSubBlocks; s += kWarp) {
      uint32_t words[kSub / 4];
      const SubBlockScale ws =
          staged_sub_block<T>(units + (s / kUnitSubBlocks) * sizeof(Unit), s % kUnitSubBlocks, words);
      const int e = at.u0 * kUnitElements<T> + s * kSub;  // the sub-block's first element in the row
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t >= n_tokens) break;
        const float dot = float(dot_codes<kSub, kQuantizes>(words, xq + int64_t(t) * n_in + e));  // |dot| < 2^24
        const ActivationTerms x = activation_terms<T, kQuantizes>(xq, x_scale, x_sum32, t, n_in, e);
        float sum = fmaf(__fmul_rn(ws.scale, x.scale), dot, acc[t]);
        if constexpr (W::kHasMin) sum = fmaf(ws.min, x.offset, sum);
        acc[t] = sum;
      }
    }
    if (!at.last) continue;
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t >= n_tokens) break;
      for (int offset = kWarp / 2; offset > 0; offset /= 2) acc[t] += __shfl_xor_sync(0xFFFFFFFFu, acc[t], offset);
    }
    const bool writes = slices == 1 || add_slices(acc, n_tokens, walk, slice_sums, slice_set);
    const bool gate_of_pair = paired && at.m == 0;  // kept until the up's row is done
    float* __restrict__ y = pick(matrices.y, paired ? 0 : at.m);
    const int n_out = pick(matrices.n_out, at.m);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t >= n_tokens) break;
      float out = acc[t];
      acc[t] = 0.0f;
      if (!writes) continue;
      if (gate_of_pair) {
        gate[t] = out;
        continue;
      }
      if (epilogue.gelu_table != nullptr) {  // the bits of gelu_mul (and mul_rows) after the plain product
        out = paired ? gelu_lookup(epilogue.gelu_table, gate[t]) * out
                              : gelu_lookup(epilogue.gelu_table, out) * epilogue.mul[t * epilogue.mul_stride + at.row];
      }
      if (lane == 0) y[int64_t(t) * n_out + at.row] = out;
    }
  }
  // The next kernel may start streaming its weights into the multiprocessors this grid leaves while the last CTA
  // runs the residual step (it waits for this grid before it reads the step's output).
  allow_dependents();
  if (residual && last_cta_to_finish(epilogue.residual_done, int(gridDim.x)))
    residual_step_by_cta(epilogue.residual, n_tokens);
}

// CTAs of gemv_int8_kernel<T, kQuantizes, kTokens> with up to `shared_bytes` of dynamic shared memory (at most
// kMaxGemvQuantizedBytes) that the current device keeps resident at once: the most one launch needs. Asked once
// per device and KiB of shared memory (rounded up, so that the answer holds for every size in that KiB).
template <TensorType T, bool kQuantizes, int kTokens>
int gemv_resident_ctas(int shared_bytes) {
  constexpr int kMaxDevices = 16, kKiB = 1024, kSizes = kMaxGemvQuantizedBytes / kKiB + 1;
  static std::atomic<int> known[kMaxDevices][kSizes];
  int device = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kMaxDevices) throw Error("cuda::matmul_int8: device ordinal " + std::to_string(device) + " too large");
  const int kib = (shared_bytes + kKiB - 1) / kKiB;
  std::atomic<int>& cached = known[device][kib];
  if (const int n = cached.load(std::memory_order_relaxed); n > 0) return n;
  int per_sm = 0, sms = 0;
  SPARROW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_int8_kernel<T, kQuantizes, kTokens>,
                                                                   kGemvWarps * kWarp, size_t(kib) * kKiB));
  SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int n = std::max(1, per_sm) * std::max(1, sms);
  cached.store(n, std::memory_order_relaxed);
  return n;
}

// Bytes per row of w; throws unless w, n_tokens and y fit matmul_int8 (matmul_int8.h).
template <TensorType T>
size_t checked_row_bytes(const WeightMatrix& w, int64_t n_tokens, const float* y) {
  using Unit = typename WeightInt8<T>::Unit;
  const std::string what = std::string("cuda::matmul_int8 (") + tensor_type_name(T) + ")";
  if (w.n_in <= 0 || w.n_out <= 0 || w.n_in % kUnitElements<T> != 0 || w.n_in > INT_MAX - kTileK ||
      w.n_out > INT_MAX - kTileRows) {
    throw Error(what + ": weight shape " + std::to_string(w.n_in) + " x " + std::to_string(w.n_out) +
                " does not fit (n_in a positive multiple of " + std::to_string(kUnitElements<T>) +
                ", both below 2^31)");
  }
  if (n_tokens < 0 || n_tokens > int64_t(kMaxTokenTiles) * kTileTokens) {
    throw Error(what + ": n_tokens " + std::to_string(n_tokens) + " out of range");
  }
  if (w.data == nullptr || y == nullptr) throw Error(what + ": null weights or output");
  if (reinterpret_cast<uintptr_t>(w.data) % alignof(Unit) != 0) {
    throw Error(what + ": weight data is not aligned to " + std::to_string(alignof(Unit)) + " bytes");
  }
  return size_t(w.n_in / kUnitElements<T>) * sizeof(Unit);
}

// Throws unless the activations fit matmul_int8 for type T: codes present and 16-byte aligned, or, where the
// GEMV quantizes them, 16-byte aligned floats.
template <TensorType T>
void check_activations(const GemvActivations& a) {
  const std::string what = std::string("cuda::matmul_int8 (") + tensor_type_name(T) + ")";
  if (a.x != nullptr) {
    if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0) throw Error(what + ": activations are not 16-byte aligned");
    return;
  }
  if (a.q == nullptr || a.scale == nullptr || (WeightInt8<T>::kHasMin && a.sum32 == nullptr)) {
    throw Error(what + ": null activation codes, scales" + (WeightInt8<T>::kHasMin ? " or sums" : ""));
  }
  if (reinterpret_cast<uintptr_t>(a.q) % 16 != 0) throw Error(what + ": activation codes are not 16-byte aligned");
}

// Rows of up to kMaxGemvMatrices matrices of type T and one n_in for one launch; throws unless they fit.
template <TensorType T>
GemvMatrices gemv_matrices(std::span<const MatmulTarget> targets, int64_t n_tokens, size_t& row_bytes) {
  const std::string what = std::string("cuda::matmul_int8 (") + tensor_type_name(T) + ")";
  if (targets.empty() || targets.size() > size_t(kMaxGemvMatrices)) {
    throw Error(what + ": " + std::to_string(targets.size()) + " matrices (1 to " +
                std::to_string(kMaxGemvMatrices) + ")");
  }
  GemvMatrices matrices{};
  matrices.count = int(targets.size());
  for (int m = 0; m < matrices.count; ++m) {
    const WeightMatrix& w = targets[size_t(m)].w;
    if (w.type != T || w.n_in != targets[0].w.n_in) {
      throw Error(what + ": the matrices of one product differ in type or input length");
    }
    row_bytes = checked_row_bytes<T>(w, n_tokens, targets[size_t(m)].y);
    if (int64_t(matrices.total_rows) + w.n_out > INT_MAX) throw Error(what + ": too many rows for one launch");
    matrices.w[m] = static_cast<const uint8_t*>(w.data);
    matrices.y[m] = targets[size_t(m)].y;
    matrices.n_out[m] = int(w.n_out);
    matrices.first_row[m] = matrices.total_rows;
    matrices.total_rows += int(w.n_out);
  }
  return matrices;
}

// The most warps that share a row: SPARROW_GEMV_SLICES (1, 2 or 4; an A/B switch), else 4.
int max_gemv_slices() {
  static const int max_slices = [] {
    const char* v = std::getenv("SPARROW_GEMV_SLICES");
    const std::string s = v ? v : "";
    return s == "1" ? 1 : s == "2" ? 2 : 4;
  }();
  return max_slices;
}

// The warps that share each row of n_in: as many as the row has steps, up to max_gemv_slices(), a power of two.
// A function of the row length only, so that every launch over rows of one length adds in the same order (the
// products of matmuls, the gated and residual epilogues have the bits of the products one by one).
template <TensorType T>
int gemv_slices(int n_in) {
  const int steps_per_row = gemv_steps_per_row<T>(n_in);
  int slices = max_gemv_slices();
  while (slices > steps_per_row) slices /= 2;
  return slices;
}

// One token (decode of one sequence) takes a kernel that holds one sum per lane, not kMaxGemvTokens: fewer
// registers, so the kernel holds no fewer CTAs than its shared memory allows.
template <TensorType T, bool kQuantizes>
void launch_gemv(MatmulContext& ctx, const GemvMatrices& matrices, size_t row_bytes, int n_in,
                 const GemvActivations& activations, int n_tokens) {
  const int shared_bytes = kQuantizes ? gemv_quantized_bytes<T>(n_in, n_tokens) : 0;
  const int slices = gemv_slices<T>(n_in), groups = kGemvWarps / slices;
  auto run = [&](auto kernel, int resident_ctas) {
    const int ctas = std::min((gemv_items(matrices) + groups - 1) / groups, resident_ctas);
    launch_dependent(kernel, dim3(unsigned(ctas)), dim3(kGemvWarps * kWarp), size_t(shared_bytes), ctx.stream(),
                     matrices, row_bytes, n_in, activations, n_tokens, slices);
  };
  if (n_tokens == 1) {
    run(gemv_int8_kernel<T, kQuantizes, 1>, gemv_resident_ctas<T, kQuantizes, 1>(shared_bytes));
  } else {
    run(gemv_int8_kernel<T, kQuantizes, kMaxGemvTokens>,
        gemv_resident_ctas<T, kQuantizes, kMaxGemvTokens>(shared_bytes));
  }
}

// The products of the targets; a GEMV that quantizes x itself takes an epilogue other than the plain sum.
template <TensorType T>
void launch(MatmulContext& ctx, std::span<const MatmulTarget> targets, const GemvActivations& activations,
            int64_t n_tokens, const GemvEpilogue& epilogue) {
  size_t row_bytes = 0;
  GemvMatrices matrices = gemv_matrices<T>(targets, n_tokens, row_bytes);
  matrices.epilogue = epilogue;
  check_activations<T>(activations);
  if (n_tokens == 0) return;
  const int n_in = int(targets[0].w.n_in);
  if (activations.x != nullptr) {
    if (!matmul_int8_quantizes(T, n_in, n_tokens)) {
      throw Error(std::string("cuda::matmul_int8 (") + tensor_type_name(T) + "): " + std::to_string(n_tokens) +
                  " x " + std::to_string(n_in) + " float activations are too many for the GEMV to quantize");
    }
    return launch_gemv<T, true>(ctx, matrices, row_bytes, n_in, activations, int(n_tokens));
  }
  if (n_tokens <= kMaxGemvTokens) {
    return launch_gemv<T, false>(ctx, matrices, row_bytes, n_in, activations, int(n_tokens));
  }
  require_sm80(reinterpret_cast<const void*>(int8_mma_kernel<T>), "cuda::matmul_int8");
  for (const MatmulTarget& t : targets) {
    int8_mma_kernel<T><<<grid(t.w.n_out, n_tokens), kThreads, 0, ctx.stream()>>>(
        static_cast<const uint8_t*>(t.w.data), row_bytes, n_in, int(t.w.n_out), activations.q, activations.scale,
        activations.sum32, int(n_tokens), t.y);
    SPARROW_CUDA_CHECK_LAUNCH();
  }
}

// Runs launch<T> for the targets' block type.
void launch_for_type(MatmulContext& ctx, std::span<const MatmulTarget> targets, const GemvActivations& activations,
                     int64_t n_tokens, const GemvEpilogue& epilogue = {}) {
  if (targets.empty()) return;
  formats::visit_weight_type(targets[0].w.type, "cuda::matmul_int8", [&](auto type) {
    constexpr TensorType T = decltype(type)::value;
    if constexpr (WeightInt8<T>::kSupported) {
      launch<T>(ctx, targets, activations, n_tokens, epilogue);
    } else {
      throw Error(std::string("cuda::matmul_int8: weight type ") + tensor_type_name(T) +
                  " has no 8-bit integer form (formats/weight_int8.h); use cuda::matmul");
    }
  });
}

}  // namespace

bool matmul_int8_supports(TensorType type) {
  if (!formats::is_supported_weight_type(type)) return false;
  return formats::visit_weight_type(type, "cuda::matmul_int8_supports",
                                    [](auto t) { return WeightInt8<decltype(t)::value>::kSupported; });
}

void matmul_int8(MatmulContext& ctx, const WeightMatrix& w, const int8_t* xq, const float* x_scale,
                 const float* x_sum32, int64_t n_tokens, float* y) {
  const MatmulTarget target{w, y};
  matmul_int8(ctx, std::span(&target, 1), xq, x_scale, x_sum32, n_tokens);
}

void matmul_int8(MatmulContext& ctx, std::span<const MatmulTarget> targets, const int8_t* xq, const float* x_scale,
                 const float* x_sum32, int64_t n_tokens) {
  launch_for_type(ctx, targets, GemvActivations{.x = nullptr, .q = xq, .scale = x_scale, .sum32 = x_sum32}, n_tokens);
}

bool matmul_int8_quantizes(TensorType type, int64_t n_in, int64_t n_tokens) {
  if (!matmul_int8_supports(type) || n_tokens < 1 || n_tokens > kMaxGemvTokens || n_in <= 0) return false;
  return formats::visit_weight_type(type, "cuda::matmul_int8_quantizes", [&](auto t) {
    constexpr TensorType T = decltype(t)::value;
    if constexpr (WeightInt8<T>::kSupported) {
      return n_in <= kMaxGemvQuantizedBytes && gemv_quantized_bytes<T>(n_in, n_tokens) <= kMaxGemvQuantizedBytes;
    } else {
      return false;
    }
  });
}

void matmul_int8(MatmulContext& ctx, std::span<const MatmulTarget> targets, const float* x, int64_t n_tokens) {
  if (x == nullptr) throw Error("cuda::matmul_int8: null activations");
  launch_for_type(ctx, targets, GemvActivations{.x = x, .q = nullptr, .scale = nullptr, .sum32 = nullptr}, n_tokens);
}

bool matmul_int8_fuses(const GatedProduct& p, int64_t n_tokens) {
  const WeightMatrix& g = p.gate;
  if (!matmul_int8_quantizes(g.type, g.n_in, n_tokens)) return false;
  if (p.up) return p.up->type == g.type && p.up->n_in == g.n_in && p.up->n_out == g.n_out;
  return p.mul != nullptr;
}

bool matmul_int8_fuses_residual(const WeightMatrix& w, int64_t n_tokens, const float* r, const ResidualStep& step) {
  return matmul_int8_quantizes(w.type, w.n_in, n_tokens) && w.n_out <= INT_MAX &&
         row_fits_registers(w.n_out, {step.x, r, step.r_weight, step.next_weight, step.next});
}

void matmul_int8_residual(MatmulContext& ctx, const WeightMatrix& w, const float* x, int64_t n_tokens, float* r,
                          const ResidualStep& step) {
  if (!matmul_int8_fuses_residual(w, n_tokens, r, step)) {
    throw Error("cuda::matmul_int8_residual: this product (" + std::string(tensor_type_name(w.type)) + ", " +
                std::to_string(n_tokens) + " tokens, " + std::to_string(w.n_out) +
                " outputs) is not one the GEMV fuses (matmul_int8_fuses_residual)");
  }
  if (x == nullptr || step.x == nullptr) throw Error("cuda::matmul_int8_residual: null activations or residual");
  GemvEpilogue epilogue;
  epilogue.residual_done = ctx.residual_counts.zeroed<int32_t>(1);
  epilogue.residual = ResidualRows{.x = step.x,
                                   .r = r,
                                   .r_weight = step.r_weight,
                                   .next_weight = step.next_weight,
                                   .next = step.next,
                                   .dim = int(w.n_out),
                                   .eps = step.eps,
                                   .x_scale = step.x_scale};
  const MatmulTarget target{w, r};
  const GemvActivations activations{.x = x, .q = nullptr, .scale = nullptr, .sum32 = nullptr};
  launch_for_type(ctx, std::span(&target, 1), activations, n_tokens, epilogue);
}

void matmul_int8_gated(MatmulContext& ctx, const uint16_t* gelu_table, const GatedProduct& p, const float* x,
                       int64_t n_tokens, float* y) {
  if (!matmul_int8_fuses(p, n_tokens)) {
    throw Error("cuda::matmul_int8_gated: this product (" + std::string(tensor_type_name(p.gate.type)) + ", " +
                std::to_string(n_tokens) + " tokens) is not one the GEMV fuses (matmul_int8_fuses)");
  }
  if (x == nullptr || gelu_table == nullptr) throw Error("cuda::matmul_int8_gated: null activations or gelu table");
  const GemvActivations activations{.x = x, .q = nullptr, .scale = nullptr, .sum32 = nullptr};
  if (p.up) {
    // The up matrix's outputs are never written: its y only has to pass the checks.
    const MatmulTarget pair[] = {{p.gate, y}, {*p.up, y}};
    launch_for_type(ctx, pair, activations, n_tokens, GemvEpilogue{.gelu_table = gelu_table, .paired = true});
  } else {
    const MatmulTarget gate{p.gate, y};
    launch_for_type(ctx, std::span(&gate, 1), activations, n_tokens,
                    GemvEpilogue{.gelu_table = gelu_table, .mul = p.mul, .mul_stride = p.mul_stride});
  }
}

}  // namespace sparrow::cuda
