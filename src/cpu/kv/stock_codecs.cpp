// Optimized CPU ops of the stock KV codecs (f32, f16, bf16, q8_0, q4_0), compiled once per SIMD target through
// hwy/foreach_target.h and picked at run time. Same bytes and same results as the references in
// formats/kv/stock_codecs.cpp: encode and decode are bit-exact on every target (the rounding is done with
// integer and exactly-rounded float operations, never with a target's own conversion, some of which truncate;
// the Walsh-Hadamard rotation of q8_0 and q4_0 is the references' butterflies), score and accumulate differ
// only by float summation order; expand writes exactly the basis rows (q8_0, q4_0: the dequantized blocks).
//
// Head dims are 64..512 and vectors hold at most 16 floats, so every loop below runs a whole number of
// vectors (d / N is a multiple of 4; a 32-element block is 32 / N vectors, a half block 16 / N).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/stock_codecs.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>
#include <cstring>

#include "cpu/kv/cpu_codec_registry.h"
#include "cpu/kv/dispatched_codec.h"
#include "cpu/kv/hadamard-inl.h"
#include "formats/kv/codec_registry.h"
#include "formats/kv/kv_codec.h"
#include "formats/weight_formats.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace fmt = sparrow::formats;

using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

// ---------------------------------------------------------------------------------------------------------
// Shared pieces.

