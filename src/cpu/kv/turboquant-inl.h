// SIMD kernels of the TurboQuant family and QJL (tbq2/3/4, tbq3p/4p, qjl), shared by cpu/kv/turboquant.cpp,
// cpu/kv/turboquant_ip.cpp and cpu/kv/qjl.cpp, each of which compiles them once per target through
// hwy/foreach_target.h. Layouts: formats/kv/turboquant.h (sub-blocks, code packing) and formats/kv/qjl.h
// (sign bits).
//
// Vectors hold at most 16 floats (CappedTag): head dims are 64..512 and a sub-block's smallest packed unit
// (the 3-bit plane's quarters at n = 64) is 16 elements, so every loop runs whole vectors. The lane count is
// a power of two on every Highway target (SVE included: Highway uses the SV_POW2 pattern), which the table
// lookups and the in-vector butterflies rely on.
//
// Rounding: the rotation is bit-identical to the reference (same butterflies, signs multiply exactly);
// scores and accumulations sum in float in another order than the references' double sums.

// Per-target include guard (the header is included once per target by foreach_target).
#if defined(SPARROW_CPU_KV_TURBOQUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARROW_CPU_KV_TURBOQUANT_INL_H_
#undef SPARROW_CPU_KV_TURBOQUANT_INL_H_
#else
#define SPARROW_CPU_KV_TURBOQUANT_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/kv/hadamard-inl.h"
#include "formats/kv/lloyd_max.h"
#include "formats/kv/qjl.h"
#include "formats/kv/rotation.h"
#include "formats/kv/turboquant.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE::turboquant_simd {
namespace hn = hwy::HWY_NAMESPACE;
namespace fmt = sparrow::formats;

using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DU8 = hn::Rebind<uint8_t, DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;

HWY_INLINE float ReduceSum(VF v) { return hn::GetLane(hn::SumOfLanes(DF(), v)); }

// Sum of a[i] * b[i] over n floats (n a multiple of 2 vectors).
HWY_INLINE float Dot(const float* a, const float* b, int n) {
  const DF df;
  const int N = int(hn::Lanes(df));
  VF s0 = hn::Zero(df), s1 = hn::Zero(df);
  for (int i = 0; i < n; i += 2 * N) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), s1);
  }
  return ReduceSum(hn::Add(s0, s1));
}

// ---------------------------------------------------------------------------------------------------------
// Rotation: R x and R^T y through the shared butterflies (cpu/kv/hadamard-inl.h).

HWY_INLINE void Rotate(const float* x, int d, float* y) {
  hadamard_simd::SignedHadamard(x, d, fmt::hadamard_signs_in(d), fmt::hadamard_signs_out(d), y);
}
HWY_INLINE void Unrotate(const float* y, int d, float* x) {
  hadamard_simd::SignedHadamard(y, d, fmt::hadamard_signs_out(d), fmt::hadamard_signs_in(d), x);
}

// ---------------------------------------------------------------------------------------------------------
// Codes and codebooks.

// table[code] per lane; table has 16 floats (LloydMaxCodebook::centroids, zero past the used levels).
// One permute when the table fits a vector, else one per N-entry chunk and a select.
HWY_INLINE VF LookupCentroids(const float* table, int levels, VI code) {
  const DF df;
  const DI di;
  const int N = int(hn::Lanes(df));
  if (N >= levels) return hn::TableLookupLanes(hn::LoadU(df, table), hn::IndicesFromVec(df, code));
  const auto lane = hn::IndicesFromVec(df, hn::And(code, hn::Set(di, N - 1)));
  const VI chunk = hn::ShiftRightSame(code, int(hwy::FloorLog2(size_t(N))));
  VF result = hn::TableLookupLanes(hn::LoadU(df, table), lane);
  for (int c = 1; c * N < levels; ++c) {
    const auto in_chunk = hn::RebindMask(df, hn::Eq(chunk, hn::Set(di, c)));
    result = hn::IfThenElse(in_chunk, hn::TableLookupLanes(hn::LoadU(df, table + c * N), lane), result);
  }
  return result;
}

