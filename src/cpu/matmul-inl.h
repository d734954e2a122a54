// Per-target matmul kernels, compiled once per SIMD target through hwy/foreach_target.h (see matmul.cpp).
//
// Quantized weights are multiplied with 8-bit activations (QuantizedTokens) in integers: each weight block is
// unpacked once into int16 lanes and multiplied with up to kMaxTile tokens, pairs of int16 products summed
// into int32 (ReorderWidenMulAccumulate: one pmaddwd on x86). K-quant sub-block scales are folded into the
// int16 weights (|q * scale| <= 4096), so a whole 256-element super-block is summed in integers and converted
// to float once. Float weight types (f32, f16, bf16) use a plain float dot product.
//
// Element order is natural everywhere: lane i of the vector for elements [k, k + N) holds element k + i.
#if defined(SPARROW_CPU_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARROW_CPU_MATMUL_INL_H_
#undef SPARROW_CPU_MATMUL_INL_H_
#else
#define SPARROW_CPU_MATMUL_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include <hwy/highway.h>

#include "cpu/matmul_job.h"
#include "formats/weight_formats.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace fmt = sparrow::formats;

constexpr int kMaxTile = 4;  // tokens that share one unpacking of a weight block

// Integer lanes are capped at 16 x int16 (256 bits): the 32-element blocks of the legacy types then fill
// whole vectors on every target.
using D16 = hn::CappedTag<int16_t, 16>;
using DU16 = hn::RebindToUnsigned<D16>;
using D8 = hn::Rebind<int8_t, D16>;
using DU8 = hn::Rebind<uint8_t, D16>;
using D32 = hn::Repartition<int32_t, D16>;
using DF = hn::Rebind<float, D32>;
using V16 = hn::Vec<D16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;

// One token's activations as seen by a kernel.
struct TokenQ {
  const int16_t* q;
  const float* scale;
  const float* sum32;
};

HWY_INLINE V16 LoadNibbleBytes(const uint8_t* p) {
  return hn::BitCast(D16(), hn::PromoteTo(DU16(), hn::LoadU(DU8(), p)));
}

HWY_INLINE V16 LowNibbles(V16 bytes) { return hn::And(bytes, hn::Set(D16(), 0x0F)); }
HWY_INLINE V16 HighNibbles(V16 bytes) { return hn::ShiftRight<4>(bytes); }  // bytes are 0..255: no sign

// sum += w * x over the N lanes, in int32 pairs. Callers add sum0 and sum1 at the end (x86 leaves sum1 0).
HWY_INLINE void MulAcc(V16 w, const int16_t* x, V32& sum0, V32& sum1) {
  sum0 = hn::ReorderWidenMulAccumulate(D32(), w, hn::LoadU(D16(), x), sum0, sum1);
}

HWY_INLINE float SumLanes(VF v) { return hn::GetLane(hn::SumOfLanes(DF(), v)); }

// ---------------------------------------------------------------------------------------------------------
// Legacy 32-element blocks: unpack to 32 int16 weights (values already offset: q - 8 for Q4_0, q - 16 for
// Q5_0, raw q for the types with a min), then one scaled int32 sum per block and token.

constexpr size_t kLanes16 = hn::MaxLanes(D16());
constexpr size_t kVecsPerBlock32 = 32 / kLanes16;

struct Block32 {
  V16 w[kVecsPerBlock32];
  float d;  // scale
  float m;  // min (offset types), else 0
};

// The fifth bits of elements [first, first + N) as 16 in each lane where set.
HWY_INLINE V16 FifthBits(uint32_t qh, int first) {
  alignas(32) static constexpr uint16_t kBit[16] = {1,     2,     4,     8,     16,    32,    64,    128,
                                                    256,   512,   1024,  2048,  4096,  8192,  16384, 32768};
  const auto bits = hn::Set(DU16(), uint16_t(qh >> first));
  const auto set = hn::TestBit(bits, hn::Load(DU16(), kBit));
  return hn::BitCast(D16(), hn::IfThenElseZero(set, hn::Set(DU16(), 16)));
}

