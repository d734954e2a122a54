#pragma once
// PolarQuant (polar4; Han, Kacham, Karbasi, Mirrokni, Zandieh, arXiv 2502.02617): rotate the head vector with the
// shared randomized Hadamard transform, then turn every group of 16 rotated coordinates into one radius and 15
// angles by a 4-level recursive polar transform:
//   level 1: coordinate pairs (a, b)            -> (sqrt(a^2 + b^2), atan2(b, a) in [0, 2pi))   8 angles, 4 bits
//   level l = 2..4: radius pairs (r0, r1)       -> (sqrt(r0^2 + r1^2), atan2(r1, r0) in [0, pi/2])  4, 2, 1 angles, 2 bits
// and keep the final radius (the group's norm) as fp16: 8*4 + 4*2 + 2*2 + 1*2 + 16 = 62 bits per 16 coordinates,
// 3.875 bits per element at every head dim. Decoding multiplies the radius down the tree by the cosines and sines
// of the angle centroids, so the reconstruction always has exactly the stored norm. The angle codebooks are
// Lloyd-Max quantizers of the angle densities (scripts/gen-polar-codebooks).
//
// Byte layout (byte-aligned fields only): a block is d/64 chunks of 31 bytes, chunk c covering rotated coordinates
// [64c, 64c + 64) as 4 groups g of 16:
//   bytes  0..7   fp16 radius of group g at 2g (little-endian)
//   bytes  8..23  level-1 angles: group g's pair p (coordinates 2p, 2p+1 of the group) in byte 8 + 4g + p/2,
//                 low nibble for even p
//   bytes 24..27  level-2 angles: group g in byte 24 + g, node j (pairs 2j, 2j+1) in bits 2j..2j+1
//   bytes 28..29  level-3 angles: group g's node j (level-2 nodes 2j, 2j+1) in byte 28 + g/2, bits 4(g%2) + 2j
//   byte  30      level-4 angle of group g in bits 2g..2g+1
// Angle codes index the centroids in increasing angle order.
#include <cstddef>
#include <cstdint>

namespace sparrow::formats::polar {

inline constexpr int kMaxHeadDim = 512;
inline constexpr int kGroupElements = 16;   // coordinates per stored radius
inline constexpr int kChunkElements = 64;   // coordinates per byte-aligned chunk
inline constexpr int kGroupsPerChunk = kChunkElements / kGroupElements;
inline constexpr size_t kChunkBytes = 31;
inline constexpr size_t kRadiiOffset = 0, kLevel1Offset = 8, kLevel2Offset = 24, kLevel3Offset = 28,
                        kLevel4Offset = 30;
inline constexpr int kLevels = 4;
inline constexpr int kAnglesPerGroup[kLevels] = {8, 4, 2, 1};
inline constexpr int kAngleCodes[kLevels] = {16, 4, 4, 4};  // centroids per level (4 or 2 bits)

// Bytes of one encoded head vector; throws sparrow::Error unless d is a supported head dim.
size_t block_bytes(int d);

// One level's angle codebook: centroids (radians, increasing) and their cosines and sines as floats, the values
// decoding multiplies by. `size` entries are valid (16 for level 1, 4 otherwise).
struct AngleCodebook {
  int size;
  double centroid[16];
  float cos[16];
  float sin[16];
};
const AngleCodebook& angle_codebook(int level);  // level 1..4

// The 15 angle codes of one group, unpacked.
struct GroupCodes {
  uint8_t level1[8];
  uint8_t level2[4];
  uint8_t level3[2];
  uint8_t level4;
};
GroupCodes read_group_codes(const uint8_t* chunk, int group);
void write_group_codes(uint8_t* chunk, int group, const GroupCodes& codes);
float read_group_radius(const uint8_t* chunk, int group);
// The group norm as fp16; values above 65504 saturate (NaN stays NaN). Shared by the reference and the
// optimized encoder.
void write_group_radius(uint8_t* chunk, int group, float radius);

}  // namespace sparrow::formats::polar