// Bits first .. first+N-1 of a little-endian bit array (first a multiple of N) as a lane mask. With N >= 8
// lanes, first is a multiple of 8 and Highway's LoadMaskBits reads the bytes directly; fewer lanes fit in one
// byte.
HWY_INLINE hn::Mask<DI> BitMaskAt(const uint8_t* bits, int first) {
  const DI di;
  if (hn::Lanes(di) >= 8) return hn::LoadMaskBits(di, bits + first / 8);
  const DU du;
  const VU shifted = hn::Shr(hn::Set(du, uint32_t(bits[first / 8])), hn::Iota(du, uint32_t(first % 8)));
  return hn::RebindMask(di, hn::Ne(hn::And(shifted, hn::Set(du, 1u)), hn::Zero(du)));
}

HWY_INLINE VI LoadBytes(const uint8_t* p) { return hn::PromoteTo(DI(), hn::LoadU(DU8(), p)); }

// A sub-block's packed codes come in G groups of n/G elements that share bytes: G = 2 nibbles (4 bits) or
// 4 quarters (2 and 3 bits). One load of N bytes at offset j serves elements j + k n/G of every group k.
template <int kBits>
constexpr int kGroups = kBits == 4 ? 2 : 4;

// The codes of elements j + k n/G .. +N-1, from bytes = LoadBytes(packed + j) (layout: formats/kv/turboquant.h).
template <int kBits, int k>
HWY_INLINE VI GroupCodes(VI bytes, const uint8_t* packed, int n, int j) {
  const DI di;
  if constexpr (kBits == 4) {
    if constexpr (k == 0) return hn::And(bytes, hn::Set(di, 15));
    return hn::ShiftRight<4>(bytes);
  } else {
    const VI low = hn::And(hn::ShiftRight<2 * k>(bytes), hn::Set(di, 3));
    if constexpr (kBits == 2) return low;
    const int quarter = n / 4;
    return hn::Or(low, hn::IfThenElseZero(BitMaskAt(packed + quarter, j + k * quarter), hn::Set(di, 4)));
  }
}

template <int kBits, int k>
HWY_INLINE VF GroupCentroids(VI bytes, const uint8_t* packed, int n, int j, const float* table) {
  return LookupCentroids(table, 1 << kBits, GroupCodes<kBits, k>(bytes, packed, n, j));
}

// Calls visit(centroids, element offset) for every vector of one sub-block's n codes. visit holds no vectors
// (SVE vectors cannot be members), so it works on memory: used by decode and accumulate.
template <int kBits, class Visit>
HWY_INLINE void ForEachCentroidVector(const uint8_t* packed, int n, const float* table, const Visit& visit) {
  const int N = int(hn::Lanes(DF()));
  const int span = n / kGroups<kBits>;
  for (int j = 0; j < span; j += N) {
    const VI bytes = LoadBytes(packed + j);
    visit(GroupCentroids<kBits, 0>(bytes, packed, n, j, table), j);
    visit(GroupCentroids<kBits, 1>(bytes, packed, n, j, table), j + span);
    if constexpr (kGroups<kBits> == 4) {
      visit(GroupCentroids<kBits, 2>(bytes, packed, n, j, table), j + 2 * span);
      visit(GroupCentroids<kBits, 3>(bytes, packed, n, j, table), j + 3 * span);
    }
  }
}