template <TensorType kType>
HWY_INLINE void UnpackBlock32(const uint8_t* block, Block32& b) {
  const D16 d16;
  constexpr size_t N = kLanes16;
  if constexpr (kType == TensorType::Q8_0) {
    const auto* blk = reinterpret_cast<const fmt::BlockQ8_0*>(block);
    b.d = fmt::f16_to_f32(blk->d);
    b.m = 0;
    for (size_t k = 0; k < 32; k += N) b.w[k / N] = hn::PromoteTo(d16, hn::LoadU(D8(), blk->qs + k));
  } else if constexpr (kType == TensorType::Q4_0 || kType == TensorType::Q4_1) {
    const uint8_t* qs;
    if constexpr (kType == TensorType::Q4_0) {
      const auto* blk = reinterpret_cast<const fmt::BlockQ4_0*>(block);
      b.d = fmt::f16_to_f32(blk->d);
      b.m = 0;
      qs = blk->qs;
    } else {
      const auto* blk = reinterpret_cast<const fmt::BlockQ4_1*>(block);
      b.d = fmt::f16_to_f32(blk->d);
      b.m = fmt::f16_to_f32(blk->m);
      qs = blk->qs;
    }
    const auto offset = hn::Set(d16, kType == TensorType::Q4_0 ? 8 : 0);
    for (size_t k = 0; k < 16; k += N) {
      const V16 bytes = LoadNibbleBytes(qs + k);
      b.w[k / N] = hn::Sub(LowNibbles(bytes), offset);
      b.w[(16 + k) / N] = hn::Sub(HighNibbles(bytes), offset);
    }
  } else if constexpr (kType == TensorType::Q5_0 || kType == TensorType::Q5_1) {
    const uint8_t* qs;
    uint32_t qh;
    if constexpr (kType == TensorType::Q5_0) {
      const auto* blk = reinterpret_cast<const fmt::BlockQ5_0*>(block);
      b.d = fmt::f16_to_f32(blk->d);
      b.m = 0;
      qs = blk->qs;
      std::memcpy(&qh, blk->qh, 4);
    } else {
      const auto* blk = reinterpret_cast<const fmt::BlockQ5_1*>(block);
      b.d = fmt::f16_to_f32(blk->d);
      b.m = fmt::f16_to_f32(blk->m);
      qs = blk->qs;
      std::memcpy(&qh, blk->qh, 4);
    }
    const auto offset = hn::Set(d16, kType == TensorType::Q5_0 ? 16 : 0);
    for (size_t k = 0; k < 16; k += N) {
      const V16 bytes = LoadNibbleBytes(qs + k);
      b.w[k / N] = hn::Sub(hn::Or(LowNibbles(bytes), FifthBits(qh, int(k))), offset);
      b.w[(16 + k) / N] = hn::Sub(hn::Or(HighNibbles(bytes), FifthBits(qh, int(16 + k))), offset);
    }
  }
}

template <TensorType kType, int T>
HWY_INLINE void DotRowBlock32(const uint8_t* row, int64_t n_in, const TokenQ* x, float* out) {
  constexpr size_t block_bytes = kType == TensorType::Q8_0   ? sizeof(fmt::BlockQ8_0)
                                 : kType == TensorType::Q4_0 ? sizeof(fmt::BlockQ4_0)
                                 : kType == TensorType::Q4_1 ? sizeof(fmt::BlockQ4_1)
                                 : kType == TensorType::Q5_0 ? sizeof(fmt::BlockQ5_0)
                                                             : sizeof(fmt::BlockQ5_1);
  constexpr bool kHasMin = kType == TensorType::Q4_1 || kType == TensorType::Q5_1;
  constexpr size_t N = kLanes16;
  const DF df;
  const D32 d32;
  VF acc[T];
  float min_term[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = hn::Zero(df);
    min_term[t] = 0;
  }
  const int64_t nb = n_in / 32;
  for (int64_t i = 0; i < nb; ++i) {
    Block32 b;
    UnpackBlock32<kType>(row + i * block_bytes, b);
    for (int t = 0; t < T; ++t) {
      const int16_t* xq = x[t].q + 32 * i;
      V32 s0 = hn::Zero(d32), s1 = hn::Zero(d32);
      for (size_t k = 0; k < 32; k += N) MulAcc(b.w[k / N], xq + k, s0, s1);
      const float scale = b.d * x[t].scale[i];
      acc[t] = hn::MulAdd(hn::ConvertTo(df, hn::Add(s0, s1)), hn::Set(df, scale), acc[t]);
      if constexpr (kHasMin) min_term[t] += b.m * x[t].scale[i] * x[t].sum32[i];
    }
  }
  for (int t = 0; t < T; ++t) out[t] = SumLanes(acc[t]) + min_term[t];
}

// ---------------------------------------------------------------------------------------------------------
// K-quants: 256-element super-blocks. Sub-block scales are multiplied into the int16 weights; the sub-block
// mins of Q4_K/Q5_K are applied through the activation sums (sum over the sub-block of q_x).