// Sum of a[i] * b[i] over n floats (n a multiple of 4 vectors), four accumulators for instruction parallelism.
HWY_INLINE float DotFloats(const float* a, const float* b, int n) {
  const DF df;
  const int N = int(hn::Lanes(df));
  VF s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  for (int i = 0; i < n; i += 4 * N) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(df, a + i + 2 * N), hn::LoadU(df, b + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(df, a + i + 3 * N), hn::LoadU(df, b + i + 3 * N), s3);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits, so the FPU's
// default rounding does the work; identical to lrintf in the references on every target (Highway's own
// emulated Round adds 0.5 and truncates, which differs just below a tie).
HWY_INLINE VI RoundToInt(DF df, VF v) {
  const VF magic = hn::Set(df, 12582912.0f);
  return hn::ConvertTo(DI(), hn::Sub(hn::Add(v, magic), magic));
}

// The fp16 scale at p (any alignment) as a float, inline (this runs once per 32 elements in score and
// accumulate); same result as formats::f16_to_f32 for every half, NaN made quiet.
HWY_INLINE float LoadScale(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact
    const float magnitude = float(mantissa) * 0x1.0p-24f;
    return sign ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 0x1F ? sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0)
                                          : sign | ((exponent + 112) << 23) | (mantissa << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

HWY_INLINE void StoreScale(float d, uint8_t* p) {
  const fmt::f16_bits h = fmt::f32_to_f16(d);
  std::memcpy(p, &h, 2);
}

// ---------------------------------------------------------------------------------------------------------
// f32: d floats, stored as they are, in the plain basis (a prepared query is the query, a finished row the
// accumulator).

void CopyFloats(const float* in, int d, float* out) {
  if (in != out) std::memmove(out, in, sizeof(float) * size_t(d));
}
void F32Encode(const float* x, int d, uint8_t* block) { std::memcpy(block, x, sizeof(float) * size_t(d)); }
void F32Decode(const uint8_t* block, int d, float* x) { std::memcpy(x, block, sizeof(float) * size_t(d)); }

float F32Score(const float* q, const uint8_t* block, int d) {
  return DotFloats(q, reinterpret_cast<const float*>(block), d);
}

void F32Accumulate(float w, const uint8_t* block, int d, float* acc) {
  const DF df;
  const int N = int(hn::Lanes(df));
  const float* x = reinterpret_cast<const float*>(block);
  const VF vw = hn::Set(df, w);
  for (int i = 0; i < d; i += N) hn::StoreU(hn::MulAdd(vw, hn::LoadU(df, x + i), hn::LoadU(df, acc + i)), df, acc + i);
}

// ---------------------------------------------------------------------------------------------------------
// f16 and bf16: d 16-bit floats, in the plain basis. The two differ only in the conversion, so their ops are
// one template over it: Format::Bits(df, v) rounds floats to 16-bit patterns (in int32 lanes, 0..0xFFFF) and
// Format::Load(df, p) widens the patterns at p (any alignment) back to floats.

// IEEE binary16, rounded to nearest even like formats::f32_to_f16: NaN becomes the canonical quiet NaN,
// anything that rounds past 65504 becomes infinity, tiny values become subnormals.
struct F16Format {
  static VI Bits(DF df, VF v) {
    const DI di;
    const VI bits = hn::BitCast(di, v);
    const VI magnitude = hn::And(bits, hn::Set(di, 0x7FFFFFFF));
    const VI sign = hn::And(hn::ShiftRight<16>(bits), hn::Set(di, 0x8000));
    // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
    const VI odd = hn::And(hn::ShiftRight<13>(magnitude), hn::Set(di, 1));
    const VI normal =
        hn::ShiftRight<13>(hn::Sub(hn::Add(hn::Add(magnitude, hn::Set(di, 0xFFF)), odd), hn::Set(di, 112 << 23)));
    // Subnormal: adding 0.5 puts units of 2^-24 at the bottom of the float mantissa and lets the FPU round.
    const VI shifted = hn::BitCast(di, hn::Add(hn::BitCast(df, magnitude), hn::Set(df, 0.5f)));
    const VI subnormal = hn::Sub(shifted, hn::Set(di, 0x3F000000));
    VI half = hn::IfThenElse(hn::Lt(magnitude, hn::Set(di, 0x38800000)), subnormal, normal);
    half = hn::IfThenElse(hn::Gt(magnitude, hn::Set(di, 0x477FEFFF)), hn::Set(di, 0x7C00), half);
    half = hn::IfThenElse(hn::Gt(magnitude, hn::Set(di, 0x7F800000)), hn::Set(di, 0x7E00), half);
    return hn::Or(half, sign);
  }

  // Every target's f16 -> f32 promotion is exact.
  static VF Load(DF df, const uint8_t* p) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  }
};

// bf16: the top halves of floats, rounded to nearest even (NaN kept quiet), like formats::f32_to_bf16.
// Highway's bf16 demotion truncates, so the rounding is done here in integers.
struct Bf16Format {
  static VI Bits(DF df, VF v) {
    const DU du;
    const DI di;
    const hn::Vec<DU> bits = hn::BitCast(du, v);
    const hn::Vec<DU> high = hn::ShiftRight<16>(bits);
    const hn::Vec<DU> rounded =
        hn::ShiftRight<16>(hn::Add(hn::Add(bits, hn::Set(du, 0x7FFFu)), hn::And(high, hn::Set(du, 1u))));
    const auto is_nan = hn::Gt(hn::And(hn::BitCast(di, v), hn::Set(di, 0x7FFFFFFF)), hn::Set(di, 0x7F800000));
    return hn::BitCast(di, hn::IfThenElse(hn::RebindMask(du, is_nan), hn::Or(high, hn::Set(du, 0x40u)), rounded));
  }

  static VF Load(DF df, const uint8_t* p) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Vec<DU> wide = hn::PromoteTo(DU(), hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(wide));
  }
};

template <class Format>
void HalfEncode(const float* x, int d, uint8_t* block) {
  const DF df;
  const hn::Rebind<uint16_t, DF> du16;
  const int N = int(hn::Lanes(df));
  for (int i = 0; i < d; i += N) {
    const VI half = Format::Bits(df, hn::LoadU(df, x + i));
    hn::StoreU(hn::DemoteTo(du16, half), du16, reinterpret_cast<uint16_t*>(block + 2 * i));
  }
}

template <class Format>
void HalfDecode(const uint8_t* block, int d, float* x) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int i = 0; i < d; i += N) hn::StoreU(Format::Load(df, block + 2 * i), df, x + i);
}

