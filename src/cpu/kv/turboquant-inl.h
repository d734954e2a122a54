// SIMD kernels of the TurboQuant family and QJL (tbq2/3/4, tbq3p/4p, qjl), shared by cpu/kv/turboquant.cpp,
// cpu/kv/turboquant_ip.cpp and cpu/kv/qjl.cpp, each of which compiles them once per target through
// hwy/foreach_target.h. Layouts: formats/kv/turboquant.h (sub-blocks, code packing) and formats/kv/qjl.h
// (sign bits).
//
// Vectors hold at most 16 floats (CappedTag): head dims are 64..512 and a sub-block's smallest packed unit
// (the 3-bit plane's quarters at n = 64) is 16 elements, so every loop runs whole vectors. The kernels need a
// power-of-two lane count; callers check PowerOfTwoLanes() and use the reference ops otherwise (only
// unusual SVE vector lengths would get there).
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

HWY_INLINE bool PowerOfTwoLanes() {
  const size_t n = hn::Lanes(DF());
  return (n & (n - 1)) == 0;
}

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
// Rotation: out = after · H · (before ⊙ in) / sqrt(d), the same steps as formats/kv/rotation.cpp.

// Butterfly stages with span h < N happen inside one vector: lane j pairs with lane j ^ h, and
// v[j] <- v[j ^ h] + (j & h ? -v[j] : v[j]) is a + b for the low lane and a - b for the high one.
HWY_INLINE void InVectorStages(float* v, int d) {
  const DF df;
  const DI di;
  const int N = int(hn::Lanes(df));
  for (int h = 1; h < N; h *= 2) {
    const auto partner = hn::IndicesFromVec(df, hn::Xor(hn::Iota(di, 0), hn::Set(di, h)));
    const auto high_lane = hn::RebindMask(df, hn::Ne(hn::And(hn::Iota(di, 0), hn::Set(di, h)), hn::Zero(di)));
    const VF sign = hn::IfThenElse(high_lane, hn::Set(df, -1.0f), hn::Set(df, 1.0f));
    for (int i = 0; i < d; i += N) {
      const VF x = hn::LoadU(df, v + i);
      hn::StoreU(hn::MulAdd(x, sign, hn::TableLookupLanes(x, partner)), df, v + i);
    }
  }
}

HWY_INLINE void AcrossVectorStages(float* v, int d) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int h = N; h < d; h *= 2)
    for (int i = 0; i < d; i += 2 * h)
      for (int j = i; j < i + h; j += N) {
        const VF a = hn::LoadU(df, v + j), b = hn::LoadU(df, v + j + h);
        hn::StoreU(hn::Add(a, b), df, v + j);
        hn::StoreU(hn::Sub(a, b), df, v + j + h);
      }
}

HWY_INLINE void SignedHadamard(const float* in, int d, const float* before, const float* after, float* out) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int i = 0; i < d; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, in + i), hn::LoadU(df, before + i)), df, out + i);
  InVectorStages(out, d);
  AcrossVectorStages(out, d);
  const VF scale = hn::Set(df, float(1.0 / std::sqrt(double(d))));
  for (int i = 0; i < d; i += N)
    hn::StoreU(hn::Mul(hn::LoadU(df, out + i), hn::Mul(hn::LoadU(df, after + i), scale)), df, out + i);
}

