// Optimized CPU ops of polar4 (PolarQuant), compiled once per SIMD target through hwy/foreach_target.h and
// picked at run time; same bytes as the reference in formats/kv/polar.cpp.
//
// Encode: each level of the polar transform is one pass over an array of pairs (the rotated coordinates, then
// the radii of the previous level): radius = sqrt(a^2 + b^2) and the angle's cell, found without atan2 by
// comparing the pair against the cell boundaries (psi > theta <=> b cos theta > a sin theta for a, b >= 0; the
// level-1 circle is folded into its first quadrant by the signs). It may differ from the reference only where an
// angle or norm lies within float rounding of a cell boundary or an fp16 tie.
// Decode, score, accumulate, expand: a coordinate is its group's radius times one cos or sin factor per level;
// a vector of coordinates finds its four levels' codes with per-lane shifts of two words of the group's codes and
// looks the factors up in registers (ForEachGroupVector). Decode and expand multiply in the reference's order and
// are bit-exact; score and accumulate fold the query or weight in and differ only by float rounding.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/polar.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cmath>

#include "cpu/kv/cpu_codec_registry.h"
#include "cpu/kv/dispatched_codec.h"
#include "formats/kv/codec_registry.h"
#include "formats/kv/polar.h"
#include "formats/kv/rotation.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace polar = formats::polar;

using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;

// ---------------------------------------------------------------------------------------------------------
// Encode.

// The cos and sin of the boundaries a level compares against: level 1 the multiples of pi/8 in the first
// quadrant, levels 2-4 the midpoints between neighbouring centroids.
struct Boundaries {
  float cos[3], sin[3];
};

Boundaries QuarterBoundaries(int level) {
  const polar::AngleCodebook& book = polar::angle_codebook(level);
  Boundaries b;
  for (int i = 0; i < 3; ++i) {
    const double mid = 0.5 * (book.centroid[i] + book.centroid[i + 1]);
    b.cos[i] = float(std::cos(mid));
    b.sin[i] = float(std::sin(mid));
  }
  return b;
}

Boundaries CircleBoundaries() {
  Boundaries b;
  for (int i = 0; i < 3; ++i) {
    const double theta = (i + 1) * 3.14159265358979323846 / 8;
    b.cos[i] = float(std::cos(theta));
    b.sin[i] = float(std::sin(theta));
  }
  return b;
}

// Splits 2N consecutive floats into their even and odd elements.
HWY_INLINE void LoadPairs(DF df, const float* p, VF& even, VF& odd) {
#if HWY_TARGET == HWY_SCALAR
  even = hn::Set(df, p[0]);
  odd = hn::Set(df, p[1]);
#else
  const int N = int(hn::Lanes(df));
  const VF lo = hn::LoadU(df, p), hi = hn::LoadU(df, p + N);
  even = hn::ConcatEven(df, hi, lo);
  odd = hn::ConcatOdd(df, hi, lo);
#endif
}

// How many of the three boundaries the angle atan2(y, x) (x, y >= 0) lies at or beyond (kStrict: beyond).
template <bool kStrict>
HWY_INLINE VF CountBeyond(DF df, VF x, VF y, const Boundaries& b) {
  VF count = hn::Zero(df);
  const VF one = hn::Set(df, 1.0f);
  for (int i = 0; i < 3; ++i) {
    const VF lhs = hn::Mul(y, hn::Set(df, b.cos[i])), rhs = hn::Mul(x, hn::Set(df, b.sin[i]));
    count = hn::Add(count, hn::IfThenElseZero(kStrict ? hn::Gt(lhs, rhs) : hn::Ge(lhs, rhs), one));
  }
  return count;
}

HWY_INLINE void StoreCodes(DF df, VF codes, uint8_t* out) {
  const hn::Rebind<uint8_t, DF> du8;
  hn::StoreU(hn::DemoteTo(du8, hn::ConvertTo(hn::RebindToSigned<DF>(), codes)), du8, out);
}

