// Interleaved rows (formats/weight_interleave.h) against the layout's definition, written out here, and
// the CPU weight store that makes them.
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/matmul.h"
#include "formats/weight_interleave.h"
#include "ops/backend.h"

namespace sparrow::formats {
namespace {

// n_rows rows of n_blocks random blocks of `Block` (every byte random: the rearrangement never looks at values).
template <class Block>
std::vector<uint8_t> random_rows(int64_t n_rows, int64_t n_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(size_t(n_rows * n_blocks) * sizeof(Block));
  for (uint8_t& b : bytes) b = uint8_t(rng());
  return bytes;
}

// Row r's block b of n_blocks-block rows.
template <class Block>
Block row_block(const std::vector<uint8_t>& bytes, int64_t n_blocks, int r, int64_t b) {
  Block block;
  std::memcpy(&block, bytes.data() + size_t(r * n_blocks + b) * sizeof(Block), sizeof block);
  return block;
}

template <class Group>
std::vector<Group> interleaved(TensorType type, const std::vector<uint8_t>& bytes, int64_t n_blocks) {
  std::vector<Group> groups(static_cast<size_t>(n_blocks));
  interleave_rows(type, bytes.data(), bytes.size() / kInterleavedRows, n_blocks, groups.data());
  return groups;
}

TEST(WeightInterleave, EveryByteOfEightQ4KRowsLandsWhereTheLayoutSays) {
  const int64_t n_blocks = 3;
  const auto bytes = random_rows<BlockQ4_K>(kInterleavedRows, n_blocks, 1);
  const auto groups = interleaved<BlockQ4_Kx8>(TensorType::Q4_K, bytes, n_blocks);
  for (int r = 0; r < kInterleavedRows; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const BlockQ4_K row = row_block<BlockQ4_K>(bytes, n_blocks, r, b);
      const BlockQ4_Kx8& g = groups[b];
      EXPECT_EQ(g.d[r], row.d);
      EXPECT_EQ(g.dmin[r], row.dmin);
      for (int k = 0; k < 3; ++k) EXPECT_EQ(std::memcmp(&g.scale_words[k][r], row.scales + 4 * k, 4), 0);
      for (int c = 0; c < 4; ++c) {
        for (int q = 0; q < 8; ++q) {
          for (int i = 0; i < 4; ++i) ASSERT_EQ(g.qs[c][q][r][i], row.qs[32 * c + 4 * q + i]) << r << " " << b;
        }
      }
    }
  }
}

TEST(WeightInterleave, EveryByteOfEightQ5KRowsLandsWhereTheLayoutSays) {
  const int64_t n_blocks = 2;
  const auto bytes = random_rows<BlockQ5_K>(kInterleavedRows, n_blocks, 8);
  const auto groups = interleaved<BlockQ5_Kx8>(TensorType::Q5_K, bytes, n_blocks);
  for (int r = 0; r < kInterleavedRows; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const BlockQ5_K row = row_block<BlockQ5_K>(bytes, n_blocks, r, b);
      const BlockQ5_Kx8& g = groups[b];
      EXPECT_EQ(g.d[r], row.d);
      EXPECT_EQ(g.dmin[r], row.dmin);
      for (int k = 0; k < 3; ++k) EXPECT_EQ(std::memcmp(&g.scale_words[k][r], row.scales + 4 * k, 4), 0);
      for (int q = 0; q < 8; ++q) {
        for (int i = 0; i < 4; ++i) ASSERT_EQ(g.qh[q][r][i], row.qh[4 * q + i]) << r << " " << b;
      }
      for (int c = 0; c < 4; ++c) {
        for (int q = 0; q < 8; ++q) {
          for (int i = 0; i < 4; ++i) ASSERT_EQ(g.qs[c][q][r][i], row.qs[32 * c + 4 * q + i]) << r << " " << b;
        }
      }
    }
  }
}

TEST(WeightInterleave, EveryByteOfEightQ8_0RowsLandsWhereTheLayoutSays) {
  const int64_t n_blocks = 5;
  const auto bytes = random_rows<BlockQ8_0>(kInterleavedRows, n_blocks, 2);
  const auto groups = interleaved<BlockQ8_0x8>(TensorType::Q8_0, bytes, n_blocks);
  for (int r = 0; r < kInterleavedRows; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const BlockQ8_0 row = row_block<BlockQ8_0>(bytes, n_blocks, r, b);
      EXPECT_EQ(groups[b].d[r], row.d);
      for (int q = 0; q < 8; ++q) {
        for (int i = 0; i < 4; ++i) ASSERT_EQ(groups[b].qs[q][r][i], row.qs[4 * q + i]) << r << " " << b;
      }
    }
  }
}

TEST(WeightInterleave, EveryByteOfEightQ5_0RowsLandsWhereTheLayoutSays) {
  const int64_t n_blocks = 4;
  const auto bytes = random_rows<BlockQ5_0>(kInterleavedRows, n_blocks, 5);
  const auto groups = interleaved<BlockQ5_0x8>(TensorType::Q5_0, bytes, n_blocks);
  for (int r = 0; r < kInterleavedRows; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const BlockQ5_0 row = row_block<BlockQ5_0>(bytes, n_blocks, r, b);
      EXPECT_EQ(groups[b].d[r], row.d);
      // The fifth bit of element 4q + i at bit q of byte i, of element 16 + 4q + i at bit 4 + q.
      uint32_t row_qh = 0;
      std::memcpy(&row_qh, row.qh, 4);
      const auto* group_qh = reinterpret_cast<const uint8_t*>(&groups[b].qh[r]);
      for (int q = 0; q < 4; ++q) {
        for (int i = 0; i < 4; ++i) {
          ASSERT_EQ((group_qh[i] >> q) & 1, (row_qh >> (4 * q + i)) & 1) << r << " " << b << " " << q << " " << i;
          ASSERT_EQ((group_qh[i] >> (4 + q)) & 1, (row_qh >> (16 + 4 * q + i)) & 1) << r << " " << b;
        }
      }
      for (int q = 0; q < 4; ++q) {
        for (int i = 0; i < 4; ++i) ASSERT_EQ(groups[b].qs[q][r][i], row.qs[4 * q + i]) << r << " " << b;
      }
    }
  }
}