// sum over the sub-block of q[i] * centroid[code i] (as a vector of partial sums), one accumulator per group.
template <int kBits>
HWY_INLINE VF SubBlockDot(const uint8_t* packed, int n, const float* table, const float* q) {
  const DF df;
  const int N = int(hn::Lanes(df));
  const int span = n / kGroups<kBits>;
  VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  for (int j = 0; j < span; j += N) {
    const VI bytes = LoadBytes(packed + j);
    a0 = hn::MulAdd(GroupCentroids<kBits, 0>(bytes, packed, n, j, table), hn::LoadU(df, q + j), a0);
    a1 = hn::MulAdd(GroupCentroids<kBits, 1>(bytes, packed, n, j, table), hn::LoadU(df, q + span + j), a1);
    if constexpr (kGroups<kBits> == 4) {
      a2 = hn::MulAdd(GroupCentroids<kBits, 2>(bytes, packed, n, j, table), hn::LoadU(df, q + 2 * span + j), a2);
      a3 = hn::MulAdd(GroupCentroids<kBits, 3>(bytes, packed, n, j, table), hn::LoadU(df, q + 3 * span + j), a3);
    }
  }
  return hn::Add(hn::Add(a0, a1), hn::Add(a2, a3));
}

// ---------------------------------------------------------------------------------------------------------
// MSE blocks (d / n sub-blocks of [fp16 norm][codes]).

// The fp16 norm at p (any alignment), as formats::turboquant::load_norm returns it but inline: that one is a
// call per sub-block. Every target's f16 -> f32 promotion is exact.
HWY_INLINE float LoadNorm(const uint8_t* p) {
  const hn::CappedTag<float, 1> d1;
  const hn::Rebind<hwy::float16_t, decltype(d1)> dh;
  return hn::GetLane(hn::PromoteTo(d1, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p))));
}

// <q, y^> over a whole block in the rotated basis.
template <int kBits>
HWY_INLINE float MseScore(const float* q, const uint8_t* block, int d, const fmt::LloydMaxCodebook& book) {
  const DF df;
  const int n = fmt::turboquant::sub_block_size(d);
  const size_t stride = fmt::turboquant::sub_block_bytes(n, kBits);
  VF total = hn::Zero(df);
  for (int s = 0; s < d / n; ++s) {
    const uint8_t* sub = block + s * stride;
    const VF dot = SubBlockDot<kBits>(sub + 2, n, book.centroids, q + s * n);
    total = hn::MulAdd(dot, hn::Set(df, LoadNorm(sub)), total);
  }
  return ReduceSum(total);
}

// acc += w * y^ in the rotated basis.
template <int kBits>
HWY_INLINE void MseAccumulate(float w, const uint8_t* block, int d, const fmt::LloydMaxCodebook& book,
                              float* acc) {
  const DF df;
  const int n = fmt::turboquant::sub_block_size(d);
  const size_t stride = fmt::turboquant::sub_block_bytes(n, kBits);
  for (int s = 0; s < d / n; ++s) {
    const uint8_t* sub = block + s * stride;
    const float weight = w * LoadNorm(sub);
    float* as = acc + s * n;
    ForEachCentroidVector<kBits>(sub + 2, n, book.centroids, [&](VF c, int e) {
      hn::StoreU(hn::MulAdd(c, hn::Set(df, weight), hn::LoadU(df, as + e)), df, as + e);
    });
  }
}

// The codebook of the b-bit quantizer for head dim d (one per sub-block size, looked up once per target).
template <int kBits>
HWY_INLINE const fmt::LloydMaxCodebook& MseCodebook(int d) {
  static const fmt::LloydMaxCodebook& small = fmt::lloyd_max_codebook(64, kBits);
  static const fmt::LloydMaxCodebook& large = fmt::lloyd_max_codebook(128, kBits);
  return fmt::turboquant::sub_block_size(d) == 64 ? small : large;
}

// Bytes of an MSE block of d elements: d / n sub-blocks.
HWY_INLINE size_t MseBlockBytes(int d, int bits) {
  const int n = fmt::turboquant::sub_block_size(d);
  return size_t(d / n) * fmt::turboquant::sub_block_bytes(n, bits);
}