// Level 1 on N pairs (a, b): the cell of atan2(b, a) in [0, 2pi) among 16 of width pi/8 (as the reference:
// cell = floor(psi / (pi/8)), NaN in cell 0). With phi the angle of (|a|, |b|) in the first quadrant:
// quadrant I  psi = phi        -> cell = #{theta in pi/8, pi/4, 3pi/8 : phi >= theta}
// quadrant II psi = pi - phi   -> cell = 8 - #{theta in 0, pi/8, pi/4, 3pi/8 : phi > theta}
// quadrant III psi = pi + phi  -> cell = 8 + (as quadrant I)
// quadrant IV psi = 2pi - phi  -> cell = 16 - (as quadrant II)
HWY_INLINE VF CircleCells(DF df, VF a, VF b, const Boundaries& bounds) {
  const VF zero = hn::Zero(df);
  const VF x = hn::Abs(a), y = hn::Abs(b);
  const VF at_or_beyond = CountBeyond<false>(df, x, y, bounds);
  const VF beyond = hn::Add(CountBeyond<true>(df, x, y, bounds), hn::IfThenElseZero(hn::Gt(y, zero), hn::Set(df, 1.0f)));
  const auto a_nonnegative = hn::Ge(a, zero), b_nonnegative = hn::Ge(b, zero);
  const VF eight = hn::Set(df, 8.0f), sixteen = hn::Set(df, 16.0f);
  const VF right = hn::IfThenElse(b_nonnegative, at_or_beyond, hn::Min(hn::Sub(sixteen, beyond), hn::Set(df, 15.0f)));
  const VF left = hn::IfThenElse(b_nonnegative, hn::Sub(eight, beyond), hn::Add(eight, at_or_beyond));
  const VF cells = hn::IfThenElse(a_nonnegative, right, left);
  const auto is_nan = hn::Or(hn::Ne(a, a), hn::Ne(b, b));
  return hn::IfThenZeroElse(is_nan, cells);
}

// One level of the transform over `pairs` pairs of `in` (interleaved): radius[p] and code[p] of each pair.
template <bool kCircle>
void PolarLevel(const float* HWY_RESTRICT in, int pairs, const Boundaries& bounds, float* HWY_RESTRICT radius,
                uint8_t* HWY_RESTRICT code) {
  const DF df;
  const int N = int(hn::Lanes(df));
  int p = 0;
  for (; p + N <= pairs; p += N) {
    VF a, b;
    LoadPairs(df, in + 2 * p, a, b);
    hn::StoreU(hn::Sqrt(hn::Add(hn::Mul(a, a), hn::Mul(b, b))), df, radius + p);
    StoreCodes(df, kCircle ? CircleCells(df, a, b, bounds) : CountBeyond<true>(df, a, b, bounds), code + p);
  }
  // Fewer than N pairs left (the upper levels at small head dims): the same math on a broadcast pair.
  for (; p < pairs; ++p) {
    const VF a = hn::Set(df, in[2 * p]), b = hn::Set(df, in[2 * p + 1]);
    radius[p] = hn::GetLane(hn::Sqrt(hn::Add(hn::Mul(a, a), hn::Mul(b, b))));
    uint8_t lanes[16];
    StoreCodes(df, kCircle ? CircleCells(df, a, b, bounds) : CountBeyond<true>(df, a, b, bounds), lanes);
    code[p] = lanes[0];
  }
}

