#include "formats/weight_interleave.h"

#include <cstddef>
#include <cstring>

#include "util/error.h"

namespace sparrow::formats {
namespace {

// Per type: the block pair and the map both directions of the rearrangement follow, as calls of
// piece(offset in the interleaved block, offset in row r's block, bytes) for every piece of row r.
template <TensorType kType>
struct Interleaving;

template <>
struct Interleaving<TensorType::Q4_K> {
  using Block = BlockQ4_K;
  using Group = BlockQ4_Kx8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    piece(offsetof(Group, d) + sizeof(f16_bits) * r, offsetof(Block, d), sizeof(f16_bits));
    piece(offsetof(Group, dmin) + sizeof(f16_bits) * r, offsetof(Block, dmin), sizeof(f16_bits));
    for (int k = 0; k < 3; ++k) {
      piece(offsetof(Group, scale_words) + 4 * (kInterleavedRows * k + r), offsetof(Block, scales) + 4 * k, 4);
    }
    for (int quad = 0; quad < 32; ++quad) {  // quad 8c + q: qs bytes 32c + 4q .. 32c + 4q + 3 = 4 * quad ..
      piece(offsetof(Group, qs) + 4 * (kInterleavedRows * quad + r), offsetof(Block, qs) + 4 * quad, 4);
    }
  }
};

template <>
struct Interleaving<TensorType::Q8_0> {
  using Block = BlockQ8_0;
  using Group = BlockQ8_0x8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    piece(offsetof(Group, d) + sizeof(f16_bits) * r, offsetof(Block, d), sizeof(f16_bits));
    for (int quad = 0; quad < 8; ++quad) {
      piece(offsetof(Group, qs) + 4 * (kInterleavedRows * quad + r), offsetof(Block, qs) + 4 * quad, 4);
    }
  }
};

template <>
struct Interleaving<TensorType::Q5_0> {
  using Block = BlockQ5_0;
  using Group = BlockQ5_0x8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    piece(offsetof(Group, d) + sizeof(f16_bits) * r, offsetof(Block, d), sizeof(f16_bits));
    piece(offsetof(Group, qh) + 4 * r, offsetof(Block, qh), 4);
    for (int quad = 0; quad < 4; ++quad) {
      piece(offsetof(Group, qs) + 4 * (kInterleavedRows * quad + r), offsetof(Block, qs) + 4 * quad, 4);
    }
  }
};

template <class Fn>
void visit_interleaving(TensorType type, Fn fn) {
  switch (type) {
    case TensorType::Q4_K: return fn(Interleaving<TensorType::Q4_K>{});
    case TensorType::Q8_0: return fn(Interleaving<TensorType::Q8_0>{});
    case TensorType::Q5_0: return fn(Interleaving<TensorType::Q5_0>{});
    default: throw Error("weight type " + std::string(tensor_type_info(type)->name) + " has no interleaved layout");
  }
}

}  // namespace

bool has_interleaved_layout(TensorType type) {
  return type == TensorType::Q4_K || type == TensorType::Q8_0 || type == TensorType::Q5_0;
}

void interleave_rows(TensorType type, const uint8_t* rows, size_t row_bytes, int64_t n_blocks, void* out) {
  visit_interleaving(type, [&](auto layout) {
    using L = decltype(layout);
    for (int r = 0; r < kInterleavedRows; ++r) {
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* block = rows + size_t(r) * row_bytes + size_t(b) * sizeof(typename L::Block);
        auto* group = static_cast<uint8_t*>(out) + size_t(b) * sizeof(typename L::Group);
        L::for_each_piece(r, [&](size_t at, size_t from, size_t n) { std::memcpy(group + at, block + from, n); });
      }
    }
  });
}

void deinterleave_row(TensorType type, const void* group, int64_t n_blocks, int r, uint8_t* out) {
  visit_interleaving(type, [&](auto layout) {
    using L = decltype(layout);
    for (int64_t b = 0; b < n_blocks; ++b) {
      const auto* from_group = static_cast<const uint8_t*>(group) + size_t(b) * sizeof(typename L::Group);
      uint8_t* block = out + size_t(b) * sizeof(typename L::Block);
      L::for_each_piece(r, [&](size_t from, size_t at, size_t n) { std::memcpy(block + at, from_group + from, n); });
    }
  });
}

}  // namespace sparrow::formats
