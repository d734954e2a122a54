// PolarQuant (polar4), reference ops: plain scalar code that follows the recursive polar transform of
// arXiv 2502.02617 (section 3) group by group; layout and bit budget in polar.h. The rotation is orthogonal, so a
// prepared query is R q, a score is <R q, y^> computed group by group from the codes (never un-rotating a key),
// and V is accumulated in the rotated basis and un-rotated once per output row by finish.
#include "formats/kv/polar.h"

#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "formats/kv/codec_registry.h"
#include "formats/kv/rotation.h"
#include "formats/weight_formats.h"
#include "util/error.h"

namespace sparrow::formats {
namespace polar {
namespace {

#include "formats/kv/polar_codebooks.inc"

constexpr double kPi = 3.14159265358979323846;

void check_head_dim(const char* op, int d) {
  if (!kv_head_dim_supported(d)) {
    throw Error(std::string("kv codec polar4 ") + op + ": head dim " + std::to_string(d) +
                " is not supported (expected 64, 128, 256 or 512)");
  }
}

AngleCodebook make_codebook(const double* centroids, int size) {
  AngleCodebook book{};
  book.size = size;
  for (int i = 0; i < size; ++i) {
    book.centroid[i] = centroids[i];
    book.cos[i] = float(std::cos(centroids[i]));
    book.sin[i] = float(std::sin(centroids[i]));
  }
  return book;
}

// Level 1: the cell of the uniform 16-cell quantizer of [0, 2pi) that holds atan2(b, a). NaN lands in cell 0.
uint8_t quantize_full_angle(double a, double b) {
  double psi = std::atan2(b, a);
  if (psi < 0) psi += 2 * kPi;
  const double cell = psi * 16 / (2 * kPi);
  if (!(cell >= 0)) return 0;
  return uint8_t(cell >= 15 ? 15 : int(cell));
}

// Levels 2-4: the nearest centroid of atan2(r1, r0) in [0, pi/2] (Lloyd-Max cells are nearest-neighbour cells).
uint8_t quantize_quarter_angle(const AngleCodebook& book, double r0, double r1) {
  const double psi = std::atan2(r1, r0);
  int best = 0;
  for (int i = 1; i < book.size; ++i)
    if (std::fabs(psi - book.centroid[i]) < std::fabs(psi - book.centroid[best])) best = i;
  return uint8_t(best);
}

// Encodes the 16 rotated coordinates y of group g into its chunk (whose code bytes start zeroed).
void encode_group(const float* y, uint8_t* chunk, int g) {
  GroupCodes codes{};
  double radius1[8], radius2[4], radius3[2];
  for (int p = 0; p < 8; ++p) {
    const double a = y[2 * p], b = y[2 * p + 1];
    radius1[p] = std::sqrt(a * a + b * b);
    codes.level1[p] = quantize_full_angle(a, b);
  }
  for (int j = 0; j < 4; ++j) {
    radius2[j] = std::sqrt(radius1[2 * j] * radius1[2 * j] + radius1[2 * j + 1] * radius1[2 * j + 1]);
    codes.level2[j] = quantize_quarter_angle(angle_codebook(2), radius1[2 * j], radius1[2 * j + 1]);
  }
  for (int j = 0; j < 2; ++j) {
    radius3[j] = std::sqrt(radius2[2 * j] * radius2[2 * j] + radius2[2 * j + 1] * radius2[2 * j + 1]);
    codes.level3[j] = quantize_quarter_angle(angle_codebook(3), radius2[2 * j], radius2[2 * j + 1]);
  }
  codes.level4 = quantize_quarter_angle(angle_codebook(4), radius3[0], radius3[1]);
  write_group_radius(chunk, g, float(std::sqrt(radius3[0] * radius3[0] + radius3[1] * radius3[1])));
  write_group_codes(chunk, g, codes);
}

// The 16 reconstructed rotated coordinates of group g: the radius, times down the tree the cosine (first child)
// or sine (second child) of each level's centroid.
void decode_group(const uint8_t* chunk, int g, float* y) {
  const GroupCodes codes = read_group_codes(chunk, g);
  const AngleCodebook &l1 = angle_codebook(1), &l2 = angle_codebook(2), &l3 = angle_codebook(3),
                      &l4 = angle_codebook(4);
  const float radius = read_group_radius(chunk, g);
  const float radius3[2] = {radius * l4.cos[codes.level4], radius * l4.sin[codes.level4]};
  float radius2[4], radius1[8];
  for (int j = 0; j < 2; ++j) {
    radius2[2 * j] = radius3[j] * l3.cos[codes.level3[j]];
    radius2[2 * j + 1] = radius3[j] * l3.sin[codes.level3[j]];
  }
  for (int j = 0; j < 4; ++j) {
    radius1[2 * j] = radius2[j] * l2.cos[codes.level2[j]];
    radius1[2 * j + 1] = radius2[j] * l2.sin[codes.level2[j]];
  }
  for (int p = 0; p < 8; ++p) {
    y[2 * p] = radius1[p] * l1.cos[codes.level1[p]];
    y[2 * p + 1] = radius1[p] * l1.sin[codes.level1[p]];
  }
}

// <q, y^> of group g, bottom-up: the same tree as decode_group with the query folded in pair by pair, so no
// coordinate is materialised.
float score_group(const float* q, const uint8_t* chunk, int g) {
  const GroupCodes codes = read_group_codes(chunk, g);
  const AngleCodebook &l1 = angle_codebook(1), &l2 = angle_codebook(2), &l3 = angle_codebook(3),
                      &l4 = angle_codebook(4);
  float s1[8], s2[4], s3[2];
  for (int p = 0; p < 8; ++p) s1[p] = q[2 * p] * l1.cos[codes.level1[p]] + q[2 * p + 1] * l1.sin[codes.level1[p]];
  for (int j = 0; j < 4; ++j) s2[j] = s1[2 * j] * l2.cos[codes.level2[j]] + s1[2 * j + 1] * l2.sin[codes.level2[j]];
  for (int j = 0; j < 2; ++j) s3[j] = s2[2 * j] * l3.cos[codes.level3[j]] + s2[2 * j + 1] * l3.sin[codes.level3[j]];
  const float s4 = s3[0] * l4.cos[codes.level4] + s3[1] * l4.sin[codes.level4];
  return read_group_radius(chunk, g) * s4;
}

void encode_rotated(const float* y, int d, uint8_t* block) {
  std::memset(block, 0, block_bytes(d));
  for (int c = 0; c < d / kChunkElements; ++c)
    for (int g = 0; g < kGroupsPerChunk; ++g)
      encode_group(y + c * kChunkElements + g * kGroupElements, block + c * kChunkBytes, g);
}

void decode_rotated(const uint8_t* block, int d, float* y) {
  for (int c = 0; c < d / kChunkElements; ++c)
    for (int g = 0; g < kGroupsPerChunk; ++g)
      decode_group(block + c * kChunkBytes, g, y + c * kChunkElements + g * kGroupElements);
}

void reference_encode(const float* x, int d, uint8_t* block) {
  check_head_dim("encode", d);
  std::array<float, kMaxHeadDim> y;
  hadamard_rotate(x, d, y.data());
  encode_rotated(y.data(), d, block);
}

void reference_decode(const uint8_t* block, int d, float* x) {
  check_head_dim("decode", d);
  decode_rotated(block, d, x);
  hadamard_unrotate(x, d, x);
}

void reference_prepare_query(const float* q, int d, float* prepared) {
  check_head_dim("prepare_query", d);
  hadamard_rotate(q, d, prepared);
}

float reference_score(const float* prepared, const uint8_t* block, int d) {
  check_head_dim("score", d);
  double sum = 0;
  for (int c = 0; c < d / kChunkElements; ++c)
    for (int g = 0; g < kGroupsPerChunk; ++g)
      sum += score_group(prepared + c * kChunkElements + g * kGroupElements, block + c * kChunkBytes, g);
  return float(sum);
}

void reference_accumulate(float w, const uint8_t* block, int d, float* acc) {
  check_head_dim("accumulate", d);
  float y[kGroupElements];
  for (int c = 0; c < d / kChunkElements; ++c)
    for (int g = 0; g < kGroupsPerChunk; ++g) {
      decode_group(block + c * kChunkBytes, g, y);
      float* out = acc + c * kChunkElements + g * kGroupElements;
      for (int i = 0; i < kGroupElements; ++i) out[i] += w * y[i];
    }
}

void reference_finish(const float* acc, int d, float* out) {
  check_head_dim("finish", d);
  hadamard_unrotate(acc, d, out);
}

size_t head_dim_floats(int d) {
  check_head_dim("query/accumulator size", d);
  return size_t(d);
}

constexpr KvCodecOps kReferenceOps = {reference_encode, reference_decode,     reference_prepare_query,
                                      reference_score,  reference_accumulate, reference_finish};

}  // namespace

size_t block_bytes(int d) {
  check_head_dim("block size", d);
  return size_t(d / kChunkElements) * kChunkBytes;
}

const AngleCodebook& angle_codebook(int level) {
  static const std::array<AngleCodebook, kLevels> books = {
      make_codebook(kPolarLevel1Centroids, 16), make_codebook(kPolarLevel2Centroids, 4),
      make_codebook(kPolarLevel3Centroids, 4), make_codebook(kPolarLevel4Centroids, 4)};
  if (level < 1 || level > kLevels)
    throw Error("polar4: angle level " + std::to_string(level) + " does not exist (expected 1..4)");
  return books[level - 1];
}

GroupCodes read_group_codes(const uint8_t* chunk, int g) {
  GroupCodes codes;
  for (int p = 0; p < 8; ++p) codes.level1[p] = (chunk[kLevel1Offset + 4 * g + p / 2] >> (4 * (p % 2))) & 15;
  for (int j = 0; j < 4; ++j) codes.level2[j] = (chunk[kLevel2Offset + g] >> (2 * j)) & 3;
  for (int j = 0; j < 2; ++j) codes.level3[j] = (chunk[kLevel3Offset + g / 2] >> (4 * (g % 2) + 2 * j)) & 3;
  codes.level4 = (chunk[kLevel4Offset] >> (2 * g)) & 3;
  return codes;
}

namespace {
void set_bits(uint8_t& byte, int shift, int width, uint8_t value) {
  const uint8_t mask = uint8_t(((1 << width) - 1) << shift);
  byte = uint8_t((byte & ~mask) | ((value << shift) & mask));
}
}  // namespace

void write_group_codes(uint8_t* chunk, int g, const GroupCodes& codes) {
  for (int p = 0; p < 8; ++p) set_bits(chunk[kLevel1Offset + 4 * g + p / 2], 4 * (p % 2), 4, codes.level1[p]);
  for (int j = 0; j < 4; ++j) set_bits(chunk[kLevel2Offset + g], 2 * j, 2, codes.level2[j]);
  for (int j = 0; j < 2; ++j) set_bits(chunk[kLevel3Offset + g / 2], 4 * (g % 2) + 2 * j, 2, codes.level3[j]);
  set_bits(chunk[kLevel4Offset], 2 * g, 2, codes.level4);
}

float read_group_radius(const uint8_t* chunk, int g) {
  f16_bits h;
  std::memcpy(&h, chunk + kRadiiOffset + 2 * g, 2);
  return f16_to_f32(h);
}

void write_group_radius(uint8_t* chunk, int g, float radius) {
  if (radius > 65504.0f) radius = 65504.0f;  // largest finite fp16; NaN stays NaN
  const f16_bits h = f32_to_f16(radius);
  std::memcpy(chunk + kRadiiOffset + 2 * g, &h, 2);
}

}  // namespace polar

const KvCodecInfo& polar4_codec() {
  static const KvCodecInfo info = {KvCodec::POLAR4, "polar4", false, polar::block_bytes, polar::head_dim_floats,
                                   polar::head_dim_floats, &polar::kReferenceOps};
  return info;
}

}  // namespace sparrow::formats