TEST(WeightInterleave, EveryByteOfEightQ4_0RowsLandsWhereTheLayoutSays) {
  const int64_t n_blocks = 3;
  const auto bytes = random_rows<BlockQ4_0>(kInterleavedRows, n_blocks, 6);
  const auto groups = interleaved<BlockQ4_0x8>(TensorType::Q4_0, bytes, n_blocks);
  for (int r = 0; r < kInterleavedRows; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const BlockQ4_0 row = row_block<BlockQ4_0>(bytes, n_blocks, r, b);
      EXPECT_EQ(groups[b].d[r], row.d);
      for (int q = 0; q < 4; ++q) {
        for (int i = 0; i < 4; ++i) ASSERT_EQ(groups[b].qs[q][r][i], row.qs[4 * q + i]) << r << " " << b;
      }
    }
  }
}

TEST(WeightInterleave, EveryByteOfEightQ6KRowsLandsWhereTheLayoutSays) {
  const int64_t n_blocks = 2;
  const auto bytes = random_rows<BlockQ6_K>(kInterleavedRows, n_blocks, 7);
  const auto groups = interleaved<BlockQ6_Kx8>(TensorType::Q6_K, bytes, n_blocks);
  for (int r = 0; r < kInterleavedRows; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const BlockQ6_K row = row_block<BlockQ6_K>(bytes, n_blocks, r, b);
      const BlockQ6_Kx8& g = groups[b];
      EXPECT_EQ(g.d[r], row.d);
      for (int k = 0; k < 4; ++k) EXPECT_EQ(std::memcmp(&g.scale_words[k][r], row.scales + 4 * k, 4), 0);
      for (int q = 0; q < 32; ++q) {
        for (int i = 0; i < 4; ++i) ASSERT_EQ(g.ql[q][r][i], row.ql[4 * q + i]) << r << " " << b;
      }
      for (int q = 0; q < 16; ++q) {
        for (int i = 0; i < 4; ++i) ASSERT_EQ(g.qh[q][r][i], row.qh[4 * q + i]) << r << " " << b;
      }
    }
  }
}

TEST(WeightInterleave, EachRowComesBackBitForBit) {
  for (TensorType type : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q8_0, TensorType::Q5_0, TensorType::Q4_0, TensorType::Q6_K}) {
    const int64_t n_blocks = 5;
    const size_t row_bytes = size_t(n_blocks) * tensor_type_info(type)->block_bytes;
    std::vector<uint8_t> bytes(kInterleavedRows * row_bytes), groups(bytes.size()), row(row_bytes);
    std::mt19937 rng(3);
    for (uint8_t& b : bytes) b = uint8_t(rng());
    interleave_rows(type, bytes.data(), row_bytes, n_blocks, groups.data());
    EXPECT_NE(groups, bytes);
    for (int r = 0; r < kInterleavedRows; ++r) {
      deinterleave_row(type, groups.data(), n_blocks, r, row.data());
      EXPECT_EQ(std::memcmp(row.data(), bytes.data() + r * row_bytes, row_bytes), 0) << "row " << r;
    }
  }
  EXPECT_FALSE(has_interleaved_layout(TensorType::Q4_1));
}

// The store rearranges Q4_K matrices of whole groups that are multiplied where the kernels read them faster,
// once per file tensor, and hands back every other matrix (lookup tables among them) as it is.
TEST(CpuWeightStore, InterleavesQ4KWhereTheKernelsWantItOncePerTensor) {
  const int64_t n_in = 512, n_super = n_in / QK_K;
  const auto bytes = random_rows<BlockQ4_K>(16, n_super, 3);
  auto store = make_cpu_weight_store();
  const WeightMatrix host{TensorType::Q4_K, bytes.data(), n_in, 16};
  const WeightMatrix placed = store->place(host, false, WeightUse::kMatmul), again = store->place(host, false, WeightUse::kMatmul);
  EXPECT_EQ(placed.interleaved, cpu::matmul_interleaves(TensorType::Q4_K));
  EXPECT_EQ(again.data, placed.data);
  EXPECT_EQ(placed.n_in, n_in);
  EXPECT_EQ(placed.n_out, 16);
  std::vector<float> from_host(4 * n_in), from_placed(4 * n_in);
  const int32_t ids[4] = {0, 15, 9, 8};
  cpu::get_rows(host, ids, 4, from_host.data());
  cpu::get_rows(placed, ids, 4, from_placed.data());
  EXPECT_EQ(std::memcmp(from_host.data(), from_placed.data(), from_host.size() * sizeof(float)), 0);

  const WeightMatrix partial_group{TensorType::Q4_K, bytes.data(), n_in, 12};
  EXPECT_FALSE(store->place(partial_group, false, WeightUse::kMatmul).interleaved);
  const std::vector<uint8_t> table = random_rows<BlockQ4_K>(16, n_super, 4);
  EXPECT_FALSE(store->place(WeightMatrix{TensorType::Q4_K, table.data(), n_in, 16}, false, WeightUse::kLookup).interleaved);
  const WeightMatrix other_type{TensorType::Q4_1, bytes.data(), 256, 16};
  EXPECT_EQ(store->place(other_type, false, WeightUse::kMatmul).data, other_type.data);
}

}  // namespace
}  // namespace sparrow::formats
