#pragma once
// Weight rows interleaved eight at a time: the same bytes as eight rows' blocks, rearranged so that one 32-byte
// load holds four quant bytes of each of the eight rows (Q5_0's fifth bits also in another order within their
// word). A one-token GEMV then broadcasts each quad of
// activations once for eight rows, applies the eight rows' block scales as one vector, and ends with the eight
// dot products in the lanes of one register: per block about half the instructions of a row at a time,
// whose per-block scale unpacking was as much work as the products.
// The CPU's weight store makes this layout at load (cpu/cpu_weight_store.cpp) where its kernels have a
// fast path for it (cpu::matmul_interleaves); matrices in it say so in WeightMatrix::interleaved.
#include <cstddef>
#include <cstdint>

#include "formats/weight_blocks.h"
#include "gguf/tensor_types.h"

namespace sparrow::formats {

constexpr int kInterleavedRows = 8;

// Q4_K: super-block b of rows 8g .. 8g + 7.
struct BlockQ4_Kx8 {
  f16_bits d[kInterleavedRows], dmin[kInterleavedRows];  // row r's d and dmin
  uint32_t scale_words[3][kInterleavedRows];              // [k][r]: bytes 4k .. 4k + 3 of row r's scales
  uint8_t qs[4][8][kInterleavedRows][4];                  // [chunk c][quad q][r]: row r's qs[32c + 4q ..] (4 bytes)
};
static_assert(sizeof(BlockQ4_Kx8) == kInterleavedRows * sizeof(BlockQ4_K), "a rearrangement, not a new format");

// Q5_K: super-block b of rows 8g .. 8g + 7, Q4_K's fields and the fifth bits.
struct BlockQ5_Kx8 {
  f16_bits d[kInterleavedRows], dmin[kInterleavedRows];  // row r's d and dmin
  uint32_t scale_words[3][kInterleavedRows];              // [k][r]: bytes 4k .. 4k + 3 of row r's scales
  uint8_t qh[8][kInterleavedRows][4];                     // [quad q][r]: row r's qh[4q .. 4q + 3]
  uint8_t qs[4][8][kInterleavedRows][4];                  // [chunk c][quad q][r]: row r's qs[32c + 4q ..] (4 bytes)
};
static_assert(sizeof(BlockQ5_Kx8) == kInterleavedRows * sizeof(BlockQ5_K), "a rearrangement, not a new format");

// Q8_0: block b of rows 8g .. 8g + 7.
struct BlockQ8_0x8 {
  f16_bits d[kInterleavedRows];           // row r's d
  int8_t qs[8][kInterleavedRows][4];      // [quad q][r]: row r's qs[4q .. 4q + 3]
};
static_assert(sizeof(BlockQ8_0x8) == kInterleavedRows * sizeof(BlockQ8_0), "a rearrangement, not a new format");

// Q5_0: block b of rows 8g .. 8g + 7.
struct BlockQ5_0x8 {
  f16_bits d[kInterleavedRows];             // row r's d
  uint32_t qh[kInterleavedRows];            // row r's fifth bits, regrouped: byte i, bit q is element 4q + i and
                                            // bit 4 + q element 16 + 4q + i (a shift and a mask give quad q's)
  uint8_t qs[4][kInterleavedRows][4];       // [quad q][r]: row r's qs[4q .. 4q + 3] (elements 4q.. and 16 + 4q..)
};
static_assert(sizeof(BlockQ5_0x8) == kInterleavedRows * sizeof(BlockQ5_0), "a rearrangement, not a new format");

// Q4_0: block b of rows 8g .. 8g + 7.
struct BlockQ4_0x8 {
  f16_bits d[kInterleavedRows];             // row r's d
  uint8_t qs[4][kInterleavedRows][4];       // [quad q][r]: row r's qs[4q .. 4q + 3] (elements 4q.. and 16 + 4q..)
};
static_assert(sizeof(BlockQ4_0x8) == kInterleavedRows * sizeof(BlockQ4_0), "a rearrangement, not a new format");

// Q6_K: super-block b of rows 8g .. 8g + 7.
struct BlockQ6_Kx8 {
  uint8_t ql[32][kInterleavedRows][4];      // [quad q][r]: row r's ql[4q .. 4q + 3]
  uint8_t qh[16][kInterleavedRows][4];      // [quad q][r]: row r's qh[4q .. 4q + 3]
  uint32_t scale_words[4][kInterleavedRows];  // [k][r]: row r's scales[4k .. 4k + 3]
  f16_bits d[kInterleavedRows];             // row r's d
};
static_assert(sizeof(BlockQ6_Kx8) == kInterleavedRows * sizeof(BlockQ6_K), "a rearrangement, not a new format");

// Whether `type` has an interleaved layout (Q4_K, Q5_K, Q8_0, Q5_0, Q4_0, Q6_K).
constexpr bool has_interleaved_layout(TensorType type) {
  return type == TensorType::Q4_K || type == TensorType::Q5_K || type == TensorType::Q8_0 || type == TensorType::Q5_0 ||
         type == TensorType::Q4_0 || type == TensorType::Q6_K;
}

// Eight rows of n_blocks blocks of `type` (row r at rows + r * row_bytes) to n_blocks interleaved blocks at out.
void interleave_rows(TensorType type, const uint8_t* rows, size_t row_bytes, int64_t n_blocks, void* out);

// Row r (0..7) of n_blocks interleaved blocks back in the file's layout: n_blocks blocks at out.
void deinterleave_row(TensorType type, const void* group, int64_t n_blocks, int r, uint8_t* out);

}  // namespace sparrow::formats
