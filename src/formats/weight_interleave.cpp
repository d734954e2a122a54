#include "formats/weight_interleave.h"

#include <cstddef>
#include <cstring>

namespace sparrow::formats {
namespace {

// Calls piece(offset in the interleaved block, offset in row r's block, bytes) for every piece of row r:
// the one map both directions of the rearrangement follow.
template <class Piece>
void for_each_piece(int r, Piece piece) {
  piece(offsetof(BlockQ4_Kx8, d) + sizeof(f16_bits) * r, offsetof(BlockQ4_K, d), sizeof(f16_bits));
  piece(offsetof(BlockQ4_Kx8, dmin) + sizeof(f16_bits) * r, offsetof(BlockQ4_K, dmin), sizeof(f16_bits));
  for (int k = 0; k < 3; ++k) {
    piece(offsetof(BlockQ4_Kx8, scale_words) + 4 * (kInterleavedRows * k + r), offsetof(BlockQ4_K, scales) + 4 * k, 4);
  }
  for (int quad = 0; quad < 32; ++quad) {  // quad 8c + q: qs bytes 32c + 4q .. 32c + 4q + 3 = 4 * quad ..
    piece(offsetof(BlockQ4_Kx8, qs) + 4 * (kInterleavedRows * quad + r), offsetof(BlockQ4_K, qs) + 4 * quad, 4);
  }
}

}  // namespace

void interleave_q4_k_rows(const uint8_t* rows, size_t row_bytes, int64_t n_super, BlockQ4_Kx8* out) {
  for (int r = 0; r < kInterleavedRows; ++r) {
    for (int64_t b = 0; b < n_super; ++b) {
      const uint8_t* block = rows + size_t(r) * row_bytes + size_t(b) * sizeof(BlockQ4_K);
      auto* group = reinterpret_cast<uint8_t*>(out + b);
      for_each_piece(r, [&](size_t at, size_t from, size_t n) { std::memcpy(group + at, block + from, n); });
    }
  }
}

void deinterleave_q4_k_row(const BlockQ4_Kx8* group, int64_t n_super, int r, BlockQ4_K* out) {
  for (int64_t b = 0; b < n_super; ++b) {
    const auto* from_group = reinterpret_cast<const uint8_t*>(group + b);
    auto* block = reinterpret_cast<uint8_t*>(out + b);
    for_each_piece(r, [&](size_t from, size_t at, size_t n) { std::memcpy(block + at, from_group + from, n); });
  }
}

}  // namespace sparrow::formats