void Polar4EncodeRotated(const float* y, int d, uint8_t* block) {
  static const Boundaries circle = CircleBoundaries();
  static const Boundaries quarter[3] = {QuarterBoundaries(2), QuarterBoundaries(3), QuarterBoundaries(4)};
  constexpr int kMax = polar::kMaxHeadDim;
  HWY_ALIGN float r1[kMax / 2], r2[kMax / 4], r3[kMax / 8], r4[kMax / 16];
  uint8_t c1[kMax / 2], c2[kMax / 4], c3[kMax / 8], c4[kMax / 16];
  PolarLevel<true>(y, d / 2, circle, r1, c1);
  PolarLevel<false>(r1, d / 4, quarter[0], r2, c2);
  PolarLevel<false>(r2, d / 8, quarter[1], r3, c3);
  PolarLevel<false>(r3, d / 16, quarter[2], r4, c4);
  for (int group = 0; group < d / polar::kGroupElements; ++group) {
    uint8_t* chunk = block + (group / polar::kGroupsPerChunk) * polar::kChunkBytes;
    const int g = group % polar::kGroupsPerChunk;
    polar::GroupCodes codes;
    for (int p = 0; p < 8; ++p) codes.level1[p] = c1[8 * group + p];
    for (int j = 0; j < 4; ++j) codes.level2[j] = c2[4 * group + j];
    for (int j = 0; j < 2; ++j) codes.level3[j] = c3[2 * group + j];
    codes.level4 = c4[group];
    polar::write_group_codes(chunk, g, codes);
    polar::write_group_radius(chunk, g, r4[group]);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Decode, score, accumulate, expand.

// Per-lane constants of a group's 16 coordinates e (see ForEachGroupVector): where each level's code of e sits in
// the group's code words, and which half of that level's [cos, sin] table e reads.
struct LaneFields {
  HWY_ALIGN uint32_t level1_shift[16] = {}, level1_half[16] = {};
  HWY_ALIGN uint32_t level2_shift[16] = {}, level2_half[16] = {};
  HWY_ALIGN uint32_t level3_shift[16] = {}, level3_half[16] = {};
  HWY_ALIGN uint32_t level4_half[16] = {};
  constexpr LaneFields() {
    for (uint32_t e = 0; e < 16; ++e) {
      level1_shift[e] = 4 * (e >> 1);       // pair e / 2: nibble e / 2 of the four level-1 bytes
      level1_half[e] = 16 * (e & 1);        // sin for the second coordinate of the pair
      level2_shift[e] = 2 * (e >> 2);       // node e / 4: bits 2 (e / 4) of the level-2 byte
      level2_half[e] = 4 * ((e >> 1) & 1);
      level3_shift[e] = 8 + 2 * (e >> 3);   // node e / 8: bits 2 (e / 8) of the group's level-3 nibble
      level3_half[e] = 4 * ((e >> 2) & 1);
      level4_half[e] = 4 * ((e >> 3) & 1);
    }
  }
};

// Each level's factors, cos then sin, zero-padded to a whole number of 16-lane vectors.
struct FactorTables {
  HWY_ALIGN float level1[32];
  HWY_ALIGN float level2[16], level3[16], level4[16];
};

const FactorTables& Factors() {
  static const FactorTables tables = [] {
    FactorTables t{};
    float* level[polar::kLevels] = {t.level1, t.level2, t.level3, t.level4};
    for (int l = 0; l < polar::kLevels; ++l) {
      const polar::AngleCodebook& book = polar::angle_codebook(l + 1);
      for (int c = 0; c < book.size; ++c) {
        level[l][c] = book.cos[c];
        level[l][book.size + c] = book.sin[c];
      }
    }
    return t;
  }();
  return tables;
}

// table[index] per lane, index < kSize; the table is readable (zero-padded) to a multiple of 16 floats. One
// permute per N entries, merged by selects when the table is wider than a vector.
template <int kSize>
HWY_INLINE VF Lookup(const float* HWY_RESTRICT table, hn::Vec<DU> index) {
  const DF df;
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(df, table[hn::GetLane(index)]);
#else
  const DI di;
  const int N = int(hn::Lanes(df));
  const hn::Vec<DI> code = hn::BitCast(di, index);
  if (N >= kSize) return hn::TableLookupLanes(hn::Load(df, table), hn::IndicesFromVec(df, code));
  const auto lane = hn::IndicesFromVec(df, hn::And(code, hn::Set(di, N - 1)));
  const hn::Vec<DI> chunk = hn::ShiftRightSame(code, int(hwy::FloorLog2(size_t(N))));
  VF result = hn::TableLookupLanes(hn::Load(df, table), lane);
  for (int c = 1; c * N < kSize; ++c) {
    const auto in_chunk = hn::RebindMask(df, hn::Eq(chunk, hn::Set(di, c)));
    result = hn::IfThenElse(in_chunk, hn::TableLookupLanes(hn::Load(df, table + c * N), lane), result);
  }
  return result;
#endif
}

// The code of each lane's node at one level: (word >> shift) & mask, plus the half of the table it reads.
HWY_INLINE hn::Vec<DU> TableIndex(hn::Vec<DU> word, const uint32_t* shift, uint32_t mask, const uint32_t* half) {
  const DU du;
  return hn::Add(hn::And(hn::Shr(word, hn::Load(du, shift)), hn::Set(du, mask)), hn::Load(du, half));
}

// Calls visit(first coordinate, values) for every vector of the head's reconstruction (in the rotated basis).
// Coordinate e of a group (0..15) is the group's radius times one factor per level l, the cos (first child) or
// sin (second child) of the centroid of its node e >> l, multiplied in the reference's order:
// y_e = (((radius * f4) * f3) * f2) * f1. A vector covers N consecutive coordinates of a group; its lanes find
// their codes in two words per group (the four level-1 bytes; the level-2 byte, level-3 nibble and level-4 code).
template <class Visit>
HWY_INLINE void ForEachGroupVector(const uint8_t* HWY_RESTRICT block, int d, const Visit& visit) {
  static constexpr LaneFields kLane;
  const DF df;
  const DU du;
  const int N = int(hn::Lanes(df));
  const hn::CappedTag<float, 1> d1;
  const hn::Rebind<hwy::float16_t, decltype(d1)> dh;
  const FactorTables& t = Factors();
  for (int group = 0; group < d / polar::kGroupElements; ++group) {
    const uint8_t* chunk = block + (group / polar::kGroupsPerChunk) * polar::kChunkBytes;
    const int g = group % polar::kGroupsPerChunk;
    const uint8_t* level1 = chunk + polar::kLevel1Offset + 4 * g;
    const uint32_t level1_word =
        uint32_t(level1[0]) | uint32_t(level1[1]) << 8 | uint32_t(level1[2]) << 16 | uint32_t(level1[3]) << 24;
    const uint32_t level3_nibble = (chunk[polar::kLevel3Offset + g / 2] >> (4 * (g % 2))) & 15;
    const uint32_t upper_word = chunk[polar::kLevel2Offset + g] | level3_nibble << 8;
    const uint32_t level4_code = (chunk[polar::kLevel4Offset] >> (2 * g)) & 3;
    const auto* radius_half = reinterpret_cast<const hwy::float16_t*>(chunk + polar::kRadiiOffset + 2 * g);
    const VF radius = hn::Set(df, hn::GetLane(hn::PromoteTo(d1, hn::LoadU(dh, radius_half))));  // exact
    const hn::Vec<DU> words1 = hn::Set(du, level1_word), upper = hn::Set(du, upper_word);
    for (int e = 0; e < polar::kGroupElements; e += N) {
      const VF f4 = Lookup<8>(t.level4, hn::Add(hn::Set(du, level4_code), hn::Load(du, kLane.level4_half + e)));
      const VF f3 = Lookup<8>(t.level3, TableIndex(upper, kLane.level3_shift + e, 3, kLane.level3_half + e));
      const VF f2 = Lookup<8>(t.level2, TableIndex(upper, kLane.level2_shift + e, 3, kLane.level2_half + e));
      const VF f1 = Lookup<32>(t.level1, TableIndex(words1, kLane.level1_shift + e, 15, kLane.level1_half + e));
      visit(group * polar::kGroupElements + e, hn::Mul(hn::Mul(hn::Mul(hn::Mul(radius, f4), f3), f2), f1));
    }
  }
}

void Polar4DecodeRotated(const uint8_t* block, int d, float* y) {
  const DF df;
  ForEachGroupVector(block, d, [&](int i, VF value) { hn::StoreU(value, df, y + i); });
}

float Polar4Score(const float* q, const uint8_t* block, int d) {
  const DF df;
  VF sum = hn::Zero(df);
  ForEachGroupVector(block, d, [&](int i, VF value) { sum = hn::MulAdd(hn::LoadU(df, q + i), value, sum); });
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

void Polar4Accumulate(float w, const uint8_t* block, int d, float* acc) {
  const DF df;
  const VF weight = hn::Set(df, w);
  ForEachGroupVector(block, d, [&](int i, VF value) {
    hn::StoreU(hn::MulAdd(weight, value, hn::LoadU(df, acc + i)), df, acc + i);
  });
}

// The rows of n consecutive blocks: the reconstruction in the rotated basis (decode's values).
void Polar4Expand(const uint8_t* blocks, int n, int d, float* rows) {
  const size_t block_bytes = size_t(d / polar::kChunkElements) * polar::kChunkBytes;
  for (int j = 0; j < n; ++j, blocks += block_bytes, rows += d) Polar4DecodeRotated(blocks, d, rows);
}

// Queries enter the rotated basis and output rows leave it through the shared scalar rotation.
using Polar4Kernels = CheckedKernels<formats::polar4_codec, encode_rotating<Polar4EncodeRotated>,
                                     decode_rotating<Polar4DecodeRotated>, formats::hadamard_rotate, Polar4Score,
                                     Polar4Accumulate, formats::hadamard_unrotate, Polar4Expand>;

// This target's kernels.
const CodecKernels& Polar4CodecKernels() { return Polar4Kernels::kTable; }

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparrow::cpu {

HWY_EXPORT(Polar4CodecKernels);

const CodecKernels& polar4_kernels() { return HWY_DYNAMIC_DISPATCH(Polar4CodecKernels)(); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