struct SuperBlockK {
  float d, dmin;
  int16_t scale[16];  // per sub-block (8 of 32 for Q4_K/Q5_K, 16 of 16 for Q6_K)
  int16_t min[8];
};

// Q4_K/Q5_K: chunk c (0..3) covers elements [64c, 64c + 64): low nibbles are sub-block 2c, high 2c + 1.
template <bool kFiveBits, int T>
HWY_INLINE void DotChunkQ45K(const uint8_t* qs, const uint8_t* qh, int chunk, const SuperBlockK& sb,
                             const TokenQ* x, int64_t base, V32* isum) {
  const D16 d16;
  constexpr size_t N = kLanes16;
  const auto scale_lo = hn::Set(d16, sb.scale[2 * chunk]);
  const auto scale_hi = hn::Set(d16, sb.scale[2 * chunk + 1]);
  for (size_t k = 0; k < 32; k += N) {
    V16 lo = LowNibbles(LoadNibbleBytes(qs + k));
    V16 hi = HighNibbles(LoadNibbleBytes(qs + k));
    if constexpr (kFiveBits) {
      const V16 bits = hn::ShiftRightSame(LoadNibbleBytes(qh + k), 2 * chunk);
      lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(bits, hn::Set(d16, 1))));
      hi = hn::Or(hi, hn::ShiftLeft<3>(hn::And(bits, hn::Set(d16, 2))));
    }
    lo = hn::Mul(lo, scale_lo);
    hi = hn::Mul(hi, scale_hi);
    for (int t = 0; t < T; ++t) {
      const int16_t* xq = x[t].q + base + 64 * chunk;
      V32 s1 = hn::Zero(D32());
      isum[t] = hn::ReorderWidenMulAccumulate(D32(), lo, hn::LoadU(d16, xq + k), isum[t], s1);
      isum[t] = hn::ReorderWidenMulAccumulate(D32(), hi, hn::LoadU(d16, xq + 32 + k), isum[t], s1);
      isum[t] = hn::Add(isum[t], s1);
    }
  }
}

template <TensorType kType, int T>
HWY_INLINE void DotRowQ45K(const uint8_t* row, int64_t n_in, const TokenQ* x, float* out) {
  constexpr bool kFive = kType == TensorType::Q5_K;
  using Block = std::conditional_t<kFive, fmt::BlockQ5_K, fmt::BlockQ4_K>;
  const DF df;
  VF acc[T];
  float min_term[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = hn::Zero(df);
    min_term[t] = 0;
  }
  const auto* blocks = reinterpret_cast<const Block*>(row);
  const int64_t nb = n_in / fmt::QK_K;
  for (int64_t i = 0; i < nb; ++i) {
    const Block& blk = blocks[i];
    SuperBlockK sb;
    sb.d = fmt::f16_to_f32(blk.d);
    sb.dmin = fmt::f16_to_f32(blk.dmin);
    for (int sub = 0; sub < 8; ++sub) {
      uint8_t sc, m;
      fmt::unpack_scale_min_k4(blk.scales, sub, &sc, &m);
      sb.scale[sub] = sc;
      sb.min[sub] = m;
    }
    V32 isum[T];
    for (int t = 0; t < T; ++t) isum[t] = hn::Zero(D32());
    const uint8_t* qh = nullptr;
    if constexpr (kFive) qh = blk.qh;
    for (int chunk = 0; chunk < 4; ++chunk) {
      DotChunkQ45K<kFive, T>(blk.qs + 32 * chunk, qh, chunk, sb, x, i * fmt::QK_K, isum);
    }
    for (int t = 0; t < T; ++t) {
      const float dx = x[t].scale[i];
      acc[t] = hn::MulAdd(hn::ConvertTo(df, isum[t]), hn::Set(df, sb.d * dx), acc[t]);
      const float* sums = x[t].sum32 + 8 * i;
      float mins = 0;
      for (int sub = 0; sub < 8; ++sub) mins += float(sb.min[sub]) * sums[sub];
      min_term[t] += sb.dmin * dx * mins;
    }
  }
  for (int t = 0; t < T; ++t) out[t] = SumLanes(acc[t]) - min_term[t];
}

