// SIMD Walsh-Hadamard butterflies shared by the KV codecs that work in a Hadamard basis: the randomized
// rotation of TurboQuant and QJL (cpu/kv/turboquant-inl.h) and the plain orthonormal one of q8_0 and q4_0
// (cpu/kv/stock_codecs.cpp). Included once per target by each codec file's hwy/foreach_target.h.
//
// Rounding: bit-identical to formats/kv/rotation.cpp: the same butterflies in the same order (a + b and a - b,
// the in-vector stages' multiply by +-1 is exact), then the same one multiply per element.
// Vectors hold at most 16 floats and head dims are 64..512, so every loop runs whole vectors; the lane count is
// a power of two on every Highway target, which the in-vector butterflies rely on.

// Per-target include guard (the header is included once per target by foreach_target).
#if defined(SPARROW_CPU_KV_HADAMARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARROW_CPU_KV_HADAMARD_INL_H_
#undef SPARROW_CPU_KV_HADAMARD_INL_H_
#else
#define SPARROW_CPU_KV_HADAMARD_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE::hadamard_simd {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;

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

// v <- H v (unnormalized), both kinds of stage in the references' order.
HWY_INLINE void Butterflies(float* v, int d) {
  InVectorStages(v, d);
  AcrossVectorStages(v, d);
}

// out = after · H · (before ⊙ in) / sqrt(d), the same steps as formats/kv/rotation.cpp.
HWY_INLINE void SignedHadamard(const float* in, int d, const float* before, const float* after, float* out) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int i = 0; i < d; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, in + i), hn::LoadU(df, before + i)), df, out + i);
  Butterflies(out, d);
  const VF scale = hn::Set(df, float(1.0 / std::sqrt(double(d))));
  for (int i = 0; i < d; i += N)
    hn::StoreU(hn::Mul(hn::LoadU(df, out + i), hn::Mul(hn::LoadU(df, after + i), scale)), df, out + i);
}

// out = H in / sqrt(d): formats::walsh_hadamard_orthonormal (in and out may alias).
HWY_INLINE void OrthonormalHadamard(const float* in, int d, float* out) {
  const DF df;
  const int N = int(hn::Lanes(df));
  if (in != out)
    for (int i = 0; i < d; i += N) hn::StoreU(hn::LoadU(df, in + i), df, out + i);
  Butterflies(out, d);
  const VF scale = hn::Set(df, float(1.0 / std::sqrt(double(d))));
  for (int i = 0; i < d; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, out + i), scale), df, out + i);
}

}  // namespace sparrow::cpu::HWY_NAMESPACE::hadamard_simd
HWY_AFTER_NAMESPACE();

#endif  // SPARROW_CPU_KV_HADAMARD_INL_H_