template <class Format>
float HalfScore(const float* q, const uint8_t* block, int d) {
  const DF df;
  const int N = int(hn::Lanes(df));
  VF s0 = hn::Zero(df), s1 = hn::Zero(df);
  for (int i = 0; i < d; i += 2 * N) {
    s0 = hn::MulAdd(Format::Load(df, block + 2 * i), hn::LoadU(df, q + i), s0);
    s1 = hn::MulAdd(Format::Load(df, block + 2 * (i + N)), hn::LoadU(df, q + i + N), s1);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
}

template <class Format>
void HalfAccumulate(float w, const uint8_t* block, int d, float* acc) {
  const DF df;
  const int N = int(hn::Lanes(df));
  const VF weight = hn::Set(df, w);
  for (int i = 0; i < d; i += N) {
    hn::StoreU(hn::MulAdd(weight, Format::Load(df, block + 2 * i), hn::LoadU(df, acc + i)), df, acc + i);
  }
}

// ---------------------------------------------------------------------------------------------------------
// q8_0: per 32 elements, fp16 scale d = amax / 127 and q = round(x / d) in int8 (llama.cpp's block_q8_0).

constexpr int kQ8Bytes = int(sizeof(fmt::BlockQ8_0));  // 34: scale, then 32 int8
constexpr int kQ4Bytes = int(sizeof(fmt::BlockQ4_0));  // 18: scale, then 16 bytes of nibbles

HWY_INLINE float AbsMax32(DF df, const float* x) {
  const int N = int(hn::Lanes(df));
  VF m = hn::Zero(df);
  for (int j = 0; j < 32; j += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + j)));
  return hn::GetLane(hn::MaxOfLanes(df, m));
}

HWY_INLINE VF LoadQ8(DF df, const uint8_t* qs) {
  const hn::Rebind<int8_t, DF> d8;
  return hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(d8, reinterpret_cast<const int8_t*>(qs))));
}

void Q8_0Encode(const float* x, int d, uint8_t* block) {
  const DF df;
  const DI di;
  const hn::Rebind<int8_t, DF> d8;
  const int N = int(hn::Lanes(df));
  for (int b = 0; b < d / 32; ++b, x += 32, block += kQ8Bytes) {
    // Same arithmetic as formats::quantize_row: the float scale quantizes, its fp16 rounding is stored.
    const float scale = AbsMax32(df, x) / 127.0f;
    const VF inverse = hn::Set(df, scale != 0.0f ? 1.0f / scale : 0.0f);
    StoreScale(scale, block);
    for (int j = 0; j < 32; j += N) {
      VI q = RoundToInt(df, hn::Mul(hn::LoadU(df, x + j), inverse));
      q = hn::Min(hn::Max(q, hn::Set(di, -127)), hn::Set(di, 127));
      hn::StoreU(hn::DemoteTo(d8, q), d8, reinterpret_cast<int8_t*>(block + 2 + j));
    }
  }
}

void Q8_0Decode(const uint8_t* block, int d, float* x) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int b = 0; b < d / 32; ++b, x += 32, block += kQ8Bytes) {
    const VF scale = hn::Set(df, LoadScale(block));
    for (int j = 0; j < 32; j += N) hn::StoreU(hn::Mul(LoadQ8(df, block + 2 + j), scale), df, x + j);
  }
}

// Each int8 vector is scaled (one multiply) and multiplied into one of two accumulators, so consecutive
// blocks do not wait on each other's sums.
float Q8_0Score(const float* q, const uint8_t* block, int d) {
  const DF df;
  const int N = int(hn::Lanes(df));
  VF sum[2] = {hn::Zero(df), hn::Zero(df)};
  int k = 0;
  for (int b = 0; b < d / 32; ++b, q += 32, block += kQ8Bytes) {
    const VF scale = hn::Set(df, LoadScale(block));
    for (int j = 0; j < 32; j += N, k ^= 1) {
      sum[k] = hn::MulAdd(hn::Mul(LoadQ8(df, block + 2 + j), scale), hn::LoadU(df, q + j), sum[k]);
    }
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(sum[0], sum[1])));
}