// Q6_K: within each half of 128 elements, element 32k + l (k 0..3) is nibble (k >= 2) of ql[l + 32(k & 1)]
// with bits 2k..2k+1 of qh[l] on top, minus 32; 16-element sub-blocks each have a signed 8-bit scale.
template <int T>
HWY_INLINE void DotRowQ6K(const uint8_t* row, int64_t n_in, const TokenQ* x, float* out) {
  const D16 d16;
  const DF df;
  constexpr size_t N = kLanes16;
  VF acc[T];
  for (int t = 0; t < T; ++t) acc[t] = hn::Zero(df);
  const auto* blocks = reinterpret_cast<const fmt::BlockQ6_K*>(row);
  const int64_t nb = n_in / fmt::QK_K;
  const auto mask4 = hn::Set(d16, 0x0F), mask2 = hn::Set(d16, 3), bias = hn::Set(d16, 32);
  for (int64_t i = 0; i < nb; ++i) {
    const fmt::BlockQ6_K& blk = blocks[i];
    V32 isum[T];
    for (int t = 0; t < T; ++t) isum[t] = hn::Zero(D32());
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = blk.ql + 64 * half;
      const uint8_t* qh = blk.qh + 32 * half;
      const int8_t* sc = blk.scales + 8 * half;
      for (size_t l = 0; l < 32; l += N) {
        const V16 la = LoadNibbleBytes(ql + l), lb = LoadNibbleBytes(ql + 32 + l);
        const V16 h = LoadNibbleBytes(qh + l);
        const int s = int(l / 16);
        V16 w[4];
        w[0] = hn::Or(hn::And(la, mask4), hn::ShiftLeft<4>(hn::And(h, mask2)));
        w[1] = hn::Or(hn::And(lb, mask4), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(h), mask2)));
        w[2] = hn::Or(hn::ShiftRight<4>(la), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(h), mask2)));
        w[3] = hn::Or(hn::ShiftRight<4>(lb), hn::ShiftLeft<4>(hn::ShiftRight<6>(h)));
        for (int k = 0; k < 4; ++k) w[k] = hn::Mul(hn::Sub(w[k], bias), hn::Set(d16, sc[2 * k + s]));
        for (int t = 0; t < T; ++t) {
          const int16_t* xq = x[t].q + i * fmt::QK_K + 128 * half + l;
          V32 s1 = hn::Zero(D32());
          for (int k = 0; k < 4; ++k) {
            isum[t] = hn::ReorderWidenMulAccumulate(D32(), w[k], hn::LoadU(d16, xq + 32 * k), isum[t], s1);
          }
          isum[t] = hn::Add(isum[t], s1);
        }
      }
    }
    const float d = fmt::f16_to_f32(blk.d);
    for (int t = 0; t < T; ++t) {
      acc[t] = hn::MulAdd(hn::ConvertTo(df, isum[t]), hn::Set(df, d * x[t].scale[i]), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = SumLanes(acc[t]);
}

// ---------------------------------------------------------------------------------------------------------
// Float weights.

template <TensorType kType>
HWY_INLINE hn::Vec<hn::ScalableTag<float>> LoadWeightsAsFloat(const uint8_t* row, int64_t i) {
  const hn::ScalableTag<float> df;
  if constexpr (kType == TensorType::F32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kType == TensorType::F16) {
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + i));
  } else {
    const hn::Rebind<hwy::bfloat16_t, decltype(df)> db;
    return hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(row) + i));
  }
}

