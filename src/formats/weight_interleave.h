#pragma once
// Q4_K rows interleaved eight at a time: the same bytes as eight rows' BlockQ4_K, rearranged so that one
// 32-byte load holds four quant bytes of each of the eight rows. A one-token GEMV then broadcasts each
// quad of activations once for eight rows, multiplies the eight rows' sub-block scales as one vector, and
// ends with the eight dot products in the lanes of one register: per super-block about half the
// instructions of a row at a time, whose per-block scale unpacking was as much work as the products.
// The CPU's weight store makes this layout at load (cpu/cpu_weight_store.cpp) where its kernels have a
// fast path for it (cpu::matmul_interleaves); matrices in it say so in WeightMatrix::interleaved.
#include <cstddef>
#include <cstdint>

#include "formats/weight_blocks.h"

namespace sparrow::formats {

constexpr int kInterleavedRows = 8;

// Super-block b of rows 8g .. 8g + 7.
struct BlockQ4_Kx8 {
  f16_bits d[kInterleavedRows], dmin[kInterleavedRows];  // row r's d and dmin
  uint32_t scale_words[3][kInterleavedRows];              // [k][r]: bytes 4k .. 4k + 3 of row r's scales
  uint8_t qs[4][8][kInterleavedRows][4];                  // [chunk c][quad q][r]: row r's qs[32c + 4q ..] (4 bytes)
};
static_assert(sizeof(BlockQ4_Kx8) == kInterleavedRows * sizeof(BlockQ4_K), "a rearrangement, not a new format");

// Eight rows of n_super Q4_K super-blocks (row r at rows + r * row_bytes) to n_super interleaved blocks.
void interleave_q4_k_rows(const uint8_t* rows, size_t row_bytes, int64_t n_super, BlockQ4_Kx8* out);

// Row r (0..7) of n_super interleaved blocks back in the file's layout: n_super BlockQ4_K at out.
void deinterleave_q4_k_row(const BlockQ4_Kx8* group, int64_t n_super, int r, BlockQ4_K* out);

}  // namespace sparrow::formats