void Q8_0Accumulate(float w, const uint8_t* block, int d, float* acc) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int b = 0; b < d / 32; ++b, acc += 32, block += kQ8Bytes) {
    const VF scale = hn::Set(df, w * LoadScale(block));
    for (int j = 0; j < 32; j += N) {
      hn::StoreU(hn::MulAdd(scale, LoadQ8(df, block + 2 + j), hn::LoadU(df, acc + j)), df, acc + j);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// q4_0: per 32 elements, fp16 scale d = max / -8 (max: the first element of largest magnitude, sign kept) and
// nibbles q = round(x / d) + 8 in [0, 15]; byte j holds element j (low nibble) and element j + 16 (high).

HWY_INLINE float SignedAbsMax32(DF df, const float* x) {
  const float amax = AbsMax32(df, x);
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) == amax) return x[j];
  }
  return 0.0f;  // only reached for NaN input
}

HWY_INLINE VI QuantizeNibbles(DF df, const float* x, VF inverse) {
  const DI di;
  const VI q = hn::Add(RoundToInt(df, hn::Mul(hn::LoadU(df, x), inverse)), hn::Set(di, 8));
  return hn::Min(hn::Max(q, hn::Zero(di)), hn::Set(di, 15));
}

// Elements j.. (low nibbles) and j + 16.. (high nibbles) of the bytes at qs, as signed values q - 8.
HWY_INLINE void LoadQ4(DF df, const uint8_t* qs, VF* low, VF* high) {
  const DI di;
  const hn::Rebind<uint8_t, DF> d8;
  const VI bytes = hn::PromoteTo(di, hn::LoadU(d8, qs));
  const VI eight = hn::Set(di, 8);
  *low = hn::ConvertTo(df, hn::Sub(hn::And(bytes, hn::Set(di, 0x0F)), eight));
  *high = hn::ConvertTo(df, hn::Sub(hn::ShiftRight<4>(bytes), eight));
}

void Q4_0Encode(const float* x, int d, uint8_t* block) {
  const DF df;
  const hn::Rebind<uint8_t, DF> d8;
  const int N = int(hn::Lanes(df));
  for (int b = 0; b < d / 32; ++b, x += 32, block += kQ4Bytes) {
    const float scale = SignedAbsMax32(df, x) / -8.0f;
    const VF inverse = hn::Set(df, scale != 0.0f ? 1.0f / scale : 0.0f);
    StoreScale(scale, block);
    for (int j = 0; j < 16; j += N) {
      const VI packed =
          hn::Or(QuantizeNibbles(df, x + j, inverse), hn::ShiftLeft<4>(QuantizeNibbles(df, x + 16 + j, inverse)));
      hn::StoreU(hn::DemoteTo(d8, packed), d8, block + 2 + j);
    }
  }
}

void Q4_0Decode(const uint8_t* block, int d, float* x) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int b = 0; b < d / 32; ++b, x += 32, block += kQ4Bytes) {
    const VF scale = hn::Set(df, LoadScale(block));
    for (int j = 0; j < 16; j += N) {
      VF low, high;
      LoadQ4(df, block + 2 + j, &low, &high);
      hn::StoreU(hn::Mul(low, scale), df, x + j);
      hn::StoreU(hn::Mul(high, scale), df, x + 16 + j);
    }
  }
}

float Q4_0Score(const float* q, const uint8_t* block, int d) {
  const DF df;
  const int N = int(hn::Lanes(df));
  VF low_sum = hn::Zero(df), high_sum = hn::Zero(df);  // elements j.. and j + 16.. of every block
  for (int b = 0; b < d / 32; ++b, q += 32, block += kQ4Bytes) {
    const VF scale = hn::Set(df, LoadScale(block));
    for (int j = 0; j < 16; j += N) {
      VF low, high;
      LoadQ4(df, block + 2 + j, &low, &high);
      low_sum = hn::MulAdd(hn::Mul(low, scale), hn::LoadU(df, q + j), low_sum);
      high_sum = hn::MulAdd(hn::Mul(high, scale), hn::LoadU(df, q + 16 + j), high_sum);
    }
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(low_sum, high_sum)));
}

