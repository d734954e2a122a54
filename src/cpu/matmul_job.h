#pragma once
// What the per-target matmul kernels (matmul-inl.h) receive: the weight matrix, the activations in the form
// the weight type multiplies against, and the output. Shared by every SIMD target, so plain data only.
#include <cstddef>
#include <cstdint>

#include "gguf/tensor_types.h"

namespace sparrow::cpu {

// Activations quantized to 8 bits the way llama.cpp does before an integer dot product: per token, `group`
// consecutive elements (32 for Q4_0..Q8_0 weights, 256 for K-quants) share one float scale, and the values
// are kept widened to int16 so that the kernels multiply pairs of int16 without unpacking activations.
struct QuantizedTokens {
  int group = 0;                  // elements per scale: 32 or 256
  const int16_t* q = nullptr;     // [n_tokens][n_in], each in [-127, 127] (not written on the VNNI target)
  const int8_t* q8 = nullptr;     // the same values as bytes: for the VNNI kernels and the AVX2 byte kernels
                                  // (written only on those targets)
  const float* scale = nullptr;   // [n_tokens][n_in / group]
  const float* scaled_sum32 = nullptr;  // [n_tokens][n_in / 32]: scale * (sum of q) over each 32 elements
  // For the VNNI kernels of 32-element blocks (written only on that target, for group 32), per token and pair of
  // blocks (2p, 2p + 1), as the int32 lanes of one dot product lay them out: 16 lanes, the first 8 block 2p's,
  // the last 8 block 2p + 1's (zero past the last block).
  const float* pair_scale = nullptr;  // [n_tokens][n_pairs][16]: each block's scale in its 8 lanes
  const int32_t* pair_sum = nullptr;  // [n_tokens][n_pairs][16]: sum of q in lanes 0 and 8, zero elsewhere
  // For the VNNI kernel of Q6_K and the AVX2 kernels of interleaved Q4_K and of the Q6_K GEMM (written only on
  // those targets, for group 256): sum of q over each 16 elements.
  const int16_t* sum16 = nullptr;     // [n_tokens][n_in / 16]
};

// Pairs of 32-element blocks per token in QuantizedTokens::pair_scale and pair_sum.
constexpr int64_t block_pairs(int64_t n_in) { return (n_in / 32 + 1) / 2; }

// Activations packed for the prompt-processing GEMM, per vector of n tokens ("token vector" tv; n is the
// target's GemmTokensPerVector()):
//   q:     [tv][n_in / 2][n][2] int16: element pair (2p, 2p + 1) of each of the n tokens side by side, for the
//          int16 GEMM
//   scale: [tv][n_in / group][n] float
//   sums:  [tv][n_in / 32][n] float (scaled_sum32); per 16 elements instead ([tv][n_in / 16][n], scale * sum16)
//          for the GEMMs that weigh offsets by 16-element sub-blocks (the AVX2 byte GEMM of Q6_K)
//   quads: [tv][n_in / 4][n][4] bytes: element quad (4p .. 4p + 3) of each of the n tokens side by side, for the
//          byte GEMMs: x + 128 as unsigned bytes on the VNNI target, x as signed bytes on AVX2
// A GEMM reads q or quads, whichever its target and weight type multiply (GemmReadsQuads); only that one is
// packed.
struct PackedTokens {
  int16_t* q;
  float* scale;
  float* sums;
  uint8_t* quads;
};

// Token vectors per GEMM tile: the GEMM runs on whole tiles.
constexpr int kGemmVectorsPerTile = 2;

struct MatmulJob {
  TensorType type;
  const uint8_t* weights;  // n_out rows of row_bytes
  size_t row_bytes;        // of a row in the file's layout
  bool interleaved;        // rows in groups of eight, interleaved (WeightMatrix::interleaved)
  int64_t n_in, n_out, n_tokens;
  const float* x;          // [n_tokens][n_in], used by float weight types
  QuantizedTokens xq;      // used by quantized weight types
  float* y;                // [n_tokens][n_out]
};

}  // namespace sparrow::cpu