// y^ in the rotated basis: per sub-block, the codebook times the norm (one multiply per codebook entry, the
// same product norm * centroid as the reference's), then one lookup per element. This is also the block's
// expand row (accumulate(1, block) from zero).
template <int kBits>
HWY_INLINE void MseDecode(const uint8_t* block, int d, const fmt::LloydMaxCodebook& book, float* y) {
  const DF df;
  const int N = int(hn::Lanes(df));
  const int n = fmt::turboquant::sub_block_size(d);
  const size_t stride = fmt::turboquant::sub_block_bytes(n, kBits);
  HWY_ALIGN float scaled[16];  // LloydMaxCodebook::centroids: 16 floats, zero past the used levels
  for (int s = 0; s < d / n; ++s) {
    const uint8_t* sub = block + s * stride;
    const VF norm = hn::Set(df, LoadNorm(sub));
    for (int i = 0; i < 16; i += N) hn::Store(hn::Mul(norm, hn::LoadU(df, book.centroids + i)), df, scaled + i);
    float* ys = y + s * n;
    ForEachCentroidVector<kBits>(sub + 2, n, scaled, [&](VF value, int e) { hn::StoreU(value, df, ys + e); });
  }
}

// n consecutive MSE blocks of d elements -> n rows of d floats.
template <int kBits>
HWY_INLINE void MseExpand(const uint8_t* blocks, int n, int d, const fmt::LloydMaxCodebook& book, float* rows) {
  const size_t block_bytes = MseBlockBytes(d, kBits);
  for (int j = 0; j < n; ++j) MseDecode<kBits>(blocks + j * block_bytes, d, book, rows + size_t(j) * d);
}

// Codes of one sub-block of y (n floats), and the squared norm of their centroids.
HWY_INLINE float QuantizeSubBlock(const float* y, int n, float norm, const fmt::LloydMaxCodebook& book,
                                  uint8_t* codes) {
  const DF df;
  const DI di;
  const int N = int(hn::Lanes(df));
  const int levels = 1 << book.bits;
  // A zero sub-block quantizes u = 0 (its stored norm is 0); dividing by 1 keeps the loop branch-free.
  const VF divisor = hn::Set(df, norm > 0 ? norm : 1.0f);
  VF recon_sq = hn::Zero(df);
  for (int e = 0; e < n; e += N) {
    const VF u = hn::Div(hn::LoadU(df, y + e), divisor);
    VI code = hn::Zero(di);
    for (int b = 0; b + 1 < levels; ++b)  // count of boundaries strictly below u (lloyd_max_index)
      code = hn::Sub(code, hn::VecFromMask(di, hn::RebindMask(di, hn::Gt(u, hn::Set(df, book.boundaries[b])))));
    hn::StoreU(hn::DemoteTo(DU8(), code), DU8(), codes + e);
    const VF c = LookupCentroids(book.centroids, levels, code);
    recon_sq = hn::MulAdd(c, c, recon_sq);
  }
  return ReduceSum(recon_sq);
}

// The MSE block of the rotated vector y (formats/kv/turboquant.cpp encode_rotated).
HWY_INLINE void MseEncode(const float* y, int d, const fmt::LloydMaxCodebook& book, uint8_t* block) {
  const int n = fmt::turboquant::sub_block_size(d);
  const size_t stride = fmt::turboquant::sub_block_bytes(n, book.bits);
  for (int s = 0; s < d / n; ++s) {
    uint8_t* sub = block + s * stride;
    const float* ys = y + s * n;
    const float norm = std::sqrt(Dot(ys, ys, n));
    uint8_t codes[fmt::turboquant::kMaxSubBlock];
    const float recon_sq = QuantizeSubBlock(ys, n, norm, book, codes);
    fmt::turboquant::store_norm(norm > 0 ? norm / std::sqrt(recon_sq) : 0.0f, sub);
    fmt::turboquant::pack_codes(codes, n, book.bits, sub + 2);
  }
}

// ---------------------------------------------------------------------------------------------------------
// QJL sketches (m x d row-major S; sign bits in formats/kv/qjl.h order: set = negative).

// sx = S x.
HWY_INLINE void Project(const float* s, const float* x, int m, int d, float* sx) {
  for (int i = 0; i < m; ++i) sx[i] = Dot(s + size_t(i) * d, x, d);
}

