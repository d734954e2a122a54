// Optimized CPU ops of polar4 (PolarQuant), compiled once per SIMD target through hwy/foreach_target.h and
// picked at run time; same bytes as the reference in formats/kv/polar.cpp.
//
// Encode: each level of the polar transform is one pass over an array of pairs (the rotated coordinates, then
// the radii of the previous level): radius = sqrt(a^2 + b^2) and the angle's cell, found without atan2 by
// comparing the pair against the cell boundaries (psi > theta <=> b cos theta > a sin theta for a, b >= 0; the
// level-1 circle is folded into its first quadrant by the signs). It may differ from the reference only where an
// angle or norm lies within float rounding of a cell boundary or an fp16 tie.
// Decode, score, accumulate: within a group of 16 coordinates, the level-3 and level-4 factors and the radius are
// constant over each run of 4 coordinates, so a quad is radius2 (one scalar) times a 4-float row selected by the
// level-2 code (cos, cos, sin, sin) times a 4-float row selected by the level-1 byte (cos, sin, cos, sin of its two
// angles). Decode multiplies in the reference's order and is bit-exact; score and accumulate fold the query or
// weight in and differ only by float rounding.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/polar.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cmath>

#include "formats/kv/polar.h"
#include "formats/kv/rotation.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace polar = formats::polar;

using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using DQ = hn::CappedTag<float, 4>;  // one quad of coordinates (1 lane on the scalar target)
using VQ = hn::Vec<DQ>;

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
// Decode, score, accumulate.

struct QuadTables {
  HWY_ALIGN float level1[256][4];  // byte of two level-1 codes -> cos lo, sin lo, cos hi, sin hi
  HWY_ALIGN float level2[4][4];    // level-2 code -> cos, cos, sin, sin
};

const QuadTables& Tables() {
  static const QuadTables tables = [] {
    QuadTables t;
    const polar::AngleCodebook &l1 = polar::angle_codebook(1), &l2 = polar::angle_codebook(2);
    for (int byte = 0; byte < 256; ++byte) {
      const int lo = byte & 15, hi = byte >> 4;
      t.level1[byte][0] = l1.cos[lo];
      t.level1[byte][1] = l1.sin[lo];
      t.level1[byte][2] = l1.cos[hi];
      t.level1[byte][3] = l1.sin[hi];
    }
    for (int c = 0; c < 4; ++c) {
      t.level2[c][0] = t.level2[c][1] = l2.cos[c];
      t.level2[c][2] = t.level2[c][3] = l2.sin[c];
    }
    return t;
  }();
  return tables;
}

// The level-2 radius of every quad of the head (d / 4 floats): group radius * level-4 factor * level-3 factor,
// in the reference's order. The chunk's four fp16 radii are promoted together (exactly, on every target).
HWY_INLINE void QuadRadii(const uint8_t* HWY_RESTRICT block, int d, float* HWY_RESTRICT radius2) {
  const polar::AngleCodebook &l3 = polar::angle_codebook(3), &l4 = polar::angle_codebook(4);
  const DQ dq;
  const hn::Rebind<hwy::float16_t, DQ> dh;
  const int N = int(hn::Lanes(dq));
  for (int c = 0; c < d / polar::kChunkElements; ++c) {
    const uint8_t* chunk = block + c * polar::kChunkBytes;
    float radius[polar::kGroupsPerChunk];
    for (int g = 0; g < polar::kGroupsPerChunk; g += N) {
      const auto* halves = reinterpret_cast<const hwy::float16_t*>(chunk + polar::kRadiiOffset + 2 * g);
      hn::StoreU(hn::PromoteTo(dq, hn::LoadU(dh, halves)), dq, radius + g);
    }
    for (int g = 0; g < polar::kGroupsPerChunk; ++g) {
      const int c4 = (chunk[polar::kLevel4Offset] >> (2 * g)) & 3;
      const int level3 = chunk[polar::kLevel3Offset + g / 2] >> (4 * (g % 2));
      const int c30 = level3 & 3, c31 = (level3 >> 2) & 3;
      const float radius3[2] = {radius[g] * l4.cos[c4], radius[g] * l4.sin[c4]};
      float* out = radius2 + 4 * (c * polar::kGroupsPerChunk + g);
      out[0] = radius3[0] * l3.cos[c30];
      out[1] = radius3[0] * l3.sin[c30];
      out[2] = radius3[1] * l3.cos[c31];
      out[3] = radius3[1] * l3.sin[c31];
    }
  }
}