template <TensorType kType>
float WeightAsFloat(const uint8_t* row, int64_t i) {
  if constexpr (kType == TensorType::F32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (kType == TensorType::F16) {
    return fmt::f16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  } else {
    return fmt::bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  }
}

template <TensorType kType, int T>
HWY_INLINE void DotRowFloat(const uint8_t* row, int64_t n_in, const float* const* x, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t N = int64_t(hn::Lanes(df));
  hn::Vec<decltype(df)> acc[T];
  for (int t = 0; t < T; ++t) acc[t] = hn::Zero(df);
  int64_t i = 0;
  for (; i + N <= n_in; i += N) {
    const auto w = LoadWeightsAsFloat<kType>(row, i);
    for (int t = 0; t < T; ++t) acc[t] = hn::MulAdd(w, hn::LoadU(df, x[t] + i), acc[t]);
  }
  for (int t = 0; t < T; ++t) {
    float sum = hn::GetLane(hn::SumOfLanes(df, acc[t]));
    for (int64_t j = i; j < n_in; ++j) sum += WeightAsFloat<kType>(row, j) * x[t][j];
    out[t] = sum;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Row loops.

template <TensorType kType, int T>
HWY_INLINE void DotRow(const MatmulJob& job, const uint8_t* row, int64_t t0, float* out) {
  if constexpr (kType == TensorType::F32 || kType == TensorType::F16 || kType == TensorType::BF16) {
    const float* x[T];
    for (int t = 0; t < T; ++t) x[t] = job.x + (t0 + t) * job.n_in;
    DotRowFloat<kType, T>(row, job.n_in, x, out);
  } else {
    const int64_t n_groups = job.n_in / job.xq.group;
    TokenQ x[T];
    for (int t = 0; t < T; ++t) {
      x[t] = {job.xq.q + (t0 + t) * job.n_in, job.xq.scale + (t0 + t) * n_groups,
              job.xq.sum32 + (t0 + t) * (job.n_in / 32)};
    }
    if constexpr (kType == TensorType::Q4_K || kType == TensorType::Q5_K) {
      DotRowQ45K<kType, T>(row, job.n_in, x, out);
    } else if constexpr (kType == TensorType::Q6_K) {
      DotRowQ6K<T>(row, job.n_in, x, out);
    } else {
      DotRowBlock32<kType, T>(row, job.n_in, x, out);
    }
  }
}

template <TensorType kType, int T>
void RowsForTokenTile(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t t0) {
  float out[T];
  for (int64_t r = row_begin; r < row_end; ++r) {
    DotRow<kType, T>(job, job.weights + r * job.row_bytes, t0, out);
    for (int t = 0; t < T; ++t) job.y[(t0 + t) * job.n_out + r] = out[t];
  }
}

template <TensorType kType>
void MatmulRowsTyped(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t token_begin,
                     int64_t token_end) {
  int64_t t0 = token_begin;
  for (; t0 + kMaxTile <= token_end; t0 += kMaxTile) {
    RowsForTokenTile<kType, kMaxTile>(job, row_begin, row_end, t0);
  }
  switch (token_end - t0) {
    case 3: RowsForTokenTile<kType, 3>(job, row_begin, row_end, t0); break;
    case 2: RowsForTokenTile<kType, 2>(job, row_begin, row_end, t0); break;
    case 1: RowsForTokenTile<kType, 1>(job, row_begin, row_end, t0); break;
    default: break;
  }
}

// y[t][r] for rows [row_begin, row_end) and tokens [token_begin, token_end).
void MatmulRows(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t token_begin,
                int64_t token_end) {
  switch (job.type) {
    case TensorType::F32: return MatmulRowsTyped<TensorType::F32>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::F16: return MatmulRowsTyped<TensorType::F16>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::BF16: return MatmulRowsTyped<TensorType::BF16>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::Q8_0: return MatmulRowsTyped<TensorType::Q8_0>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::Q4_0: return MatmulRowsTyped<TensorType::Q4_0>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::Q4_1: return MatmulRowsTyped<TensorType::Q4_1>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::Q5_0: return MatmulRowsTyped<TensorType::Q5_0>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::Q5_1: return MatmulRowsTyped<TensorType::Q5_1>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::Q4_K: return MatmulRowsTyped<TensorType::Q4_K>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::Q5_K: return MatmulRowsTyped<TensorType::Q5_K>(job, row_begin, row_end, token_begin, token_end);
    case TensorType::Q6_K: return MatmulRowsTyped<TensorType::Q6_K>(job, row_begin, row_end, token_begin, token_end);
    default: return;  // rejected by the caller
  }
}

// ---------------------------------------------------------------------------------------------------------
// Activation quantization: per group of `group` elements, scale = max|x| / 127, q = round(x / scale).

void QuantizeTokens(const float* x, int64_t n_in, int64_t n_tokens, int group, int16_t* q, float* scale,
                    float* sum32) {
  const hn::CappedTag<float, 16> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int16_t, decltype(df)> d16;
  const int64_t N = int64_t(hn::Lanes(df));
  const int64_t n_groups = n_in / group;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * n_in;
    int16_t* qt = q + t * n_in;
    for (int64_t g = 0; g < n_groups; ++g) {
      const float* xg = xt + g * group;
      auto vmax = hn::Zero(df);
      for (int64_t i = 0; i < group; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xg + i)));
      const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
      const float d = amax / 127.0f;
      const auto inv = hn::Set(df, d != 0.0f ? 1.0f / d : 0.0f);
      scale[t * n_groups + g] = d;
      for (int64_t s = 0; s < group; s += 32) {
        auto vsum = hn::Zero(di);
        for (int64_t i = s; i < s + 32; i += N) {
          const auto qi = hn::NearestInt(hn::Mul(hn::LoadU(df, xg + i), inv));
          vsum = hn::Add(vsum, qi);
          hn::StoreU(hn::DemoteTo(d16, qi), d16, qt + g * group + i);
        }
        sum32[t * (n_in / 32) + (g * group + s) / 32] = float(hn::GetLane(hn::SumOfLanes(di, vsum)));
      }
    }
  }
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