HWY_INLINE void Rotate(const float* x, int d, float* y) {
  SignedHadamard(x, d, fmt::hadamard_signs_in(d), fmt::hadamard_signs_out(d), y);
}
HWY_INLINE void Unrotate(const float* y, int d, float* x) {
  SignedHadamard(y, d, fmt::hadamard_signs_out(d), fmt::hadamard_signs_in(d), x);
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

// Bits first .. first+N-1 of a little-endian bit array (first a multiple of N), as 0/1 lanes. N <= 16 and
// first % N == 0, so the bits lie in one aligned 16-bit word.
HWY_INLINE VU BitsAt(const uint8_t* bits, int first) {
  const DU du;
  const int word = first / 16;
  const uint32_t w = uint32_t(bits[2 * word]) | uint32_t(bits[2 * word + 1]) << 8;
  const VU shift = hn::Iota(du, uint32_t(first % 16));
  return hn::And(hn::Shr(hn::Set(du, w), shift), hn::Set(du, 1u));
}

HWY_INLINE VI LoadBytes(const uint8_t* p) { return hn::PromoteTo(DI(), hn::LoadU(DU8(), p)); }

// The codes of elements e .. e+N-1 of a sub-block of n packed codes (layout: formats/kv/turboquant.h).
template <int kBits>
HWY_INLINE VI CodesAt(const uint8_t* packed, int n, int e) {
  const DI di;
  if constexpr (kBits == 4) {
    const int half = n / 2;
    const VI bytes = LoadBytes(packed + e % half);
    if (e < half) return hn::And(bytes, hn::Set(di, 15));
    return hn::ShiftRight<4>(bytes);
  } else {
    const int quarter = n / 4;
    const VI low = hn::And(hn::ShiftRightSame(LoadBytes(packed + e % quarter), 2 * (e / quarter)), hn::Set(di, 3));
    if constexpr (kBits == 2) return low;
    const VI high = hn::BitCast(di, BitsAt(packed + quarter, e));
    return hn::Or(low, hn::ShiftLeft<2>(high));
  }
}

// ---------------------------------------------------------------------------------------------------------
// MSE blocks (d / n sub-blocks of [fp16 norm][codes]).

// <q, y^> over a whole block in the rotated basis.
template <int kBits>
HWY_INLINE float MseScore(const float* q, const uint8_t* block, int d, const fmt::LloydMaxCodebook& book) {
  const DF df;
  const int N = int(hn::Lanes(df));
  const int n = fmt::turboquant::sub_block_size(d);
  const size_t stride = fmt::turboquant::sub_block_bytes(n, kBits);
  VF total = hn::Zero(df);
  for (int s = 0; s < d / n; ++s) {
    const uint8_t* sub = block + s * stride;
    const float* qs = q + s * n;
    VF a0 = hn::Zero(df), a1 = hn::Zero(df);
    for (int e = 0; e < n; e += 2 * N) {
      a0 = hn::MulAdd(LookupCentroids(book.centroids, 1 << kBits, CodesAt<kBits>(sub + 2, n, e)),
                      hn::LoadU(df, qs + e), a0);
      a1 = hn::MulAdd(LookupCentroids(book.centroids, 1 << kBits, CodesAt<kBits>(sub + 2, n, e + N)),
                      hn::LoadU(df, qs + e + N), a1);
    }
    total = hn::MulAdd(hn::Add(a0, a1), hn::Set(df, fmt::turboquant::load_norm(sub)), total);
  }
  return ReduceSum(total);
}

// acc += w * y^ in the rotated basis.
template <int kBits>
HWY_INLINE void MseAccumulate(float w, const uint8_t* block, int d, const fmt::LloydMaxCodebook& book,
                              float* acc) {
  const DF df;
  const int N = int(hn::Lanes(df));
  const int n = fmt::turboquant::sub_block_size(d);
  const size_t stride = fmt::turboquant::sub_block_bytes(n, kBits);
  for (int s = 0; s < d / n; ++s) {
    const uint8_t* sub = block + s * stride;
    const VF weight = hn::Set(df, w * fmt::turboquant::load_norm(sub));
    float* as = acc + s * n;
    for (int e = 0; e < n; e += N) {
      const VF c = LookupCentroids(book.centroids, 1 << kBits, CodesAt<kBits>(sub + 2, n, e));
      hn::StoreU(hn::MulAdd(c, weight, hn::LoadU(df, as + e)), df, as + e);
    }
  }
}

// y^ in the rotated basis.
template <int kBits>
HWY_INLINE void MseDecode(const uint8_t* block, int d, const fmt::LloydMaxCodebook& book, float* y) {
  const DF df;
  const int N = int(hn::Lanes(df));
  const int n = fmt::turboquant::sub_block_size(d);
  const size_t stride = fmt::turboquant::sub_block_bytes(n, kBits);
  for (int s = 0; s < d / n; ++s) {
    const uint8_t* sub = block + s * stride;
    const VF norm = hn::Set(df, fmt::turboquant::load_norm(sub));
    for (int e = 0; e < n; e += N) {
      const VF c = LookupCentroids(book.centroids, 1 << kBits, CodesAt<kBits>(sub + 2, n, e));
      hn::StoreU(hn::Mul(norm, c), df, y + s * n + e);
    }
  }
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

// The float sign mask (0x80000000 where the bit is set) of sign bits first .. first+N-1.
HWY_INLINE VF SignMaskAt(const uint8_t* bits, int first) {
  return hn::BitCast(DF(), hn::ShiftLeft<31>(BitsAt(bits, first)));
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