// Calls visit(first coordinate, values) for every vector of the head's reconstruction (in the rotated basis):
// a quad is (radius2 * level-2 row) * level-1 row, the reference's order of products.
template <class Visit>
HWY_INLINE void ForEachQuadVector(const uint8_t* HWY_RESTRICT block, int d, const Visit& visit) {
  const DQ dq;
  const int N = int(hn::Lanes(dq));
  const QuadTables& t = Tables();
  HWY_ALIGN float radius2[polar::kMaxHeadDim / 4];
  QuadRadii(block, d, radius2);
  constexpr int kQuadsPerChunk = polar::kChunkElements / 4;
  for (int quad = 0; quad < d / 4; ++quad) {
    const uint8_t* chunk = block + (quad / kQuadsPerChunk) * polar::kChunkBytes;
    const int q = quad % kQuadsPerChunk;  // 4 g + i: level-1 byte q, level-2 byte g, bits 2i
    const float* f1 = t.level1[chunk[polar::kLevel1Offset + q]];
    const float* f2 = t.level2[(chunk[polar::kLevel2Offset + q / 4] >> (2 * (q % 4))) & 3];
    const VQ r2 = hn::Set(dq, radius2[quad]);
    for (int lane = 0; lane < 4; lane += N)
      visit(4 * quad + lane, hn::Mul(hn::Mul(r2, hn::LoadU(dq, f2 + lane)), hn::LoadU(dq, f1 + lane)));
  }
}

void Polar4DecodeRotated(const uint8_t* block, int d, float* y) {
  const DQ dq;
  ForEachQuadVector(block, d, [&](int i, VQ value) { hn::StoreU(value, dq, y + i); });
}

float Polar4Score(const float* q, const uint8_t* block, int d) {
  const DQ dq;
  VQ sum[2] = {hn::Zero(dq), hn::Zero(dq)};
  ForEachQuadVector(block, d, [&](int i, VQ value) {
    VQ& s = sum[(i / 4) & 1];  // two accumulators, alternating by quad
    s = hn::MulAdd(hn::LoadU(dq, q + i), value, s);
  });
  return hn::GetLane(hn::SumOfLanes(dq, hn::Add(sum[0], sum[1])));
}

void Polar4Accumulate(float w, const uint8_t* block, int d, float* acc) {
  const DQ dq;
  const VQ weight = hn::Set(dq, w);
  ForEachQuadVector(block, d, [&](int i, VQ value) {
    hn::StoreU(hn::MulAdd(weight, value, hn::LoadU(dq, acc + i)), dq, acc + i);
  });
}

// The rows of n consecutive blocks: the reconstruction in the rotated basis (decode's values).
void Polar4Expand(const uint8_t* blocks, int n, int d, float* rows) {
  const size_t block_bytes = size_t(d / polar::kChunkElements) * polar::kChunkBytes;
  for (int j = 0; j < n; ++j, blocks += block_bytes, rows += d) Polar4DecodeRotated(blocks, d, rows);
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <array>
#include <string>

#include "cpu/kv/cpu_codec_registry.h"
#include "util/error.h"

namespace sparrow::cpu {

HWY_EXPORT(Polar4EncodeRotated);
HWY_EXPORT(Polar4DecodeRotated);
HWY_EXPORT(Polar4Score);
HWY_EXPORT(Polar4Accumulate);
HWY_EXPORT(Polar4Expand);

namespace {

void check_head_dim(const char* op, int d) {
  if (!formats::kv_head_dim_supported(d)) {
    throw Error(std::string("kv codec polar4 ") + op + ": head dim " + std::to_string(d) +
                " is not supported (expected 64, 128, 256 or 512)");
  }
}

// KvCodecOps holds plain function pointers; these check the head dim, rotate where the basis needs it, and
// forward to the best target compiled in.
void encode(const float* x, int d, uint8_t* block) {
  check_head_dim("encode", d);
  std::array<float, formats::polar::kMaxHeadDim> y;
  formats::hadamard_rotate(x, d, y.data());
  HWY_DYNAMIC_DISPATCH(Polar4EncodeRotated)(y.data(), d, block);
}

void decode(const uint8_t* block, int d, float* x) {
  check_head_dim("decode", d);
  HWY_DYNAMIC_DISPATCH(Polar4DecodeRotated)(block, d, x);
  formats::hadamard_unrotate(x, d, x);
}

void prepare_query(const float* q, int d, float* prepared) {
  check_head_dim("prepare_query", d);
  formats::hadamard_rotate(q, d, prepared);
}

float score(const float* prepared, const uint8_t* block, int d) {
  check_head_dim("score", d);
  return HWY_DYNAMIC_DISPATCH(Polar4Score)(prepared, block, d);
}

void accumulate(float w, const uint8_t* block, int d, float* acc) {
  check_head_dim("accumulate", d);
  HWY_DYNAMIC_DISPATCH(Polar4Accumulate)(w, block, d, acc);
}

void finish(const float* acc, int d, float* out) {
  check_head_dim("finish", d);
  formats::hadamard_unrotate(acc, d, out);
}

constexpr formats::KvCodecOps kOps = {encode, decode, prepare_query, score, accumulate, finish};

}  // namespace

const formats::KvCodecOps& polar4_ops() { return kOps; }

void polar4_expand(const uint8_t* blocks, int n, int d, float* rows) {
  check_head_dim("expand", d);
  HWY_DYNAMIC_DISPATCH(Polar4Expand)(blocks, n, d, rows);
}

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