void Q4_0Accumulate(float w, const uint8_t* block, int d, float* acc) {
  const DF df;
  const int N = int(hn::Lanes(df));
  for (int b = 0; b < d / 32; ++b, acc += 32, block += kQ4Bytes) {
    const VF scale = hn::Set(df, w * LoadScale(block));
    for (int j = 0; j < 16; j += N) {
      VF low, high;
      LoadQ4(df, block + 2 + j, &low, &high);
      hn::StoreU(hn::MulAdd(scale, low, hn::LoadU(df, acc + j)), df, acc + j);
      hn::StoreU(hn::MulAdd(scale, high, hn::LoadU(df, acc + 16 + j)), df, acc + 16 + j);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// q8_0 and q4_0 store the head vector's Walsh-Hadamard transform W x (formats/kv/stock_codecs.cpp says why):
// encode rotates before quantizing, decode rotates the dequantized block back (W is its own inverse); score
// and accumulate above read the dequantized block as it is, the basis row, against a query prepared by W.

void WalshHadamard(const float* in, int d, float* out) { hadamard_simd::OrthonormalHadamard(in, d, out); }

template <void (*Quantize)(const float*, int, uint8_t*)>
void HadamardEncode(const float* x, int d, uint8_t* block) {
  float rotated[fmt::kMaxKvHeadDim];
  WalshHadamard(x, d, rotated);
  Quantize(rotated, d, block);
}

template <void (*Dequantize)(const uint8_t*, int, float*)>
void HadamardDecode(const uint8_t* block, int d, float* x) {
  Dequantize(block, d, x);
  WalshHadamard(x, d, x);
}

// ---------------------------------------------------------------------------------------------------------
// Expand: a stock codec's row is its dequantized head vector (for q8_0 and q4_0 still in the Hadamard basis;
// f32 rows are the blocks themselves), and n blocks back to back are one run of n * d elements in the same
// layout (q8_0 and q4_0: d / 32 weight blocks per head vector), so expanding them is dequantizing that run.

template <void (*Dequantize)(const uint8_t*, int, float*)>
void DequantizeRun(const uint8_t* blocks, int n, int d, float* rows) {
  Dequantize(blocks, n * d, rows);
}

// ---------------------------------------------------------------------------------------------------------
// This target's kernels of each stock codec.

template <const fmt::KvCodecInfo& (*kInfo)(), class Format>
using HalfKernels = CheckedKernels<kInfo, HalfEncode<Format>, HalfDecode<Format>, CopyFloats, HalfScore<Format>,
                                   HalfAccumulate<Format>, CopyFloats, DequantizeRun<HalfDecode<Format>>>;

// q8_0 and q4_0 work in the Walsh-Hadamard basis: the query enters it and the output row leaves it through W.
template <const fmt::KvCodecInfo& (*kInfo)(), void (*Quantize)(const float*, int, uint8_t*),
          void (*Dequantize)(const uint8_t*, int, float*), float (*Score)(const float*, const uint8_t*, int),
          void (*Accumulate)(float, const uint8_t*, int, float*)>
using HadamardKernels = CheckedKernels<kInfo, HadamardEncode<Quantize>, HadamardDecode<Dequantize>, WalshHadamard,
                                       Score, Accumulate, WalshHadamard, DequantizeRun<Dequantize>>;

using F32Kernels = CheckedKernels<fmt::f32_codec, F32Encode, F32Decode, CopyFloats, F32Score, F32Accumulate,
                                  CopyFloats, DequantizeRun<F32Decode>>;

const CodecKernels& StockKernels(fmt::KvCodec codec) {
  switch (codec) {
    case fmt::KvCodec::F16: return HalfKernels<fmt::f16_codec, F16Format>::kTable;
    case fmt::KvCodec::BF16: return HalfKernels<fmt::bf16_codec, Bf16Format>::kTable;
    case fmt::KvCodec::Q8_0:
      return HadamardKernels<fmt::q8_0_codec, Q8_0Encode, Q8_0Decode, Q8_0Score, Q8_0Accumulate>::kTable;
    case fmt::KvCodec::Q4_0:
      return HadamardKernels<fmt::q4_0_codec, Q4_0Encode, Q4_0Decode, Q4_0Score, Q4_0Accumulate>::kTable;
    default: return F32Kernels::kTable;
  }
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparrow::cpu {

HWY_EXPORT(StockKernels);

const CodecKernels& stock_kernels(formats::KvCodec codec) { return HWY_DYNAMIC_DISPATCH(StockKernels)(codec); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