// x = S^T v, as a sum of scaled rows.
HWY_INLINE void ProjectTransposed(const float* s, const float* v, int m, int d, float* x) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int j = 0; j < d; j += N) hn::StoreU(hn::Zero(df), df, x + j);
  for (int i = 0; i < m; ++i) {
    const VF vi = hn::Set(df, v[i]);
    const float* row = s + size_t(i) * d;
    for (int j = 0; j < d; j += N) hn::StoreU(hn::MulAdd(hn::LoadU(df, row + j), vi, hn::LoadU(df, x + j)), df, x + j);
  }
}

// x = S^T v summed in double, as the reference does: decode must reproduce the reference's values exactly
// (sparrow verify compares decode bit for bit), and two double sums of m terms round to the same float except
// within ~1e-16 of a float rounding midpoint. Slower than ProjectTransposed; decode is not on the attention
// path (finish, once per output row, uses the float version).
HWY_INLINE void ProjectTransposedInDouble(const float* s, const float* v, int m, int d, float* x) {
#if HWY_HAVE_FLOAT64
  const hn::CappedTag<double, 8> dd;
  const hn::Rebind<float, decltype(dd)> df_half;
  const int N = int(hn::Lanes(dd));
  for (int j = 0; j < d; j += N) {
    auto sum = hn::Zero(dd);
    for (int i = 0; i < m; ++i)
      sum = hn::MulAdd(hn::PromoteTo(dd, hn::LoadU(df_half, s + size_t(i) * d + j)), hn::Set(dd, double(v[i])), sum);
    hn::StoreU(hn::DemoteTo(df_half, sum), df_half, x + j);
  }
#else
  for (int j = 0; j < d; ++j) {
    double sum = 0;
    for (int i = 0; i < m; ++i) sum += double(s[size_t(i) * d + j]) * v[i];
    x[j] = float(sum);
  }
#endif
}

// The float sign mask (-0.0f, i.e. only the sign bit, where the bit is set) of sign bits first .. first+N-1.
HWY_INLINE VF SignMaskAt(const uint8_t* bits, int first) {
  const DF df;
  return hn::IfThenElseZero(hn::RebindMask(df, BitMaskAt(bits, first)), hn::Set(df, -0.0f));
}

// sum over i < m of sx[i] * (bit i set ? -1 : +1).
HWY_INLINE float SignedSum(const float* sx, const uint8_t* bits, int m) {
  const DF df;
  const int N = int(hn::Lanes(df));
  VF s0 = hn::Zero(df), s1 = hn::Zero(df);
  for (int i = 0; i < m; i += 2 * N) {
    s0 = hn::Add(s0, hn::Xor(hn::LoadU(df, sx + i), SignMaskAt(bits, i)));
    s1 = hn::Add(s1, hn::Xor(hn::LoadU(df, sx + i + N), SignMaskAt(bits, i + N)));
  }
  return ReduceSum(hn::Add(s0, s1));
}

// acc[i] += (bit i set ? -w : w) for i < m.
HWY_INLINE void SignedAccumulate(float w, const uint8_t* bits, int m, float* acc) {
  const DF df;
  const int N = int(hn::Lanes(df));
  const VF weight = hn::Set(df, w);
  for (int i = 0; i < m; i += N)
    hn::StoreU(hn::Add(hn::LoadU(df, acc + i), hn::Xor(weight, SignMaskAt(bits, i))), df, acc + i);
}

// v[i] = (bit i set ? -w : w) for i < m: the key estimate in the sketch basis.
HWY_INLINE void SignedFill(float w, const uint8_t* bits, int m, float* v) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int i = 0; i < m; i += N) hn::StoreU(hn::Xor(hn::Set(df, w), SignMaskAt(bits, i)), df, v + i);
}

// ||x|| of d floats.
HWY_INLINE float Norm(const float* x, int d) { return std::sqrt(Dot(x, x, d)); }

}  // namespace sparrow::cpu::HWY_NAMESPACE::turboquant_simd
HWY_AFTER_NAMESPACE();

#endif  // SPARROW_CPU_KV_TURBOQUANT_INL_H_
