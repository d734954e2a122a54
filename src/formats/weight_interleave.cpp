#include "formats/weight_interleave.h"

#include <cstddef>
#include <cstring>

#include "util/error.h"

namespace sparrow::formats {
namespace {

// The two kinds of piece, as calls of piece(offset in the interleaved block, offset in row r's block, bytes):
// a field each row has once, its eight copies side by side ...
template <class Piece>
void row_field(Piece& piece, int r, size_t group_offset, size_t block_offset, size_t bytes) {
  piece(group_offset + bytes * r, block_offset, bytes);
}

// ... and n 4-byte quads of a row's bytes, quad q of the eight rows side by side.
template <class Piece>
void row_quads(Piece& piece, int r, size_t group_offset, size_t block_offset, int n) {
  for (int q = 0; q < n; ++q) piece(group_offset + 4 * (kInterleavedRows * q + r), block_offset + 4 * q, 4);
}

// ... and a 4-byte word of a row kept in another bit order (to_group; to_block undoes it), side by side.
struct WordBits {
  uint32_t (*to_group)(uint32_t);
  uint32_t (*to_block)(uint32_t);
};

template <class Piece>
void row_word(Piece& piece, int r, size_t group_offset, size_t block_offset, const WordBits& bits) {
  piece(group_offset + 4 * r, block_offset, 4, &bits);
}

// Q5_0's fifth bits (bit j: element j) in the order of BlockQ5_0x8::qh: byte i, bit q holds element 4q + i and bit
// 4 + q element 16 + 4q + i.
constexpr int q5_0_group_bit(int j) { return j < 16 ? 8 * (j % 4) + j / 4 : 8 * (j % 4) + 4 + (j - 16) / 4; }

uint32_t q5_0_qh_to_group(uint32_t word) {
  uint32_t out = 0;
  for (int j = 0; j < 32; ++j) out |= ((word >> j) & 1u) << q5_0_group_bit(j);
  return out;
}

uint32_t q5_0_qh_to_block(uint32_t word) {
  uint32_t out = 0;
  for (int j = 0; j < 32; ++j) out |= ((word >> q5_0_group_bit(j)) & 1u) << j;
  return out;
}

void store_word(uint8_t* p, uint32_t word) {  // little-endian, as the blocks store their words (load_u32_le)
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(word >> (8 * i));
}

// Per type: the block pair and the map both directions of the rearrangement follow, every piece of row r.
template <TensorType kType>
struct Interleaving;

template <>
struct Interleaving<TensorType::Q4_K> {
  using Block = BlockQ4_K;
  using Group = BlockQ4_Kx8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    row_field(piece, r, offsetof(Group, d), offsetof(Block, d), sizeof(f16_bits));
    row_field(piece, r, offsetof(Group, dmin), offsetof(Block, dmin), sizeof(f16_bits));
    row_quads(piece, r, offsetof(Group, scale_words), offsetof(Block, scales), 3);
    row_quads(piece, r, offsetof(Group, qs), offsetof(Block, qs), 32);  // quad 8c + q: qs[32c + 4q ..]
  }
};

template <>
struct Interleaving<TensorType::Q5_K> {
  using Block = BlockQ5_K;
  using Group = BlockQ5_Kx8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    row_field(piece, r, offsetof(Group, d), offsetof(Block, d), sizeof(f16_bits));
    row_field(piece, r, offsetof(Group, dmin), offsetof(Block, dmin), sizeof(f16_bits));
    row_quads(piece, r, offsetof(Group, scale_words), offsetof(Block, scales), 3);
    row_quads(piece, r, offsetof(Group, qh), offsetof(Block, qh), 8);
    row_quads(piece, r, offsetof(Group, qs), offsetof(Block, qs), 32);  // quad 8c + q: qs[32c + 4q ..]
  }
};

template <>
struct Interleaving<TensorType::Q8_0> {
  using Block = BlockQ8_0;
  using Group = BlockQ8_0x8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    row_field(piece, r, offsetof(Group, d), offsetof(Block, d), sizeof(f16_bits));
    row_quads(piece, r, offsetof(Group, qs), offsetof(Block, qs), 8);
  }
};

template <>
struct Interleaving<TensorType::Q5_0> {
  using Block = BlockQ5_0;
  using Group = BlockQ5_0x8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    row_field(piece, r, offsetof(Group, d), offsetof(Block, d), sizeof(f16_bits));
    row_word(piece, r, offsetof(Group, qh), offsetof(Block, qh), WordBits{q5_0_qh_to_group, q5_0_qh_to_block});
    row_quads(piece, r, offsetof(Group, qs), offsetof(Block, qs), 4);
  }
};

template <>
struct Interleaving<TensorType::Q4_0> {
  using Block = BlockQ4_0;
  using Group = BlockQ4_0x8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    row_field(piece, r, offsetof(Group, d), offsetof(Block, d), sizeof(f16_bits));
    row_quads(piece, r, offsetof(Group, qs), offsetof(Block, qs), 4);
  }
};

template <>
struct Interleaving<TensorType::Q6_K> {
  using Block = BlockQ6_K;
  using Group = BlockQ6_Kx8;
  template <class Piece>
  static void for_each_piece(int r, Piece piece) {
    row_quads(piece, r, offsetof(Group, ql), offsetof(Block, ql), 32);
    row_quads(piece, r, offsetof(Group, qh), offsetof(Block, qh), 16);
    row_quads(piece, r, offsetof(Group, scale_words), offsetof(Block, scales), 4);
    row_field(piece, r, offsetof(Group, d), offsetof(Block, d), sizeof(f16_bits));
  }
};

template <class Fn>
void visit_interleaving(TensorType type, Fn fn) {
  switch (type) {
    case TensorType::Q4_K: return fn(Interleaving<TensorType::Q4_K>{});
    case TensorType::Q5_K: return fn(Interleaving<TensorType::Q5_K>{});
    case TensorType::Q8_0: return fn(Interleaving<TensorType::Q8_0>{});
    case TensorType::Q5_0: return fn(Interleaving<TensorType::Q5_0>{});
    case TensorType::Q4_0: return fn(Interleaving<TensorType::Q4_0>{});
    case TensorType::Q6_K: return fn(Interleaving<TensorType::Q6_K>{});
    default: throw Error("weight type " + std::string(tensor_type_info(type)->name) + " has no interleaved layout");
  }
}

}  // namespace

void interleave_rows(TensorType type, const uint8_t* rows, size_t row_bytes, int64_t n_blocks, void* out) {
  visit_interleaving(type, [&](auto layout) {
    using L = decltype(layout);
    for (int r = 0; r < kInterleavedRows; ++r) {
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* block = rows + size_t(r) * row_bytes + size_t(b) * sizeof(typename L::Block);
        auto* group = static_cast<uint8_t*>(out) + size_t(b) * sizeof(typename L::Group);
        L::for_each_piece(r, [&](size_t at, size_t from, size_t n, const WordBits* bits = nullptr) {
          std::memcpy(group + at, block + from, n);
          if (bits) store_word(group + at, bits->to_group(load_u32_le(group + at)));
        });
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
      L::for_each_piece(r, [&](size_t from, size_t at, size_t n, const WordBits* bits = nullptr) {
        std::memcpy(block + at, from_group + from, n);
        if (bits) store_word(block + at, bits->to_block(load_u32_le(block + at)));
      });
    }
  });
}

}  // namespace sparrow::formats
