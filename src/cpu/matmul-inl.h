

// Per-target matmul kernels, compiled once per SIMD target through hwy/foreach_target.h (see matmul.cpp).
//
// Quantized weights are multiplied with 8-bit activations (QuantizedTokens, like llama.cpp's Q8_0 / Q8_K) in
// integers: weights are unpacked into int16 lanes and pairs of int16 products summed into int32
// (ReorderWidenMulAccumulate: one pmaddwd on x86). Two drivers:
//  - few tokens (decode): a micro-kernel of kRows rows x up to kTile tokens walks each row once; a block is
//    unpacked once for all tokens of the tile, an activation vector loaded once for all rows;
//  - prompts: a GEMM with tokens in the vector lanes (see "Prompt processing" below), each row unpacked once
//    per task and used for every token (on AVX3_DL as int8 by vpdpbusd: "The GEMM with VNNI"; on AVX2 the
//    4-, 5- and 6-bit types as bytes by vpmaddubsw: "The byte GEMM on AVX2").
// On AVX-512 with VNNI (Highway's AVX3_DL target) the few-token kernels of the 32-element block types and of
// Q4_K/Q5_K multiply bytes instead: 64 quants per vector, by vpdpbusd (see "Legacy blocks with VNNI") or by
// vpmaddubsw with the sub-block scales applied by vpdpwssd (DotSuperBlockQ45KVnni, DotSuperBlockQ6KVnni). On AVX2
// the few-token Q4_K/Q5_K kernel multiplies bytes too, by vpmaddubsw with the scales applied by vpmaddwd
// (DotSuperBlockQ45KAvx2, two rows at a time for one token).
// What is per block rather than per element is done apart from the inner loops: block scales (f16 -> float
// times the activation scale), and constant offsets (-8 of Q4_0, -16 of Q5_0, the mins of Q4_1, Q5_1, Q4_K,
// Q5_K), which, as sum_i (q_i + o) x_i = sum_i q_i x_i + o * sum_i x_i, become a float dot product with the
// activations' per-32 sums. K-quant sub-block scales are multiplied into the int16 weights
// (|q * scale| <= 4096), so a 256-element super-block is summed in integers and converted to float once.
// Float weights (f32, f16, bf16) use a float dot product.
//
// Element order is natural in the row kernels: lane i of the vector for elements [k, k + N) holds element
// k + i.
#if defined(SPARROW_CPU_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SPARROW_CPU_MATMUL_INL_H_
#undef SPARROW_CPU_MATMUL_INL_H_
#else
#define SPARROW_CPU_MATMUL_INL_H_
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#if HWY_ARCH_ARM_A64 && defined(__linux__)
#include <asm/hwcap.h>  // HasDotProd (matmul_dotprod-inl.h)
#include <sys/auxv.h>
#endif

#include "cpu/matmul_job.h"
#include "formats/weight_formats.h"
#include "formats/weight_interleave.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3_DL
// Highway's AVX3_DL target enables AVX-VNNI (256-bit) but not AVX512-VNNI, which its CPU check requires.
#pragma GCC target("avx512vnni")
#endif
namespace sparrow::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace fmt = sparrow::formats;


// int16 lanes, capped at 32 (512 bits): one 32-element block is then one vector on AVX-512, two on AVX2.
// The kernels step through blocks by MaxLanes, so on scalable targets (SVE, RVV), where the lane count is
// only known at run time, they use fixed 128-bit vectors.
#if HWY_HAVE_SCALABLE
using D16 = hn::FixedTag<int16_t, 8>;
using DF8 = hn::FixedTag<float, 4>;
#else
using D16 = hn::CappedTag<int16_t, 32>;
using DF8 = hn::CappedTag<float, 8>;  // block scales, 8 at a time
#endif
using DU16 = hn::RebindToUnsigned<D16>;
using D32 = hn::Repartition<int32_t, D16>;
using DF = hn::Rebind<float, D32>;
using V16 = hn::Vec<D16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;
constexpr size_t kLanes = hn::MaxLanes(D16());
constexpr size_t kVecs32 = 32 / kLanes;  // vectors per 32 elements

// The micro-kernel multiplies kRows weight rows with kTile tokens: a weight block is unpacked once per row
// and used for kTile tokens, an activation vector is loaded once per token and used for kRows rows. Two
// rows where 32 vector registers hold the 2 x 4 int32 and float accumulators (AVX-512); else one.
constexpr int kTile = 4;
constexpr int kRows = kLanes >= 32 ? 2 : 1;

// f16 block scale -> float, inline and branch-free: the 15 magnitude bits shifted into a float's exponent
// and mantissa are the value times 2^-112 (exact, subnormal halves included). Valid for finite halves, which
// is all a block scale can meaningfully be (the reference dequantize_row handles every bit pattern).
HWY_INLINE float ScaleF16(uint16_t h) {
  const float magnitude = std::bit_cast<float>(uint32_t(h & 0x7FFF) << 13) * 0x1.0p112f;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | (uint32_t(h & 0x8000) << 16));
}

// Bytes [p, p + N) zero-extended to N int16 lanes.
template <class D>
HWY_INLINE hn::Vec<D> LoadBytes(D d, const uint8_t* p) {
  const hn::RebindToUnsigned<D> du;
  return hn::BitCast(d, hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint8_t, D>(), p)));
}

// The 32 nibbles of a Q4_0/Q4_1/Q5_0/Q5_1 block: element j in the low nibble of qs[j], element j + 16 in
// the high nibble.
template <class D>
HWY_INLINE void UnpackNibbles32(D d, const uint8_t* qs, hn::Vec<D>* w) {
  constexpr size_t N = hn::MaxLanes(d);
  if constexpr (N >= 32) {
    const hn::Half<D> dh;
    const auto bytes = LoadBytes(dh, qs);
    w[0] = Combine(d, hn::ShiftRight<4>(bytes), hn::And(bytes, hn::Set(dh, 0x0F)));
  } else {
    for (size_t k = 0; k < 16; k += N) {
      const auto bytes = LoadBytes(d, qs + k);
      w[k / N] = hn::And(bytes, hn::Set(d, 0x0F));
      w[(16 + k) / N] = hn::ShiftRight<4>(bytes);
    }
  }
}

// ORs the fifth bits of a Q5_0/Q5_1 block (bit j of the little-endian qh word belongs to element j) into w.
template <class D>
HWY_INLINE void AddFifthBits32(D d, const uint8_t* qh, hn::Vec<D>* w) {
  constexpr size_t N = hn::MaxLanes(d);
  const auto sixteen = hn::Set(d, 16);
  for (size_t k = 0; k < 32; k += N) {
    if constexpr (N >= 8) {
      w[k / N] = hn::Or(w[k / N], hn::IfThenElseZero(hn::LoadMaskBits(d, qh + k / 8), sixteen));
    } else {
      for (size_t i = 0; i < N; ++i) {  // scalar targets: one lane at a time
        if ((qh[(k + i) / 8] >> ((k + i) % 8)) & 1) {
          w[k / N] = hn::Or(w[k / N], hn::InsertLane(hn::Zero(d), i, int16_t(16)));
        }
      }
    }
  }
}


// Lane i: a[2i] * b[2i] + a[2i + 1] * b[2i + 1], as pmaddwd. Highway 1.0.3's ReorderWidenMulAccumulate leaves
// which products land in which lane to the target (x86 sums pairs in place; NEON puts the lower half's products
// in sum0 and the upper half's in sum1), which a dot product may ignore but the GEMM, whose lanes are tokens,
// may not.
HWY_INLINE V32 MulPairwise(V16 a, V16 b) {
#if HWY_ARCH_X86
  V32 upper = hn::Zero(D32());  // stays zero on x86
  return hn::ReorderWidenMulAccumulate(D32(), a, b, hn::Zero(D32()), upper);
#elif HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
  const int32x4_t lower = vmull_s16(vget_low_s16(a.raw), vget_low_s16(b.raw));
  return V32(vpaddq_s32(lower, vmull_high_s16(a.raw, b.raw)));
#else
  const D32 d32;
  const V32 a32 = hn::BitCast(d32, a), b32 = hn::BitCast(d32, b);  // element 2i in the low half of lane i
  const V32 even = hn::Mul(hn::ShiftRight<16>(hn::ShiftLeft<16>(a32)), hn::ShiftRight<16>(hn::ShiftLeft<16>(b32)));
  return hn::Add(even, hn::Mul(hn::ShiftRight<16>(a32), hn::ShiftRight<16>(b32)));
#endif
}

// ---------------------------------------------------------------------------------------------------------
// Shared pieces: activations of one token, float helpers, accumulators.

constexpr int kChunkBlocks32 = 64;  // 2048 elements of legacy types per chunk
constexpr int kChunkSuper = 8;      // 2048 elements of K-quants per chunk
constexpr int kChunkSub32 = kChunkSuper * 8;

// One token's activations as seen by a kernel.
struct TokenQ {
  const int16_t* q;
  const int8_t* q8;            // the same values as bytes
  const float* scale;          // per activation group
  const float* scaled_sum32;   // per 32 elements
  const float* pair_scale;     // VNNI kernels: see QuantizedTokens
  const int32_t* pair_sum;
  const int16_t* sum16;
};

// Token t's quantized activations.
HWY_INLINE TokenQ TokenAt(const MatmulJob& job, int64_t t) {
  const int64_t n_groups = job.n_in / job.xq.group, pair_lanes = t * block_pairs(job.n_in) * 16;
  return {job.xq.q + t * job.n_in,    job.xq.q8 + t * job.n_in,       job.xq.scale + t * n_groups,
          job.xq.scaled_sum32 + t * (job.n_in / 32), job.xq.pair_scale + pair_lanes, job.xq.pair_sum + pair_lanes,
          job.xq.sum16 + t * (job.n_in / 16)};
}

HWY_INLINE float DotFloats(const float* a, const float* b, int n) {
  const hn::ScalableTag<float> df;
  const int N = int(hn::Lanes(df));
  auto acc = hn::Zero(df);
  int i = 0;
  for (; i + N <= n; i += N) acc = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc);
  float sum = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// out[p] = sum of the lanes of total[p] + offset[p], for the R x T (row, token) pairs p = r * T + t.
template <int P>
HWY_INLINE void StoreSums(const VF* total, const float* offset, float* out) {
  for (int p = 0; p < P; ++p) out[p] = hn::GetLane(hn::SumOfLanes(DF(), total[p])) + offset[p];
}

// acc += float(isum) * scale
HWY_INLINE VF ScaledAdd(V32 isum, float scale, VF acc) {
  return hn::MulAdd(hn::ConvertTo(DF(), isum), hn::Set(DF(), scale), acc);
}

// The row kernels walk R rows a block (or super-block) at a time and prefetch the weights one call ahead: matrix
// rows are contiguous, so the next R rows begin where these end, and step i here reads what step i will read
// there. Without it each step waits for its own cache misses (the hardware prefetcher follows R interleaved
// streams poorly): T=1 GEMVs ran at a third of the read bandwidth.
template <int R, class Block>
HWY_INLINE void PrefetchNextRows(const Block* const* blocks, int64_t nb, int64_t i) {
  constexpr size_t kStepBytes = R * sizeof(Block);
  const char* next = reinterpret_cast<const char*>(blocks[R - 1] + nb) + size_t(i) * kStepBytes;
  for (size_t line = 0; line < kStepBytes; line += 64) hwy::Prefetch(next + line);
}

// ---------------------------------------------------------------------------------------------------------
// Legacy 32-element blocks.

// Per type: the block layout, how to unpack its quants to int16 (raw, without offset), and the constant
// offset of the quants: kOffset * d (Q4_0: -8, Q5_0: -16) or a stored min (Q4_1, Q5_1).
template <TensorType kType>
struct Legacy;

template <>
struct Legacy<TensorType::Q8_0> {
  using Block = fmt::BlockQ8_0;
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = false;
  static HWY_INLINE void Unpack(const Block& b, V16* w) {
    const hn::Rebind<int8_t, D16> d8;
    for (size_t k = 0; k < 32; k += kLanes) w[k / kLanes] = hn::PromoteTo(D16(), hn::LoadU(d8, b.qs + k));
  }
  static HWY_INLINE uint16_t Min(const Block&) { return 0; }
};

template <>
struct Legacy<TensorType::Q4_0> {
  using Block = fmt::BlockQ4_0;
  static constexpr int kOffset = -8;
  static constexpr bool kHasMin = false;
  static HWY_INLINE void Unpack(const Block& b, V16* w) { UnpackNibbles32(D16(), b.qs, w); }
  static HWY_INLINE uint16_t Min(const Block&) { return 0; }
};

template <>
struct Legacy<TensorType::Q4_1> {
  using Block = fmt::BlockQ4_1;
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = true;
  static HWY_INLINE void Unpack(const Block& b, V16* w) { UnpackNibbles32(D16(), b.qs, w); }
  static HWY_INLINE uint16_t Min(const Block& b) { return b.m; }
};

template <>
struct Legacy<TensorType::Q5_0> {
  using Block = fmt::BlockQ5_0;
  static constexpr int kOffset = -16;
  static constexpr bool kHasMin = false;
  static HWY_INLINE void Unpack(const Block& b, V16* w) {
    UnpackNibbles32(D16(), b.qs, w);
    AddFifthBits32(D16(), b.qh, w);
  }
  static HWY_INLINE uint16_t Min(const Block&) { return 0; }
};

template <>
struct Legacy<TensorType::Q5_1> {
  using Block = fmt::BlockQ5_1;
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = true;
  static HWY_INLINE void Unpack(const Block& b, V16* w) {
    UnpackNibbles32(D16(), b.qs, w);
    AddFifthBits32(D16(), b.qh, w);
  }
  static HWY_INLINE uint16_t Min(const Block& b) { return b.m; }
};

// f16 fields of up to 8 consecutive blocks (zero past n_left) -> 8 floats: the halves are inserted lane by
// lane (a gather is slow on some cores, and a vector load of values just stored one by one stalls on store
// forwarding) and converted together.
template <class Block, class Field>
HWY_INLINE hn::Vec<DF8> BlockHalvesToFloat(const Block* blocks, int n_left, Field field) {
  const DF8 df;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  auto bits = hn::Zero(du16);
  if constexpr (hn::MaxLanes(du16) == 8) {
    if (n_left >= 8) {
      // Four halves per 64-bit word, put together in general registers by independent loads and shifts: inserting
      // lane by lane is one chain of eight dependent inserts, which cost as much as a short row's dot products.
      const auto word = [&](int i) HWY_ATTR {
        return uint64_t(field(blocks[i])) | uint64_t(field(blocks[i + 1])) << 16 |
               uint64_t(field(blocks[i + 2])) << 32 | uint64_t(field(blocks[i + 3])) << 48;
      };
      const hn::Repartition<uint64_t, decltype(du16)> du64;
      bits = hn::BitCast(du16, hn::InsertLane(hn::Set(du64, word(0)), 1, word(4)));
      return hn::PromoteTo(df, hn::BitCast(hn::Rebind<hwy::float16_t, decltype(df)>(), bits));
    }
  }
  // Literal lane indices, so that InsertLane becomes one insert instruction.
#define SPARROW_INSERT_HALF(i) \
  if (i < hn::MaxLanes(du16) && i < n_left) bits = hn::InsertLane(bits, i, field(blocks[i]));
  SPARROW_INSERT_HALF(0) SPARROW_INSERT_HALF(1) SPARROW_INSERT_HALF(2) SPARROW_INSERT_HALF(3)
  SPARROW_INSERT_HALF(4) SPARROW_INSERT_HALF(5) SPARROW_INSERT_HALF(6) SPARROW_INSERT_HALF(7)
#undef SPARROW_INSERT_HALF
  return hn::PromoteTo(df, hn::BitCast(hn::Rebind<hwy::float16_t, decltype(df)>(), bits));
}

// Legacy block scales of one chunk of one row, for every token of the tile: dd[t][b] = d_w[b] * d_x[t][b]
// (kScales: not for the VNNI kernels, which weigh by d_w and d_x apart), and the offset term, offset[t] +=
// sum_b offset_w[b] * scaled_sum32_x[t][b] (for the VNNI kernels only the mins). Eight blocks at a time (the
// last group zero-padded; dd has room, and the activation arrays are padded by the caller).
template <TensorType kType, int T, bool kScales>
HWY_INLINE void PrepareLegacyChunk(const typename Legacy<kType>::Block* blocks, int n, const TokenQ* x, int64_t c0,
                                   float (*dd)[kChunkBlocks32], float* offset) {
  using L = Legacy<kType>;
  using Block = typename L::Block;
  constexpr bool kOffsetTerm = L::kHasMin || (kScales && L::kOffset != 0);
  const DF8 df;
  const int N = int(hn::Lanes(df));
  decltype(hn::Zero(df)) offset_sum[T];
  for (int t = 0; t < T; ++t) offset_sum[t] = hn::Zero(df);
  for (int b = 0; b < n; b += N) {
    const Block* group = blocks + c0 + b;
    auto d_w = hn::Zero(df);
    if constexpr (kScales) d_w = BlockHalvesToFloat(group, n - b, [](const Block& blk) HWY_ATTR { return blk.d; });
    auto offset_w = hn::Zero(df);
    if constexpr (L::kHasMin) {
      offset_w = BlockHalvesToFloat(group, n - b, [](const Block& blk) HWY_ATTR { return L::Min(blk); });
    } else if constexpr (L::kOffset != 0) {
      offset_w = hn::Mul(d_w, hn::Set(df, float(L::kOffset)));
    }
    for (int t = 0; t < T; ++t) {
      if constexpr (kScales) hn::StoreU(hn::Mul(d_w, hn::LoadU(df, x[t].scale + c0 + b)), df, dd[t] + b);
      if constexpr (kOffsetTerm) {
        offset_sum[t] = hn::MulAdd(offset_w, hn::LoadU(df, x[t].scaled_sum32 + c0 + b), offset_sum[t]);
      }
    }
  }
  if constexpr (kOffsetTerm) {
    for (int t = 0; t < T; ++t) offset[t] += hn::GetLane(hn::SumOfLanes(df, offset_sum[t]));
  }
}

#if HWY_TARGET == HWY_AVX3_DL
// ---------------------------------------------------------------------------------------------------------
// Legacy blocks with VNNI. A vector holds blocks b and b + 1 as 64 bytes (block b's elements in bytes 0-31),
// multiplied with the token's activations by vpdpbusd (unsigned bytes times signed bytes, four products per
// int32 lane): int32 lanes 0-7 sum block b's products, lanes 8-15 block b + 1's. The lanes are converted to
// float and weighed by the two blocks' scales, d_w (per row, broadcast from the blocks' halves) times d_x (per
// token, laid out this way once by QuantizeTokens), so that no per-block scale is prepared per row and token.
// Constant offsets are integer terms added where the products start:
//  - Q4_0, Q5_0: unsigned quants q with offset o (-8, -16): sum (q + o) x = sum q x + o * sum x, where sum x
//    is the token's (QuantizedTokens::pair_sum), the same for every row;
//  - Q8_0: signed quants times signed activations, which vpdpbusd cannot take: the activations are offset to
//    unsigned x + 128, and sum (x + 128) q = sum q x + 128 * sum q subtracts the row's 128 * sum q (per row,
//    the same for every token).
// The mins of Q4_1 and Q5_1 stay in PrepareLegacyChunk's float offset term.

// Blocks b0 and b1 as 64 bytes: Q8_0's signed quants as they are, the others' unsigned quants without offset.
template <TensorType kType>
HWY_INLINE __m512i UnpackBlockPair(const typename Legacy<kType>::Block* b0, const typename Legacy<kType>::Block* b1) {
  if constexpr (kType == TensorType::Q8_0) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0->qs))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1->qs)), 1);
  } else {
    // Element j in the low nibble of qs[j], element j + 16 in the high one: the 16 bytes of each block go to two
    // 128-bit lanes, the second of which is shifted down by a nibble.
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0->qs));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1->qs));
    __m512i v = _mm512_inserti32x4(_mm512_castsi128_si512(q0), q0, 1);
    v = _mm512_inserti32x4(_mm512_inserti32x4(v, q1, 2), q1, 3);
    v = _mm512_and_si512(_mm512_mask_blend_epi64(0xCC, v, _mm512_srli_epi16(v, 4)), _mm512_set1_epi8(0x0F));
    if constexpr (kType == TensorType::Q5_0 || kType == TensorType::Q5_1) {
      uint32_t h0, h1;  // bit j: element j's fifth bit
      std::memcpy(&h0, b0->qh, 4);
      std::memcpy(&h1, b1->qh, 4);
      v = _mm512_mask_add_epi8(v, __mmask64(h0) | (__mmask64(h1) << 32), v, _mm512_set1_epi8(16));
    }
    return v;
  }
}

// The f16 scales of two blocks as 16 floats: h0 in lanes 0-7, h1 in lanes 8-15.
HWY_INLINE __m512 PairScales(uint16_t h0, uint16_t h1) {
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(short(h0))),
                                                 _mm_set1_epi16(short(h1)), 1));
}

// R rows of nb blocks times T tokens, added to total.
template <TensorType kType, int R, int T>
HWY_INLINE void DotRowsLegacyVnni(const typename Legacy<kType>::Block* const* blocks, int64_t nb, const TokenQ* x,
                                  VF* total) {
  using Block = typename Legacy<kType>::Block;
  constexpr bool kSigned = kType == TensorType::Q8_0;
  constexpr int kOffset = Legacy<kType>::kOffset;
  static_assert(kOffset == 0 || kOffset == -8 || kOffset == -16, "offsets are applied as shifts");
  constexpr int kOffsetShift = kOffset == -8 ? 3 : 4;
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t b = 0; b < nb; b += 2) {
    PrefetchNextRows<R>(blocks, nb, b);
    PrefetchNextRows<R>(blocks, nb, b + 1);
    // An odd last block pairs with itself; its upper lanes have zero activation scales (QuantizeTokens), and
    // the activations there are not read past the row.
    const bool single = b + 1 == nb;
    const __mmask64 x_lanes = single ? __mmask64(0xFFFFFFFF) : ~__mmask64(0);
    __m512i w[R], row_start[R];
    __m512 d_w[R];
    for (int r = 0; r < R; ++r) {
      const Block* b0 = &blocks[r][b];
      const Block* b1 = single ? b0 : b0 + 1;
      w[r] = UnpackBlockPair<kType>(b0, b1);
      d_w[r] = PairScales(b0->d, b1->d);
      if constexpr (kSigned) {  // -128 * sum q, four quants per lane
        row_start[r] = _mm512_sub_epi32(zero, _mm512_slli_epi32(_mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), w[r]), 7));
      }
    }
    for (int t = 0; t < T; ++t) {
      __m512i xv = _mm512_maskz_loadu_epi8(x_lanes, x[t].q8 + b * 32);
      __m512i token_start = zero;
      if constexpr (kSigned) {
        xv = _mm512_xor_si512(xv, _mm512_set1_epi8(char(0x80)));  // x + 128 as unsigned bytes
      } else if constexpr (kOffset != 0) {
        token_start = _mm512_sub_epi32(zero, _mm512_slli_epi32(_mm512_loadu_si512(x[t].pair_sum + b * 8), kOffsetShift));
      }
      const __m512 d_x = _mm512_loadu_ps(x[t].pair_scale + b * 8);
      for (int r = 0; r < R; ++r) {
        const __m512i dot = kSigned ? _mm512_dpbusd_epi32(row_start[r], xv, w[r]) : _mm512_dpbusd_epi32(token_start, w[r], xv);
        total[r * T + t].raw = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d_w[r], d_x), total[r * T + t].raw);
      }
    }
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

template <TensorType kType, int R, int T>
HWY_INLINE void DotRowsLegacy(const uint8_t* const* rows, int64_t n_in, const TokenQ* x, float* out) {
  using L = Legacy<kType>;
  using Block = typename L::Block;
  const Block* blocks[R];
  for (int r = 0; r < R; ++r) blocks[r] = reinterpret_cast<const Block*>(rows[r]);
  const int64_t nb = n_in / 32;
  // Accumulators are plain local arrays with constant indices after unrolling (no lambda, no pointer into
  // them escapes), so that they live in registers; the same holds in the K-quant kernels.
  VF total[R * T];
  for (int p = 0; p < R * T; ++p) total[p] = hn::Zero(DF());
  float offset[R * T] = {};
#if HWY_TARGET == HWY_AVX3_DL
  DotRowsLegacyVnni<kType, R, T>(blocks, nb, x, total);
  if constexpr (L::kHasMin) {
    for (int64_t c0 = 0; c0 < nb; c0 += kChunkBlocks32) {
      const int n = int(std::min<int64_t>(kChunkBlocks32, nb - c0));
      for (int r = 0; r < R; ++r) PrepareLegacyChunk<kType, T, false>(blocks[r], n, x, c0, nullptr, offset + r * T);
    }
  }
#else
  HWY_ALIGN float dd[R][T][kChunkBlocks32];
  for (int64_t c0 = 0; c0 < nb; c0 += kChunkBlocks32) {
    const int n = int(std::min<int64_t>(kChunkBlocks32, nb - c0));
    for (int r = 0; r < R; ++r) PrepareLegacyChunk<kType, T, true>(blocks[r], n, x, c0, dd[r], offset + r * T);
    VF acc[R * T];
    for (int p = 0; p < R * T; ++p) acc[p] = hn::Zero(DF());
    for (int b = 0; b < n; ++b) {
      PrefetchNextRows<R>(blocks, nb, c0 + b);
      V16 w[R][kVecs32];
      for (int r = 0; r < R; ++r) L::Unpack(blocks[r][c0 + b], w[r]);
      for (int t = 0; t < T; ++t) {
        const int16_t* xq = x[t].q + (c0 + b) * 32;
        V32 sum0[R], sum1[R];
        for (int r = 0; r < R; ++r) sum0[r] = sum1[r] = hn::Zero(D32());
        for (size_t k = 0; k < kVecs32; ++k) {
          const V16 xv = hn::LoadU(D16(), xq + k * kLanes);
          for (int r = 0; r < R; ++r) sum0[r] = hn::ReorderWidenMulAccumulate(D32(), w[r][k], xv, sum0[r], sum1[r]);
        }
        for (int r = 0; r < R; ++r) acc[r * T + t] = ScaledAdd(hn::Add(sum0[r], sum1[r]), dd[r][t][b], acc[r * T + t]);
      }
    }
    for (int p = 0; p < R * T; ++p) total[p] = hn::Add(total[p], acc[p]);
  }
#endif
  StoreSums<R * T>(total, offset, out);
}

// ---------------------------------------------------------------------------------------------------------
// K-quants: 256-element super-blocks.

// The Q6_K scale of 16-element sub-block `sub` as an int16 vector; when a vector spans two sub-blocks
// (512-bit targets), its upper 16 lanes take the scale of sub + 1.
template <class D>
HWY_INLINE hn::Vec<D> SubBlockScales(D d, const int8_t* scales, int sub) {
  if constexpr (hn::MaxLanes(d) > 16) {
    const hn::Half<D> dh;
    return Combine(d, hn::Set(dh, scales[sub + 1]), hn::Set(dh, scales[sub]));
  } else {
    return hn::Set(d, scales[sub]);
  }
}

// All eight 6-bit scales and mins of a Q4_K/Q5_K block at once, four bytes per 32-bit word (the packing is
// described at formats::unpack_scale_min_k4): sub-blocks 0..3 are the low six bits of bytes 0..3 (scales)
// and 4..7 (mins); sub-blocks 4..7 take a nibble from bytes 8..11 and their top two bits from the high bits
// of bytes 0..7.
HWY_INLINE void UnpackScalesMinsK4(const uint8_t* packed, uint8_t* scales, uint8_t* mins) {
  static_assert(std::endian::native == std::endian::little, "K-quant scale unpacking assumes little endian");
  uint32_t w[3];
  std::memcpy(w, packed, 12);
  const uint32_t scales_lo = w[0] & 0x3F3F3F3Fu, mins_lo = w[1] & 0x3F3F3F3Fu;
  const uint32_t scales_hi = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u);
  const uint32_t mins_hi = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u);
  std::memcpy(scales, &scales_lo, 4);
  std::memcpy(scales + 4, &scales_hi, 4);
  std::memcpy(mins, &mins_lo, 4);
  std::memcpy(mins + 4, &mins_hi, 4);
}

// Eight unsigned bytes as int16 scales, and as floats times `factor`.
HWY_INLINE void WidenEight(const uint8_t* bytes, int16_t* as_int16) {
  const hn::CappedTag<int16_t, 8> d;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  for (size_t i = 0; i < 8; i += hn::Lanes(d)) hn::StoreU(hn::BitCast(d, hn::PromoteTo(hn::RebindToUnsigned<decltype(d)>(), hn::LoadU(d8, bytes + i))), d, as_int16 + i);
}

HWY_INLINE void ScaleEight(const uint8_t* bytes, float factor, float* out) {
  const hn::CappedTag<float, 8> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  for (size_t i = 0; i < 8; i += hn::Lanes(df)) {
    const auto v = hn::ConvertTo(df, hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<decltype(di)>(), hn::LoadU(d8, bytes + i))));
    hn::StoreU(hn::Mul(v, hn::Set(df, factor)), df, out + i);
  }
}

// Per-row data of a chunk of Q4_K/Q5_K super-blocks: int16 sub-block scales, and the scale products and
// min terms for the tile's tokens.
template <class Block, int T>
HWY_INLINE void PrepareQ45KChunk(const Block* blocks, int n, const TokenQ* x, int64_t c0, int16_t* scales,
                                 float (*dd)[kChunkSuper], float* offset) {
  HWY_ALIGN float d_w[kChunkSuper], min_w[kChunkSub32];
  for (int b = 0; b < n; ++b) {
    const Block& blk = blocks[c0 + b];
    d_w[b] = ScaleF16(blk.d);
    uint8_t sc[8], m[8];
    UnpackScalesMinsK4(blk.scales, sc, m);
    WidenEight(sc, scales + 8 * b);
    ScaleEight(m, -ScaleF16(blk.dmin), min_w + 8 * b);
  }
  for (int t = 0; t < T; ++t) {
    for (int b = 0; b < n; ++b) dd[t][b] = d_w[b] * x[t].scale[c0 + b];  // scalar: see PrepareLegacyChunk
    offset[t] += DotFloats(min_w, x[t].scaled_sum32 + 8 * c0, 8 * n);
  }
}

// Q4_K/Q5_K chunk c (0..3) of a super-block covers elements [64c, 64c + 64): low nibbles are sub-block 2c,
// high nibbles 2c + 1.
template <bool kFiveBits, int R, int T>
HWY_INLINE void DotChunkQ45K(const uint8_t* const* qs, const uint8_t* const* qh, int chunk,
                             const int16_t* const* scales, const TokenQ* x, int64_t base, V32* isum) {
  const D16 d16;
  for (size_t k = 0; k < 32; k += kLanes) {
    V16 lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      const V16 bytes = LoadBytes(d16, qs[r] + 32 * chunk + k);
      lo[r] = hn::And(bytes, hn::Set(d16, 0x0F));
      hi[r] = hn::ShiftRight<4>(bytes);
      if constexpr (kFiveBits) {
        const V16 bits = hn::ShiftRightSame(LoadBytes(d16, qh[r] + k), 2 * chunk);
        lo[r] = hn::Or(lo[r], hn::ShiftLeft<4>(hn::And(bits, hn::Set(d16, 1))));
        hi[r] = hn::Or(hi[r], hn::ShiftLeft<3>(hn::And(bits, hn::Set(d16, 2))));
      }
      lo[r] = hn::Mul(lo[r], hn::Set(d16, scales[r][2 * chunk]));
      hi[r] = hn::Mul(hi[r], hn::Set(d16, scales[r][2 * chunk + 1]));
    }
    for (int t = 0; t < T; ++t) {
      const int16_t* xq = x[t].q + base + 64 * chunk + k;
      const V16 x_lo = hn::LoadU(d16, xq), x_hi = hn::LoadU(d16, xq + 32);
      for (int r = 0; r < R; ++r) {
        V32& sum = isum[r * T + t];
        V32 s1 = hn::Zero(D32());
        sum = hn::ReorderWidenMulAccumulate(D32(), lo[r], x_lo, sum, s1);
        sum = hn::ReorderWidenMulAccumulate(D32(), hi[r], x_hi, sum, s1);
        sum = hn::Add(sum, s1);
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX3_DL
// Q4_K/Q5_K with VNNI: chunk c's 64 quants (sub-blocks 2c and 2c + 1) as unsigned bytes in one vector times the
// token's 64 int8 activations by vpmaddubsw, into 32 int16 pair sums (lanes 0-15 sub-block 2c, 16-31 sub-block
// 2c + 1; at most 2 * 31 * 127, no saturation), which vpdpwssd multiplies by their 6-bit sub-block scales and adds
// into int32: the whole super-block is summed in integers, then weighed once by d_w * d_x. The mins stay in
// PrepareQ45KChunk's offset term.
// One super-block of R rows (quants qs, fifth bits qh, 8 sub-block scales sc per row) times T tokens (activations
// from element `base`), added to total with the scale products dd[r][t][b].
template <bool kFive, int R, int T>
HWY_INLINE void DotSuperBlockQ45KVnni(const uint8_t* const* qs, const uint8_t* const* qh, const int16_t* const* sc,
                                      const float (*dd)[T][kChunkSuper], int b, const TokenQ* x, int64_t base,
                                      VF* total) {
  __m512i isum[R * T];
  for (int p = 0; p < R * T; ++p) isum[p] = _mm512_setzero_si512();
  __m512i scales8[R];  // the 8 int16 sub-block scales in the low lanes
  for (int r = 0; r < R; ++r) scales8[r] = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc[r])));
  HWY_UNROLL(1)
  for (int chunk = 0; chunk < 4; ++chunk) {
    // int16 lanes 0-15 pick scale 2c, lanes 16-31 scale 2c + 1.
    const __m512i pick = _mm512_inserti64x4(_mm512_set1_epi16(short(2 * chunk)), _mm256_set1_epi16(short(2 * chunk + 1)), 1);
    __m512i w[R], sub_scale[R];
    for (int r = 0; r < R; ++r) {
      // Low nibbles are elements 0-31 of the chunk, high nibbles 32-63: the bytes twice, the upper copy shifted.
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[r] + 32 * chunk));
      __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
      v = _mm512_and_si512(_mm512_mask_blend_epi64(0xF0, v, _mm512_srli_epi16(v, 4)), _mm512_set1_epi8(0x0F));
      if constexpr (kFive) {
        // Element k's fifth bit is bit 2c of qh[k] for the low nibbles, bit 2c + 1 for the high ones.
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh[r]));
        const __m512i select = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (2 * chunk))),
                                                  _mm256_set1_epi8(char(1 << (2 * chunk + 1))), 1);
        const __mmask64 fifth = _mm512_test_epi8_mask(_mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1), select);
        v = _mm512_mask_add_epi8(v, fifth, v, _mm512_set1_epi8(16));
      }
      w[r] = v;
      sub_scale[r] = _mm512_permutexvar_epi16(pick, scales8[r]);
    }
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_loadu_si512(x[t].q8 + base + 64 * chunk);
      for (int r = 0; r < R; ++r) {
        isum[r * T + t] = _mm512_dpwssd_epi32(isum[r * T + t], _mm512_maddubs_epi16(w[r], xv), sub_scale[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      total[r * T + t].raw = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r * T + t]), _mm512_set1_ps(dd[r][t][b]), total[r * T + t].raw);
    }
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

#if HWY_TARGET == HWY_AVX2
// Q4_K/Q5_K on AVX2: chunk c's 64 quants as unsigned bytes, the low nibbles (sub-block 2c, elements 0-31 of the
// chunk) in one vector and the high nibbles (2c + 1, elements 32-63) in another, times the token's int8
// activations by vpmaddubsw into 16 int16 pair sums each (at most 2 * 31 * 127, no saturation), which vpmaddwd
// multiplies by the sub-block's 6-bit scale into int32: the super-block is summed in integers, then weighed once
// by d_w * d_x, like the int16 kernel (DotChunkQ45K) but without widening weights and activations to int16 or
// multiplying each weight by its scale. The mins stay in PrepareQ45KChunk's offset term. One super-block of R rows (quants qs,
// fifth bits qh, 8 sub-block scales sc per row) times T tokens (int8 activations from element `base`), added to
// total with the scale products dd[r][t][b].
template <bool kFive, int R, int T>
HWY_INLINE void DotSuperBlockQ45KAvx2(const uint8_t* const* qs, const uint8_t* const* qh, const int16_t* const* sc,
                                      const float (*dd)[T][kChunkSuper], int b, const TokenQ* x, int64_t base,
                                      VF* total) {
  __m256i isum[R * T];
  for (int p = 0; p < R * T; ++p) isum[p] = _mm256_setzero_si256();
  const __m256i nibble = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  HWY_UNROLL(1)
  for (int chunk = 0; chunk < 4; ++chunk) {
    __m256i lo[R], hi[R], scale_lo[R], scale_hi[R];
    for (int r = 0; r < R; ++r) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[r] + 32 * chunk));
      lo[r] = _mm256_and_si256(q, nibble);
      hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
      if constexpr (kFive) {
        // Element k's fifth bit is bit 2c of qh[k] for the low nibbles, bit 2c + 1 for the high ones: +16 where set.
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh[r]));
        const __m256i bit_lo = _mm256_set1_epi8(char(1 << (2 * chunk))), bit_hi = _mm256_set1_epi8(char(2 << (2 * chunk)));
        lo[r] = _mm256_add_epi8(lo[r], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit_lo), bit_lo), sixteen));
        hi[r] = _mm256_add_epi8(hi[r], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit_hi), bit_hi), sixteen));
      }
      scale_lo[r] = _mm256_set1_epi16(sc[r][2 * chunk]);
      scale_hi[r] = _mm256_set1_epi16(sc[r][2 * chunk + 1]);
    }
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x[t].q8 + base + 64 * chunk;
      const __m256i x_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
      const __m256i x_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
      for (int r = 0; r < R; ++r) {
        const __m256i sum_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], x_lo), scale_lo[r]);
        const __m256i sum_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], x_hi), scale_hi[r]);
        isum[r * T + t] = _mm256_add_epi32(isum[r * T + t], _mm256_add_epi32(sum_lo, sum_hi));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      V32 sum;
      sum.raw = isum[r * T + t];
      total[r * T + t] = ScaledAdd(sum, dd[r][t][b], total[r * T + t]);
    }
  }
}
#endif  // HWY_TARGET == HWY_AVX2

template <TensorType kType, int R, int T>
HWY_INLINE void DotRowsQ45K(const uint8_t* const* rows, int64_t n_in, const TokenQ* x, float* out) {
  constexpr bool kFive = kType == TensorType::Q5_K;
  using Block = std::conditional_t<kFive, fmt::BlockQ5_K, fmt::BlockQ4_K>;
  const Block* blocks[R];
  for (int r = 0; r < R; ++r) blocks[r] = reinterpret_cast<const Block*>(rows[r]);
  const int64_t nb = n_in / fmt::QK_K;
  VF total[R * T];
  for (int p = 0; p < R * T; ++p) total[p] = hn::Zero(DF());
  float offset[R * T] = {};
  HWY_ALIGN float dd[R][T][kChunkSuper];
  int16_t scales[R][kChunkSub32];
  for (int64_t c0 = 0; c0 < nb; c0 += kChunkSuper) {
    const int n = int(std::min<int64_t>(kChunkSuper, nb - c0));
    for (int r = 0; r < R; ++r) PrepareQ45KChunk<Block, T>(blocks[r], n, x, c0, scales[r], dd[r], offset + r * T);
    for (int b = 0; b < n; ++b) {
      PrefetchNextRows<R>(blocks, nb, c0 + b);
      const uint8_t* qs[R];
      const uint8_t* qh[R];
      const int16_t* sc[R];
      for (int r = 0; r < R; ++r) {
        qs[r] = blocks[r][c0 + b].qs;
        qh[r] = nullptr;
        if constexpr (kFive) qh[r] = blocks[r][c0 + b].qh;
        sc[r] = scales[r] + 8 * b;
      }
#if HWY_TARGET == HWY_AVX3_DL
      DotSuperBlockQ45KVnni<kFive, R, T>(qs, qh, sc, dd, b, x, (c0 + b) * fmt::QK_K, total);
#elif HWY_TARGET == HWY_AVX2
      DotSuperBlockQ45KAvx2<kFive, R, T>(qs, qh, sc, dd, b, x, (c0 + b) * fmt::QK_K, total);
#else
      V32 isum[R * T];
      for (int p = 0; p < R * T; ++p) isum[p] = hn::Zero(D32());
      // Not unrolled: GCC would otherwise reassociate the int32 sums of all four chunks into one tree whose
      // partial products no longer fit in registers.
      HWY_UNROLL(1)
      for (int chunk = 0; chunk < 4; ++chunk) {
        DotChunkQ45K<kFive, R, T>(qs, qh, chunk, sc, x, (c0 + b) * fmt::QK_K, isum);
      }
      for (int r = 0; r < R; ++r) {
        for (int t = 0; t < T; ++t) total[r * T + t] = ScaledAdd(isum[r * T + t], dd[r][t][b], total[r * T + t]);
      }
#endif
    }
  }
  StoreSums<R * T>(total, offset, out);
}

// Q6_K: within each half of 128 elements, element 32k + l (k 0..3) is nibble (k >= 2) of ql[l + 32(k & 1)]
// with bits 2k..2k+1 of qh[l] on top, minus 32; 16-element sub-blocks each have a signed 8-bit scale.
template <int R>
HWY_INLINE void UnpackQ6K(const fmt::BlockQ6_K& blk, int half, size_t l, V16* w) {
  const D16 d16;
  const auto mask4 = hn::Set(d16, 0x0F), mask2 = hn::Set(d16, 3), bias = hn::Set(d16, 32);
  const uint8_t* ql = blk.ql + 64 * half;
  const V16 la = LoadBytes(d16, ql + l), lb = LoadBytes(d16, ql + 32 + l);
  const V16 h = LoadBytes(d16, blk.qh + 32 * half + l);
  w[0] = hn::Or(hn::And(la, mask4), hn::ShiftLeft<4>(hn::And(h, mask2)));
  w[1] = hn::Or(hn::And(lb, mask4), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(h), mask2)));
  w[2] = hn::Or(hn::ShiftRight<4>(la), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(h), mask2)));
  w[3] = hn::Or(hn::ShiftRight<4>(lb), hn::ShiftLeft<4>(hn::ShiftRight<6>(h)));
  const int8_t* sc = blk.scales + 8 * half;
  const int s = int(l / 16);
  for (int k = 0; k < 4; ++k) w[k] = hn::Mul(hn::Sub(w[k], bias), SubBlockScales(d16, sc, 2 * k + s));
}

#if HWY_TARGET == HWY_AVX3_DL
// Q6_K with VNNI. Per half (128 elements) of a super-block, the 6-bit quants q (without the -32) as unsigned bytes
// in two vectors of 64 elements each, in element order: vpmaddubsw with the token's int8 activations gives 32 int16
// pair sums (at most 2 * 63 * 127) whose lanes 8j..8j+7 belong to sub-block j of the vector, and vpdpwssd adds them
// times the signed 8-bit sub-block scales into int32. The -32 is the integer term -32 * sum_j scale_j * (sum of
// the token's activations over sub-block j), from QuantizedTokens::sum16, one more vpdpwssd per super-block.
// One super-block of R rows times T tokens (activations from element `base`), added to total with dd[r][t][b].
template <int R, int T>
HWY_INLINE void DotSuperBlockQ6KVnni(const fmt::BlockQ6_K* const* blk, const float (*dd)[T][kChunkSuper], int b,
                                     const TokenQ* x, int64_t base, VF* total) {
  __m512i isum[R * T];
  __m512i scales16[R];  // the 16 sub-block scales as int16
  for (int r = 0; r < R; ++r) {
    scales16[r] = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r]->scales))));
    const __m512i offset_scales = _mm512_slli_epi16(_mm512_sub_epi16(_mm512_setzero_si512(), scales16[r]), 5);  // -32 * scale
    for (int t = 0; t < T; ++t) {
      const __m512i sums = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].sum16 + base / 16)));
      isum[r * T + t] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), offset_scales, sums);
    }
  }
  // int16 lanes 8j..8j+7 of a 64-element vector belong to its sub-block j: vector v of half h covers sub-blocks
  // 8h + 4v .. 8h + 4v + 3.
  const __m512i lanes_to_sub = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1,
                                                0, 0, 0, 0, 0, 0, 0, 0);
  // Bits 2k..2k+1 of qh hold the high bits of element group k (32 elements each): shifts 0, 2 | 4, 6 per vector.
  const __m512i high_shift[2] = {_mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1),
                                 _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1)};
  const __m512i low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
  HWY_UNROLL(1)
  for (int half = 0; half < 2; ++half) {
    __m512i w[R][2], sub_scale[R][2];
    for (int r = 0; r < R; ++r) {
      const uint8_t* ql = blk[r]->ql + 64 * half;
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qh + 32 * half));
      const __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
      const __m512i low = _mm512_loadu_si512(ql);  // element groups 0 | 1 in the low nibbles, 2 | 3 in the high
      for (int v = 0; v < 2; ++v) {
        const __m512i nibbles = _mm512_and_si512(v == 0 ? low : _mm512_srli_epi16(low, 4), low4);
        const __m512i high = _mm512_and_si512(_mm512_srlv_epi16(hh, high_shift[v]), low2);
        w[r][v] = _mm512_or_si512(nibbles, _mm512_slli_epi16(high, 4));
        sub_scale[r][v] = _mm512_permutexvar_epi16(_mm512_add_epi16(lanes_to_sub, _mm512_set1_epi16(short(8 * half + 4 * v))),
                                                   scales16[r]);
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int v = 0; v < 2; ++v) {
        const __m512i xv = _mm512_loadu_si512(x[t].q8 + base + 128 * half + 64 * v);
        for (int r = 0; r < R; ++r) {
          isum[r * T + t] = _mm512_dpwssd_epi32(isum[r * T + t], _mm512_maddubs_epi16(w[r][v], xv), sub_scale[r][v]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      total[r * T + t].raw = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r * T + t]), _mm512_set1_ps(dd[r][t][b]), total[r * T + t].raw);
    }
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

template <int R, int T>
HWY_INLINE void DotRowsQ6K(const uint8_t* const* rows, int64_t n_in, const TokenQ* x, float* out) {
  const fmt::BlockQ6_K* blocks[R];
  for (int r = 0; r < R; ++r) blocks[r] = reinterpret_cast<const fmt::BlockQ6_K*>(rows[r]);
  const int64_t nb = n_in / fmt::QK_K;
  VF total[R * T];
  for (int p = 0; p < R * T; ++p) total[p] = hn::Zero(DF());
  const float offset[R * T] = {};
  HWY_ALIGN float d_w[kChunkSuper], dd[R][T][kChunkSuper];
  for (int64_t c0 = 0; c0 < nb; c0 += kChunkSuper) {
    const int n = int(std::min<int64_t>(kChunkSuper, nb - c0));
    for (int r = 0; r < R; ++r) {
      for (int b = 0; b < n; ++b) d_w[b] = ScaleF16(blocks[r][c0 + b].d);
      for (int t = 0; t < T; ++t) {
        for (int b = 0; b < n; ++b) dd[r][t][b] = d_w[b] * x[t].scale[c0 + b];  // scalar: see PrepareLegacyChunk
      }
    }
    for (int b = 0; b < n; ++b) {
      PrefetchNextRows<R>(blocks, nb, c0 + b);
#if HWY_TARGET == HWY_AVX3_DL
      const fmt::BlockQ6_K* blk[R];
      for (int r = 0; r < R; ++r) blk[r] = &blocks[r][c0 + b];
      DotSuperBlockQ6KVnni<R, T>(blk, dd, b, x, (c0 + b) * fmt::QK_K, total);
#else
      V32 isum[R * T];
      for (int p = 0; p < R * T; ++p) isum[p] = hn::Zero(D32());
      HWY_UNROLL(1)
      for (int half = 0; half < 2; ++half) {
        for (size_t l = 0; l < 32; l += kLanes) {
          V16 w[R][4];
          for (int r = 0; r < R; ++r) UnpackQ6K<R>(blocks[r][c0 + b], half, l, w[r]);
          for (int t = 0; t < T; ++t) {
            const int16_t* xq = x[t].q + (c0 + b) * fmt::QK_K + 128 * half + l;
            for (int k = 0; k < 4; ++k) {
              const V16 xv = hn::LoadU(D16(), xq + 32 * k);
              for (int r = 0; r < R; ++r) {
                V32& sum = isum[r * T + t];
                V32 s1 = hn::Zero(D32());
                sum = hn::ReorderWidenMulAccumulate(D32(), w[r][k], xv, sum, s1);
                sum = hn::Add(sum, s1);
              }
            }
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        for (int t = 0; t < T; ++t) total[r * T + t] = ScaledAdd(isum[r * T + t], dd[r][t][b], total[r * T + t]);
      }
#endif
    }
  }
  StoreSums<R * T>(total, offset, out);
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

#if HWY_TARGET == HWY_AVX2
// Q4_K and Q5_K rows interleaved eight at a time (formats::BlockQ4_Kx8, BlockQ5_Kx8) times one token, on AVX2:
// the eight rows' dot products in the eight int32/float lanes of one vector. Each 32-byte load holds four quants
// of every row (lane r: row r; Q5_K's fifth bits from one load of qh per quad); vpmaddubsw against the broadcast
// activation quad gives two int16 pair sums per row, and the quads of a sub-block add up in int16 (all eight
// for 4 bits, at most 8 * 2 * 15 * 127 = 30480; four at a time for 5 bits, 31496) before vpmaddwd weighs them
// by the rows' 6-bit sub-block scales into int32. The mins' term, sum_j m_j * (sum of x over sub-block j), comes
// from the token's 16-element sums (QuantizedTokens::sum16) by vpmaddwd too; per super-block both are weighed
// once, by d * d_x and dmin * d_x of the eight rows.
HWY_INLINE __m256i BroadcastQuad(const int8_t* p) {
  int32_t quad;
  std::memcpy(&quad, p, 4);
  return _mm256_set1_epi32(quad);
}

// The interleaved kernels read one stream of groups, which the hardware prefetcher follows but not far enough
// ahead to hide DRAM latency from one core: the block about 6.5 KiB ahead, every cache line of it.
template <class Group>
HWY_INLINE void PrefetchGroupsAhead(const Group& blk) {
  constexpr size_t kAhead = (6656 + sizeof(Group) - 1) / sizeof(Group);
  const char* ahead = reinterpret_cast<const char*>(&blk + kAhead);
  for (size_t line = 0; line < sizeof blk; line += 64) hwy::Prefetch(ahead + line);
}

// vpshufb indices that copy byte k of each 32-bit lane into both of its int16 halves, zero-extended.
HWY_INLINE __m256i WidenByteToPair(int k) {
  const auto lane = [k](int i) { return int(0x80008000u | uint32_t(4 * i + k) * 0x00010001u); };
  return _mm256_setr_epi32(lane(0), lane(1), lane(2), lane(3), lane(0), lane(1), lane(2), lane(3));
}

// Bit kBit of each byte moved to bit 4 (a fifth bit's place) by one 16-bit shift: for shifts of up to 4 no bit
// of the neighbouring byte reaches bit 4, and the caller masks the rest.
template <int kBit>
HWY_INLINE __m256i MoveBitTo4(__m256i h) {
  if constexpr (kBit < 4) {
    return _mm256_slli_epi16(h, 4 - kBit);
  } else if constexpr (kBit > 4) {
    return _mm256_srli_epi16(h, kBit - 4);
  } else {
    return h;
  }
}

// Chunk c of a Q4_K/Q5_K super-block of eight interleaved rows (sub-blocks 2c in the low nibbles, 2c + 1 in the
// high ones) against the token's 64 activations at xb + 64c, added to isum; sc: the rows' scales of the chunk's
// half. A template over c, so that Q5_K's fifth bits (bits 2c and 2c + 1 of qh[l] for elements 64c + l and
// 64c + 32 + l) take one constant shift each.
template <int kChunk, class Group>
HWY_INLINE __m256i AddChunkQ45Kx8(const Group& blk, const int8_t* xb, const __m256i& sc, const __m256i (&widen)[4],
                                  __m256i isum) {
  constexpr bool kFive = std::is_same_v<Group, fmt::BlockQ5_Kx8>;
  constexpr int kRun = kFive ? 4 : 8;  // quads whose pair sums add up in int16
  const __m256i nibble = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  const int8_t* xc = xb + 64 * kChunk;
  const __m256i scale_lo = _mm256_shuffle_epi8(sc, widen[2 * (kChunk % 2)]);
  const __m256i scale_hi = _mm256_shuffle_epi8(sc, widen[2 * (kChunk % 2) + 1]);
  for (int q0 = 0; q0 < 8; q0 += kRun) {
    __m256i sum_lo = _mm256_setzero_si256(), sum_hi = _mm256_setzero_si256();
    for (int q = q0; q < q0 + kRun; ++q) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[kChunk][q]));
      __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      if constexpr (kFive) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh[q]));
        lo = _mm256_or_si256(lo, _mm256_and_si256(MoveBitTo4<2 * kChunk>(h), sixteen));
        hi = _mm256_or_si256(hi, _mm256_and_si256(MoveBitTo4<2 * kChunk + 1>(h), sixteen));
      }
      sum_lo = _mm256_add_epi16(sum_lo, _mm256_maddubs_epi16(lo, BroadcastQuad(xc + 4 * q)));
      sum_hi = _mm256_add_epi16(sum_hi, _mm256_maddubs_epi16(hi, BroadcastQuad(xc + 32 + 4 * q)));
    }
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(sum_lo, scale_lo));
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(sum_hi, scale_hi));
  }
  return isum;
}

template <class Group>
HWY_INLINE void DotGroupQ45Kx8Avx2(const Group* group, int64_t nb, const TokenQ& x, float* y) {
  const __m256i low6 = _mm256_set1_epi32(0x3F3F3F3F);
  const __m256i low4 = _mm256_set1_epi32(0x0F0F0F0F), bits45 = _mm256_set1_epi32(0x30303030);
  const __m256i widen[4] = {WidenByteToPair(0), WidenByteToPair(1), WidenByteToPair(2), WidenByteToPair(3)};
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const Group& blk = group[b];
    PrefetchGroupsAhead(blk);
    // The K4 scale unpacking (UnpackScalesMinsK4) on the eight rows' words at once: bytes of lane r are row r's
    // scales 0-3 / 4-7 and mins 0-3 / 4-7.
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.scale_words[0]));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.scale_words[1]));
    const __m256i w2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.scale_words[2]));
    const __m256i scales[2] = {_mm256_and_si256(w0, low6),
                               _mm256_or_si256(_mm256_and_si256(w2, low4), _mm256_and_si256(_mm256_srli_epi32(w0, 2), bits45))};
    const __m256i mins[2] = {_mm256_and_si256(w1, low6),
                             _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), low4),
                                             _mm256_and_si256(_mm256_srli_epi32(w1, 2), bits45))};
    const __m256 d_x = _mm256_set1_ps(x.scale[b]);
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d))), d_x);
    const __m256 dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.dmin))), d_x);

    __m256i min_sum = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {  // m_j times the sums of x over the two halves of sub-block j
      const __m256i m = _mm256_shuffle_epi8(mins[j / 4], widen[j % 4]);
      min_sum = _mm256_add_epi32(min_sum, _mm256_madd_epi16(m, BroadcastQuad(reinterpret_cast<const int8_t*>(x.sum16 + 16 * b + 2 * j))));
    }
    total = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(min_sum), dmin, total);

    const int8_t* xb = x.q8 + b * fmt::QK_K;
    __m256i isum = _mm256_setzero_si256();
    isum = AddChunkQ45Kx8<0>(blk, xb, scales[0], widen, isum);
    isum = AddChunkQ45Kx8<1>(blk, xb, scales[0], widen, isum);
    isum = AddChunkQ45Kx8<2>(blk, xb, scales[1], widen, isum);
    isum = AddChunkQ45Kx8<3>(blk, xb, scales[1], widen, isum);
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, total);
  }
  _mm256_storeu_ps(y, total);
}

// Q8_0 rows interleaved eight at a time (formats::BlockQ8_0x8) times one token, on AVX2, as the Q4_K kernel
// above: per quad of activations, vpmaddubsw of the weights' magnitudes against the activations carrying the
// weights' signs (at most 2 * 128 * 127, no saturation) and vpmaddwd into int32 give four products per row and
// lane; per block the eight rows are weighed once by d * d_x.
HWY_INLINE void DotGroupQ8_0x8Avx2(const fmt::BlockQ8_0x8* group, int64_t nb, const TokenQ& x, float* y) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const fmt::BlockQ8_0x8& blk = group[b];
    PrefetchGroupsAhead(blk);
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d))),
                                   _mm256_set1_ps(x.scale[b]));
    const int8_t* xb = x.q8 + b * fmt::QK8_0;
    __m256i isum = _mm256_setzero_si256();
    for (int q = 0; q < 8; ++q) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[q]));
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(BroadcastQuad(xb + 4 * q), w));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, ones));
    }
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, total);
  }
  _mm256_storeu_ps(y, total);
}

// Q5_0 rows interleaved eight at a time (formats::BlockQ5_0x8) times one token, on AVX2: each 32-byte load holds
// quants 4q..4q + 3 (low nibbles) and 16 + 4q.. (high nibbles) of every row, and the rows' regrouped qh words hold
// their fifth bits at bit q (low) and 4 + q (high) of the same byte: one 16-bit shift each puts them at bit 4
// (no bit of the neighbouring byte reaches it for shifts up to 4). vpmaddubsw of the unsigned 5-bit values (at
// most 4 * 2 * 31 * 127 per half-block sum in int16) and vpmaddwd into int32, weighed per block by d * d_x; the
// quants' offset of -16 is the block's -16 * d_w * (d_x * sum of x) from QuantizedTokens::scaled_sum32.
HWY_INLINE void DotGroupQ5_0x8Avx2(const fmt::BlockQ5_0x8* group, int64_t nb, const TokenQ& x, float* y) {
  const __m256i ones = _mm256_set1_epi16(1), nibble = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const fmt::BlockQ5_0x8& blk = group[b];
    PrefetchGroupsAhead(blk);
    const __m256 d_w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh));
    const int8_t* xb = x.q8 + b * fmt::QK5_0;
    __m256i sum_lo = _mm256_setzero_si256(), sum_hi = _mm256_setzero_si256();
    for (int q = 0; q < 4; ++q) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[q]));
      const __m256i fifth_lo = _mm256_and_si256(_mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - q)), sixteen);
      const __m256i fifth_hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(q)), sixteen);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, nibble), fifth_lo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), nibble), fifth_hi);
      sum_lo = _mm256_add_epi16(sum_lo, _mm256_maddubs_epi16(lo, BroadcastQuad(xb + 4 * q)));
      sum_hi = _mm256_add_epi16(sum_hi, _mm256_maddubs_epi16(hi, BroadcastQuad(xb + 16 + 4 * q)));
    }
    const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(sum_lo, ones), _mm256_madd_epi16(sum_hi, ones));
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d_w, _mm256_set1_ps(x.scale[b])), total);
    total = _mm256_fnmadd_ps(_mm256_mul_ps(d_w, _mm256_set1_ps(16.0f)), _mm256_set1_ps(x.scaled_sum32[b]), total);
  }
  _mm256_storeu_ps(y, total);
}

// Q4_0 rows interleaved eight at a time (formats::BlockQ4_0x8) times one token, on AVX2, as the Q5_0 kernel
// without fifth bits: the eight quads' pair sums of a block add up in int16 (at most 8 * 2 * 15 * 127 = 30480),
// weighed per block by d * d_x; the quants' offset of -8 is -8 * d_w * (d_x * sum of x).
HWY_INLINE void DotGroupQ4_0x8Avx2(const fmt::BlockQ4_0x8* group, int64_t nb, const TokenQ& x, float* y) {
  const __m256i ones = _mm256_set1_epi16(1), nibble = _mm256_set1_epi8(0x0F);
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const fmt::BlockQ4_0x8& blk = group[b];
    PrefetchGroupsAhead(blk);
    const __m256 d_w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d)));
    const int8_t* xb = x.q8 + b * fmt::QK4_0;
    __m256i pairs = _mm256_setzero_si256();
    for (int q = 0; q < 4; ++q) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[q]));
      const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(v, nibble), BroadcastQuad(xb + 4 * q));
      const __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), nibble), BroadcastQuad(xb + 16 + 4 * q));
      pairs = _mm256_add_epi16(pairs, _mm256_add_epi16(lo, hi));
    }
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), _mm256_mul_ps(d_w, _mm256_set1_ps(x.scale[b])), total);
    total = _mm256_fnmadd_ps(_mm256_mul_ps(d_w, _mm256_set1_ps(8.0f)), _mm256_set1_ps(x.scaled_sum32[b]), total);
  }
  _mm256_storeu_ps(y, total);
}

// vpshufb indices putting bytes k0 and k1 of each 32-bit lane in the high bytes of its two int16 halves (low
// bytes zero): an arithmetic shift right by 8 then sign-extends them.
HWY_INLINE __m256i SignedBytesToPair(int k0, int k1) {
  const auto lane = [k0, k1](int i) { return int(0x00800080u | uint32_t(4 * i + k0) << 8 | uint32_t(4 * i + k1) << 24); };
  return _mm256_setr_epi32(lane(0), lane(1), lane(2), lane(3), lane(0), lane(1), lane(2), lane(3));
}

// Q6_K rows interleaved eight at a time (formats::BlockQ6_Kx8) times one token, on AVX2. Per half of a super-block
// and quad q, one load each of ql (elements 4q.., and 64 + 4q.. in the high nibbles), ql + 32 (32 + 4q.., 96 + 4q..)
// and qh (their top two bits) gives the 6-bit quants of four element quads of the eight rows; vpmaddubsw against
// the broadcast activation quads, two quads' pair sums added in int16 (at most 2 * 2 * 63 * 127 = 32004), and
// vpmaddwd by the rows' signed 16-element sub-block scales into int32. The quants' offset of -32 is
// -32 * sum_j s_j * (sum of x over sub-block j), from QuantizedTokens::sum16 by vpmaddwd; per super-block the
// eight rows are weighed once by d * d_x.
HWY_INLINE void DotGroupQ6Kx8Avx2(const fmt::BlockQ6_Kx8* group, int64_t nb, const TokenQ& x, float* y) {
  const __m256i nibble = _mm256_set1_epi8(0x0F), top_bits = _mm256_set1_epi8(0x30);
  const __m256i scale_of[4] = {SignedBytesToPair(0, 0), SignedBytesToPair(1, 1), SignedBytesToPair(2, 2), SignedBytesToPair(3, 3)};
  const __m256i scale_pair[2] = {SignedBytesToPair(0, 1), SignedBytesToPair(2, 3)};
  const auto load = [](const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); };
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const fmt::BlockQ6_Kx8& blk = group[b];
    PrefetchGroupsAhead(blk);
    const __m256i words[4] = {load(blk.scale_words[0]), load(blk.scale_words[1]), load(blk.scale_words[2]), load(blk.scale_words[3])};
    // Sub-block j's scale of each row, sign-extended into both int16 halves of the row's lane; pair i's two scales.
    const auto scale = [&](int j) { return _mm256_srai_epi16(_mm256_shuffle_epi8(words[j / 4], scale_of[j % 4]), 8); };
    __m256i offset = _mm256_setzero_si256();  // sum_j s_j * (sum of x over sub-block j)
    for (int i = 0; i < 8; ++i) {
      const __m256i s = _mm256_srai_epi16(_mm256_shuffle_epi8(words[i / 2], scale_pair[i % 2]), 8);
      offset = _mm256_add_epi32(offset, _mm256_madd_epi16(s, BroadcastQuad(reinterpret_cast<const int8_t*>(x.sum16 + 16 * b + 2 * i))));
    }
    __m256i isum = _mm256_setzero_si256();
    HWY_UNROLL(1)
    for (int half = 0; half < 2; ++half) {
      const int8_t* xh = x.q8 + b * fmt::QK_K + 128 * half;
      for (int q0 = 0; q0 < 8; q0 += 2) {  // two quads: within one sub-block of each of the four element runs
        __m256i pairs[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int q = q0; q < q0 + 2; ++q) {
          const __m256i a = load(blk.ql[16 * half + q]), c = load(blk.ql[16 * half + 8 + q]), h = load(blk.qh[8 * half + q]);
          const __m256i quants[4] = {
              _mm256_or_si256(_mm256_and_si256(a, nibble), _mm256_and_si256(_mm256_slli_epi16(h, 4), top_bits)),
              _mm256_or_si256(_mm256_and_si256(c, nibble), _mm256_and_si256(_mm256_slli_epi16(h, 2), top_bits)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), nibble), _mm256_and_si256(h, top_bits)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), nibble), _mm256_and_si256(_mm256_srli_epi16(h, 2), top_bits)),
          };
          for (int k = 0; k < 4; ++k) pairs[k] = _mm256_add_epi16(pairs[k], _mm256_maddubs_epi16(quants[k], BroadcastQuad(xh + 32 * k + 4 * q)));
        }
        for (int k = 0; k < 4; ++k) isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs[k], scale(8 * half + 2 * k + q0 / 4)));
      }
    }
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d))), _mm256_set1_ps(x.scale[b]));
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum, _mm256_slli_epi32(offset, 5))), d, total);
  }
  _mm256_storeu_ps(y, total);
}

// y[t][r] for interleaved rows [row_begin, row_end) (whole groups) and tokens [token_begin, token_end): a
// group's weights stay in cache while its tokens pass over them.
template <TensorType kType>
HWY_INLINE void InterleavedRows(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t token_begin,
                                int64_t token_end) {
  const int64_t nb = job.n_in / tensor_type_info(kType)->block_elements;
  for (int64_t r = row_begin; r < row_end; r += fmt::kInterleavedRows) {
    const uint8_t* group = job.weights + size_t(r) * job.row_bytes;
    for (int64_t t = token_begin; t < token_end; ++t) {
      HWY_ALIGN float y[fmt::kInterleavedRows];
      if constexpr (kType == TensorType::Q4_K) {
        DotGroupQ45Kx8Avx2(reinterpret_cast<const fmt::BlockQ4_Kx8*>(group), nb, TokenAt(job, t), y);
      } else if constexpr (kType == TensorType::Q5_K) {
        DotGroupQ45Kx8Avx2(reinterpret_cast<const fmt::BlockQ5_Kx8*>(group), nb, TokenAt(job, t), y);
      } else if constexpr (kType == TensorType::Q8_0) {
        DotGroupQ8_0x8Avx2(reinterpret_cast<const fmt::BlockQ8_0x8*>(group), nb, TokenAt(job, t), y);
      } else if constexpr (kType == TensorType::Q5_0) {
        DotGroupQ5_0x8Avx2(reinterpret_cast<const fmt::BlockQ5_0x8*>(group), nb, TokenAt(job, t), y);
      } else if constexpr (kType == TensorType::Q4_0) {
        DotGroupQ4_0x8Avx2(reinterpret_cast<const fmt::BlockQ4_0x8*>(group), nb, TokenAt(job, t), y);
      } else {
        static_assert(kType == TensorType::Q6_K, "a type with an interleaved kernel");
        DotGroupQ6Kx8Avx2(reinterpret_cast<const fmt::BlockQ6_Kx8*>(group), nb, TokenAt(job, t), y);
      }
      std::memcpy(job.y + t * job.n_out + r, y, sizeof y);
    }
  }
}
#endif  // HWY_TARGET == HWY_AVX2

// Whether this target multiplies interleaved rows of `type` itself (InterleavedRows); for others matmul hands
// the kernels the rows in the file's layout.
constexpr bool InterleavedKernelFor(TensorType type) {
  return HWY_TARGET == HWY_AVX2 && fmt::has_interleaved_layout(type);
}

bool HasInterleavedKernel(TensorType type) { return InterleavedKernelFor(type); }

// ---------------------------------------------------------------------------------------------------------
// Row loops.

// out[r * T + t] for R consecutive rows starting at `row` and T tokens starting at t0.
template <TensorType kType, int R, int T>
HWY_INLINE void DotRows(const MatmulJob& job, int64_t row, int64_t t0, float* out) {
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = job.weights + (row + r) * job.row_bytes;
  if constexpr (kType == TensorType::F32 || kType == TensorType::F16 || kType == TensorType::BF16) {
    const float* x[T];
    for (int t = 0; t < T; ++t) x[t] = job.x + (t0 + t) * job.n_in;
    for (int r = 0; r < R; ++r) DotRowFloat<kType, T>(rows[r], job.n_in, x, out + r * T);
  } else {
    TokenQ x[T];
    for (int t = 0; t < T; ++t) x[t] = TokenAt(job, t0 + t);
    if constexpr (kType == TensorType::Q4_K || kType == TensorType::Q5_K) {
      DotRowsQ45K<kType, R, T>(rows, job.n_in, x, out);
    } else if constexpr (kType == TensorType::Q6_K) {
      DotRowsQ6K<R, T>(rows, job.n_in, x, out);
    } else {
      DotRowsLegacy<kType, R, T>(rows, job.n_in, x, out);
    }
  }
}

// Rows a micro-kernel walks together for T tokens: kRows, or, for one token, 2 in the AVX2 byte kernel of
// Q4_K/Q5_K (DotSuperBlockQ45KAvx2), whose per-row state of four vectors leaves registers for a second row (two
// independent chains of multiply-adds, one activation load for both).
template <TensorType kType, int T>
constexpr int RowsPerKernel() {
#if HWY_TARGET == HWY_AVX2
  if constexpr ((kType == TensorType::Q4_K || kType == TensorType::Q5_K) && T == 1) return 2;
#endif
  return kRows;
}

template <TensorType kType, int T>
HWY_NOINLINE void RowsForTokenTile(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t t0) {
  constexpr int R = RowsPerKernel<kType, T>();
  float out[R * T];
  int64_t r = row_begin;
  for (; r + R <= row_end; r += R) {
    DotRows<kType, R, T>(job, r, t0, out);
    for (int i = 0; i < R; ++i) {
      for (int t = 0; t < T; ++t) job.y[(t0 + t) * job.n_out + r + i] = out[i * T + t];
    }
  }
  if constexpr (R > 1) {
    for (; r < row_end; ++r) {
      DotRows<kType, 1, T>(job, r, t0, out);
      for (int t = 0; t < T; ++t) job.y[(t0 + t) * job.n_out + r] = out[t];
    }
  }
}

// Tokens per tile: the VNNI kernels' accumulators leave room for 8 (2 rows x 8 tokens in 16 of 32 registers).
template <TensorType kType>
constexpr int TileTokens() {
#if HWY_TARGET == HWY_AVX3_DL
  constexpr bool kVnni = kType == TensorType::Q8_0 || kType == TensorType::Q4_0 || kType == TensorType::Q4_1 ||
                         kType == TensorType::Q5_0 || kType == TensorType::Q5_1 || kType == TensorType::Q4_K ||
                         kType == TensorType::Q5_K;
  return kVnni ? 8 : kTile;
#else
  return kTile;
#endif
}

#if HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
#include "cpu/matmul_dotprod-inl.h"
#endif

template <TensorType kType>
void MatmulRowsTyped(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t token_begin,
                     int64_t token_end) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (InterleavedKernelFor(kType)) {
    if (job.interleaved) return InterleavedRows<kType>(job, row_begin, row_end, token_begin, token_end);
  }
#endif
#if HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
  if constexpr (HasDotProdKernel(kType)) {
    if (HasDotProd()) return DotProdRows<kType>(job, row_begin, row_end, token_begin, token_end);
  }
#endif
  int64_t t0 = token_begin;
  constexpr int kTypeTile = TileTokens<kType>();
  if constexpr (kTypeTile > kTile) {
    for (; t0 + kTypeTile <= token_end; t0 += kTypeTile) RowsForTokenTile<kType, kTypeTile>(job, row_begin, row_end, t0);
  }
  for (; t0 + kTile <= token_end; t0 += kTile) RowsForTokenTile<kType, kTile>(job, row_begin, row_end, t0);
  if (t0 + 2 <= token_end) {
    RowsForTokenTile<kType, 2>(job, row_begin, row_end, t0);
    t0 += 2;
  }
  if (t0 < token_end) RowsForTokenTile<kType, 1>(job, row_begin, row_end, t0);
}

// y[t][r] for rows [row_begin, row_end) and tokens [token_begin, token_end).
void MatmulRows(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t token_begin,
                int64_t token_end) {
  // Unsupported types were rejected by the caller, before any task started.
  fmt::visit_weight_type(job.type, "matmul", [&](auto type) {
    MatmulRowsTyped<decltype(type)::value>(job, row_begin, row_end, token_begin, token_end);
  });
}

// ---------------------------------------------------------------------------------------------------------
// Prompt processing: a GEMM with tokens in the vector lanes.
//
// Each weight row is unpacked once into int16 (with the legacy offsets applied and the K-quant sub-block
// scales multiplied in) plus one float scale per group, and then used for every token of the task. Token
// activations are packed so that one int16 vector holds the element pair (2p, 2p + 1) of kTokensPerVec
// tokens: a broadcast weight pair times that vector (pmaddwd) adds w[2p] x[t][2p] + w[2p+1] x[t][2p+1] to
// token t's lane. Per-group float scaling then costs one convert and one FMA per row and group for a whole
// vector of tokens, instead of per token.

constexpr size_t kTokensPerVec = kLanes / 2;  // 0 on single-lane targets: no GEMM there
// Rows per GEMM tile. The tiles keep their float sums in memory (once per group), which leaves AVX2's 16
// registers to three rows: the byte GEMM's 3 x 2 int16 pair sums and 3 x 2 int32 sums, two token vectors and a
// weight quad (15); measured on Zen 3, four rows spill and run slower.
constexpr int kGemmRows = HWY_TARGET == HWY_AVX2 ? 3 : kLanes >= 32 ? 4 : 2;
constexpr int kGemmVecs = kGemmVectorsPerTile;

// Tokens per vector of the GEMM on this target (0: the target has no GEMM path).
size_t GemmTokensPerVector() { return kLanes >= 8 ? kTokensPerVec : 0; }

// Whether this target's GEMM of the weight type reads PackedTokens::quads (bytes) rather than q (int16): every
// type on the VNNI target; on AVX2 the types whose unsigned quants times signed activations cannot overflow
// vpmaddubsw's int16 pairs (see "The byte GEMM on AVX2").
constexpr bool GemmReadsQuads(TensorType type) {
#if HWY_TARGET == HWY_AVX3_DL
  (void)type;
  return true;
#elif HWY_TARGET == HWY_AVX2
  return type == TensorType::Q4_0 || type == TensorType::Q4_1 || type == TensorType::Q5_0 ||
         type == TensorType::Q5_1 || type == TensorType::Q4_K || type == TensorType::Q5_K || type == TensorType::Q6_K;
#else
  (void)type;
  return false;
#endif
}

// Elements per activation sum in PackedTokens::sums for the GEMM of `type`: 16 for the AVX2 byte GEMM of Q6_K,
// whose -32 offset is weighed by 16-element sub-block scales; 32 otherwise.
constexpr int64_t GemmSumElements(TensorType type) {
  return HWY_TARGET == HWY_AVX2 && type == TensorType::Q6_K ? 16 : 32;
}

// Packs token vectors [tv_begin, tv_end) (tokens tv * kTokensPerVec ...) from the per-token layout, as the
// GEMM of `type` reads them.
void PackTokenVectors(TensorType type, const QuantizedTokens& xq, int64_t n_in, int64_t tv_begin, int64_t tv_end,
                      const PackedTokens& out) {
  const int64_t NT = int64_t(kTokensPerVec);
  const int64_t sum_elements = GemmSumElements(type);
  const int64_t n_groups = n_in / xq.group, n_sums = n_in / sum_elements;
  const bool quads = GemmReadsQuads(type);
  // x + 128 on the VNNI target (vpdpbusd's unsigned operand), x itself on AVX2 (vpmaddubsw's signed one).
  const uint32_t flip = HWY_TARGET == HWY_AVX3_DL ? 0x80808080u : 0u;
  for (int64_t tv = tv_begin; tv < tv_end; ++tv) {
    for (int64_t t = 0; t < NT; ++t) {
      const int64_t token = tv * NT + t;
      if (quads) {
        const int8_t* q8_in = xq.q8 + token * n_in;
        uint8_t* quads_out = out.quads + tv * n_in * NT;
        for (int64_t p = 0; p < n_in / 4; ++p) {
          uint32_t quad;
          std::memcpy(&quad, q8_in + 4 * p, 4);
          quad ^= flip;
          std::memcpy(quads_out + 4 * (p * NT + t), &quad, 4);
        }
      } else {
        const int16_t* q_in = xq.q + token * n_in;
        int16_t* q_out = out.q + tv * n_in * NT;
        for (int64_t p = 0; p < n_in / 2; ++p) std::memcpy(q_out + 2 * (p * NT + t), q_in + 2 * p, 4);
      }
      for (int64_t g = 0; g < n_groups; ++g) out.scale[(tv * n_groups + g) * NT + t] = xq.scale[token * n_groups + g];
      for (int64_t j = 0; j < n_sums; ++j) {
        out.sums[(tv * n_sums + j) * NT + t] =
            sum_elements == 32 ? xq.scaled_sum32[token * n_sums + j]
                               : xq.scale[token * n_groups + j * sum_elements / xq.group] * float(xq.sum16[token * n_sums + j]);
      }
    }
  }
}

// A Q4_K/Q5_K super-block's scales for the GEMM: returns d; the 6-bit sub-block scales to sc[8], the mins as
// floats (-dmin * m) to min[8].
template <class Block>
HWY_INLINE float UnpackQ45KScales(const Block& blk, uint8_t* sc, float* min) {
  uint8_t m[8];
  UnpackScalesMinsK4(blk.scales, sc, m);
  ScaleEight(m, -ScaleF16(blk.dmin), min);
  return ScaleF16(blk.d);
}

// The same with the sub-block scales widened for the byte GEMMs' integer weighting: returns d, sub_scale[8] the
// 6-bit scales, min[8] as UnpackQ45KScales.
template <class Block, class Int>
HWY_INLINE float UnpackQ45KSubScales(const Block& blk, Int* sub_scale, float* min) {
  uint8_t sc[8];
  const float d = UnpackQ45KScales(blk, sc, min);
  for (int j = 0; j < 8; ++j) sub_scale[j] = Int(sc[j]);
  return d;
}

// One weight row as the GEMM wants it: w[n_in] int16; scale[g] per group (32 elements for legacy types, 256
// for K-quants); min[j] per 32 elements for types with mins (value = scale * w + min), else untouched.
template <TensorType kType>
HWY_INLINE void UnpackRowForGemm(const uint8_t* row, int64_t n_in, int16_t* w, float* scale, float* min) {
  const D16 d16;
  if constexpr (kType == TensorType::Q4_K || kType == TensorType::Q5_K) {
    constexpr bool kFive = kType == TensorType::Q5_K;
    using Block = std::conditional_t<kFive, fmt::BlockQ5_K, fmt::BlockQ4_K>;
    const auto* blocks = reinterpret_cast<const Block*>(row);
    for (int64_t b = 0; b < n_in / fmt::QK_K; ++b) {
      const Block& blk = blocks[b];
      uint8_t sc[8];
      scale[b] = UnpackQ45KScales(blk, sc, min + 8 * b);
      for (int chunk = 0; chunk < 4; ++chunk) {
        for (size_t k = 0; k < 32; k += kLanes) {
          const V16 bytes = LoadBytes(d16, blk.qs + 32 * chunk + k);
          V16 lo = hn::And(bytes, hn::Set(d16, 0x0F));
          V16 hi = hn::ShiftRight<4>(bytes);
          if constexpr (kFive) {
            const V16 bits = hn::ShiftRightSame(LoadBytes(d16, blk.qh + k), 2 * chunk);
            lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(bits, hn::Set(d16, 1))));
            hi = hn::Or(hi, hn::ShiftLeft<3>(hn::And(bits, hn::Set(d16, 2))));
          }
          int16_t* out = w + b * fmt::QK_K + 64 * chunk + k;
          hn::StoreU(hn::Mul(lo, hn::Set(d16, int16_t(sc[2 * chunk]))), d16, out);
          hn::StoreU(hn::Mul(hi, hn::Set(d16, int16_t(sc[2 * chunk + 1]))), d16, out + 32);
        }
      }
    }
  } else if constexpr (kType == TensorType::Q6_K) {
    const auto* blocks = reinterpret_cast<const fmt::BlockQ6_K*>(row);
    for (int64_t b = 0; b < n_in / fmt::QK_K; ++b) {
      scale[b] = ScaleF16(blocks[b].d);
      for (int half = 0; half < 2; ++half) {
        for (size_t l = 0; l < 32; l += kLanes) {
          V16 q[4];
          UnpackQ6K<1>(blocks[b], half, l, q);
          for (int k = 0; k < 4; ++k) hn::StoreU(q[k], d16, w + b * fmt::QK_K + 128 * half + 32 * k + l);
        }
      }
    }
  } else {
    using L = Legacy<kType>;
    const auto* blocks = reinterpret_cast<const typename L::Block*>(row);
    for (int64_t b = 0; b < n_in / 32; ++b) {
      V16 q[kVecs32];
      L::Unpack(blocks[b], q);
      for (size_t k = 0; k < kVecs32; ++k) hn::StoreU(hn::Add(q[k], hn::Set(d16, int16_t(L::kOffset))), d16, w + 32 * b + k * kLanes);
      scale[b] = ScaleF16(blocks[b].d);
      if constexpr (L::kHasMin) min[b] = ScaleF16(L::Min(blocks[b]));
    }
  }
}

template <TensorType kType>
constexpr bool kGemmHasMin = kType == TensorType::Q4_1 || kType == TensorType::Q5_1 ||
                             kType == TensorType::Q4_K || kType == TensorType::Q5_K;

// acc[r][v] += min[r][j] * token vector v's activation sum over elements [32 j, 32 j + 32), for every j: the
// float term of the mins and offsets of every GEMM.
template <int R>
HWY_INLINE void AddMinTerms(const float* const* min, const PackedTokens& x, int64_t tv0, int64_t n_sums,
                            VF (*acc)[kGemmVectorsPerTile]) {
  constexpr int64_t NT = int64_t(kTokensPerVec);
  constexpr int V = kGemmVectorsPerTile;
  const DF df;
  const float* sums[V];
  for (int v = 0; v < V; ++v) sums[v] = x.sums + (tv0 + v) * n_sums * NT;
  // j outermost: the R x V sums are independent chains, so the multiply-adds are not serialized by their latency.
  for (int64_t j = 0; j < n_sums; ++j) {
    VF xs[V];
    for (int v = 0; v < V; ++v) xs[v] = hn::LoadU(df, sums[v] + j * NT);
    for (int r = 0; r < R; ++r) {
      const VF m = hn::Set(df, min[r][j]);
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(m, xs[v], acc[r][v]);
    }
  }
}

// R unpacked rows times kGemmVecs token vectors: out[r][v * kTokensPerVec + lane].
template <TensorType kType, int R, int kGroup>
HWY_INLINE void GemmTile(const int16_t* const* w, const float* const* scale, const float* const* min, int64_t n_in,
                         const PackedTokens& x, int64_t tv0, float (*out)[kGemmVecs * kTokensPerVec]) {
  constexpr int V = kGemmVecs;
  constexpr int64_t NT = int64_t(kTokensPerVec);
  const D16 d16;
  const D32 d32;
  const DF df;
  const int64_t n_pairs = n_in / 2, n_groups = n_in / kGroup, n_sums = n_in / 32;
  const int16_t* xq[V];
  const float* xscale[V];
  for (int v = 0; v < V; ++v) {
    xq[v] = x.q + (tv0 + v) * n_pairs * 2 * NT;
    xscale[v] = x.scale + (tv0 + v) * n_groups * NT;
  }
  // The float sums live in `out`, not in registers, which the int32 sums of the group loop need.
  VF acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(df);
  }
  if constexpr (kGemmHasMin<kType>) AddMinTerms<R>(min, x, tv0, n_sums, acc);
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) hn::StoreU(acc[r][v], df, out[r] + v * NT);
  }
  for (int64_t g = 0; g < n_groups; ++g) {
    V32 sum[R][V];
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < V; ++v) sum[r][v] = hn::Zero(d32);
    }
    const int16_t* xg[V];
    for (int v = 0; v < V; ++v) xg[v] = xq[v] + g * kGroup * NT;
    const int64_t w0 = g * kGroup;
    // Two element pairs per step, their products added together before they join the running sums: one
    // loop-carried add per accumulator per step (GCC otherwise copies every accumulator each iteration).
    for (int p = 0; p < kGroup / 2; p += 2) {
      V16 x0[V], x1[V];
      for (int v = 0; v < V; ++v) {
        x0[v] = hn::LoadU(d16, xg[v] + p * 2 * NT);
        x1[v] = hn::LoadU(d16, xg[v] + (p + 1) * 2 * NT);
      }
      for (int r = 0; r < R; ++r) {
        int32_t pair0, pair1;
        std::memcpy(&pair0, w[r] + w0 + 2 * p, 4);
        std::memcpy(&pair1, w[r] + w0 + 2 * p + 2, 4);
        const V16 wb0 = hn::BitCast(d16, hn::Set(d32, pair0)), wb1 = hn::BitCast(d16, hn::Set(d32, pair1));
        for (int v = 0; v < V; ++v) sum[r][v] = hn::Add(sum[r][v], hn::Add(MulPairwise(x0[v], wb0), MulPairwise(x1[v], wb1)));
      }
    }
    for (int v = 0; v < V; ++v) {
      const VF dx = hn::LoadU(df, xscale[v] + g * NT);
      for (int r = 0; r < R; ++r) {
        const VF d = hn::Mul(hn::Set(df, scale[r][g]), dx);
        float* total = out[r] + v * NT;
        hn::StoreU(hn::MulAdd(hn::ConvertTo(df, sum[r][v]), d, hn::LoadU(df, total)), df, total);
      }
    }
  }
}

constexpr bool IsKQuant(TensorType type) {
  return type == TensorType::Q4_K || type == TensorType::Q5_K || type == TensorType::Q6_K;
}

#if HWY_TARGET == HWY_AVX3_DL
// The GEMM with VNNI. Weights are the signed operand of vpdpbusd, broadcast four at a time, with their constant
// offsets applied (Q4_0 q - 8, Q5_0 q - 16, Q6_K q - 32, Q8_0 as stored; Q4_1/Q5_1/Q4_K/Q5_K unsigned, their
// mins a float term as before); the activations are the unsigned operand, x + 128, as PackedTokens q8u lays them
// out: one vector holds an element quad of 16 tokens. A sub-group of G elements (a block; a K-quant sub-block:
// 32, Q6_K's 16) is summed in int32 from -128 * (sum of its weights), so that the +128 cancels; K-quant sub-group
// sums are multiplied by their integer sub-block scales and added in int32 over the super-block, as ggml does,
// and each block or super-block is weighed once by d_w * d_x.

constexpr int GemmSubGroup(TensorType type) { return type == TensorType::Q6_K ? 16 : 32; }

// One weight row for the VNNI GEMM: w[n_in] int8; per sub-group its int32 start value and (K-quants) integer
// sub-block scale; per block or super-block the float scale d; per 32 elements the min (types with mins).
template <TensorType kType>
HWY_INLINE void UnpackRowForGemmVnni(const uint8_t* row, int64_t n_in, int8_t* w, float* scale, int32_t* start,
                                     int32_t* sub_scale, float* min) {
  constexpr int G = GemmSubGroup(kType);
  if constexpr (kType == TensorType::Q4_K || kType == TensorType::Q5_K) {
    constexpr bool kFive = kType == TensorType::Q5_K;
    using Block = std::conditional_t<kFive, fmt::BlockQ5_K, fmt::BlockQ4_K>;
    const auto* blocks = reinterpret_cast<const Block*>(row);
    for (int64_t b = 0; b < n_in / fmt::QK_K; ++b) {
      const Block& blk = blocks[b];
      scale[b] = UnpackQ45KSubScales(blk, sub_scale + 8 * b, min + 8 * b);
      for (int chunk = 0; chunk < 4; ++chunk) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * chunk));
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
        v = _mm512_and_si512(_mm512_mask_blend_epi64(0xF0, v, _mm512_srli_epi16(v, 4)), _mm512_set1_epi8(0x0F));
        if constexpr (kFive) {  // as in DotSuperBlockQ45KVnni
          const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh));
          const __m512i select = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (2 * chunk))),
                                                    _mm256_set1_epi8(char(1 << (2 * chunk + 1))), 1);
          const __mmask64 fifth = _mm512_test_epi8_mask(_mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1), select);
          v = _mm512_mask_add_epi8(v, fifth, v, _mm512_set1_epi8(16));
        }
        _mm512_storeu_si512(w + b * fmt::QK_K + 64 * chunk, v);
      }
    }
  } else if constexpr (kType == TensorType::Q6_K) {
    const auto* blocks = reinterpret_cast<const fmt::BlockQ6_K*>(row);
    const __m512i high_shift[2] = {_mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1),
                                   _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1)};
    for (int64_t b = 0; b < n_in / fmt::QK_K; ++b) {
      const fmt::BlockQ6_K& blk = blocks[b];
      scale[b] = ScaleF16(blk.d);
      for (int j = 0; j < 16; ++j) sub_scale[16 * b + j] = blk.scales[j];
      for (int half = 0; half < 2; ++half) {  // layout: see DotSuperBlockQ6KVnni
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * half));
        const __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
        const __m512i low = _mm512_loadu_si512(blk.ql + 64 * half);
        for (int v = 0; v < 2; ++v) {
          const __m512i nibbles = _mm512_and_si512(v == 0 ? low : _mm512_srli_epi16(low, 4), _mm512_set1_epi8(0x0F));
          const __m512i high = _mm512_and_si512(_mm512_srlv_epi16(hh, high_shift[v]), _mm512_set1_epi8(0x03));
          const __m512i q = _mm512_or_si512(nibbles, _mm512_slli_epi16(high, 4));
          _mm512_storeu_si512(w + b * fmt::QK_K + 128 * half + 64 * v, _mm512_sub_epi8(q, _mm512_set1_epi8(32)));
        }
      }
    }
  } else {
    using L = Legacy<kType>;
    const auto* blocks = reinterpret_cast<const typename L::Block*>(row);
    const hn::Rebind<int8_t, D16> d8;
    for (int64_t b = 0; b < n_in / 32; ++b) {
      V16 q[kVecs32];
      L::Unpack(blocks[b], q);
      for (size_t k = 0; k < kVecs32; ++k) {
        hn::StoreU(hn::DemoteTo(d8, hn::Add(q[k], hn::Set(D16(), int16_t(L::kOffset)))), d8, w + 32 * b + k * kLanes);
      }
      scale[b] = ScaleF16(blocks[b].d);
      if constexpr (L::kHasMin) min[b] = ScaleF16(L::Min(blocks[b]));
    }
  }
  // -128 * the sum of each sub-group's weights (vpdpbusd against ones sums four per lane).
  for (int64_t g = 0; g < n_in / G; ++g) {
    const __m512i v = _mm512_maskz_loadu_epi8((__mmask64(1) << G) - 1, w + g * G);
    start[g] = -128 * _mm512_reduce_add_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), v));
  }
}

// R unpacked rows times kGemmVecs token vectors: out[r][v * kTokensPerVec + lane].
template <TensorType kType, int R>
HWY_INLINE void GemmTileVnni(const int8_t* const* w, const float* const* scale, const int32_t* const* start,
                             const int32_t* const* sub_scale, const float* const* min, int64_t n_in,
                             const PackedTokens& x, int64_t tv0, float (*out)[kGemmVecs * kTokensPerVec]) {
  constexpr int V = kGemmVecs;
  constexpr int64_t NT = int64_t(kTokensPerVec);
  constexpr int G = GemmSubGroup(kType);
  constexpr int kScaleGroup = IsKQuant(kType) ? fmt::QK_K : 32;  // elements per float scale d
  constexpr int kSubGroups = kScaleGroup / G;
  constexpr int kGroup = fmt::activation_group(fmt::find_weight_format(kType)->activation);
  static_assert(kGroup == kScaleGroup, "one activation scale per weight scale");
  const int64_t n_groups = n_in / kGroup, n_sums = n_in / 32;
  const uint8_t* xq[V];
  const float* xscale[V];
  for (int v = 0; v < V; ++v) {
    xq[v] = x.quads + (tv0 + v) * n_in * NT;
    xscale[v] = x.scale + (tv0 + v) * n_groups * NT;
  }
  VF acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(DF());
  }
  for (int64_t g = 0; g < n_groups; ++g) {
    __m512i total[R][V];
    for (int sub = 0; sub < kSubGroups; ++sub) {
      const int64_t j = g * kSubGroups + sub;
      __m512i isum[R][V];
      for (int r = 0; r < R; ++r) {
        const __m512i s = _mm512_set1_epi32(start[r][j]);
        for (int v = 0; v < V; ++v) isum[r][v] = s;
      }
      for (int quad = 0; quad < G / 4; ++quad) {
        const int64_t e = j * G + 4 * quad;
        __m512i xv[V];
        for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(xq[v] + e * NT);
        for (int r = 0; r < R; ++r) {
          int32_t quad_w;
          std::memcpy(&quad_w, w[r] + e, 4);
          const __m512i wb = _mm512_set1_epi32(quad_w);
          for (int v = 0; v < V; ++v) isum[r][v] = _mm512_dpbusd_epi32(isum[r][v], xv[v], wb);
        }
      }
      for (int r = 0; r < R; ++r) {
        for (int v = 0; v < V; ++v) {
          if constexpr (kSubGroups == 1) {
            total[r][v] = isum[r][v];
          } else {
            const __m512i scaled = _mm512_mullo_epi32(isum[r][v], _mm512_set1_epi32(sub_scale[r][j]));
            total[r][v] = sub == 0 ? scaled : _mm512_add_epi32(total[r][v], scaled);
          }
        }
      }
    }
    for (int v = 0; v < V; ++v) {
      const __m512 dx = _mm512_loadu_ps(xscale[v] + g * NT);
      for (int r = 0; r < R; ++r) {
        acc[r][v].raw = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[r][v]), _mm512_mul_ps(_mm512_set1_ps(scale[r][g]), dx), acc[r][v].raw);
      }
    }
  }
  if constexpr (kGemmHasMin<kType>) AddMinTerms<R>(min, x, tv0, n_sums, acc);
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) hn::StoreU(acc[r][v], DF(), out[r] + v * NT);
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

#if HWY_TARGET == HWY_AVX2
// The byte GEMM on AVX2, for the types of unsigned quants of at most 6 bits (GemmReadsQuads): the weights are
// the unsigned operand of vpmaddubsw, as stored (no offset), broadcast four at a time; the activations the signed
// one, as PackedTokens quads lay them out (one vector: an element quad of 8 tokens). vpmaddubsw adds the products
// in pairs into int16 lanes (at most 2 * 63 * 127 = 16002), and the pairs of QuadsPerFlush quads are added in
// int16 before vpmaddwd sums each token's lanes into int32, weighed by the K-quant sub-block scale (1 for the
// legacy blocks). Offsets (Q4_0 q - 8, Q5_0 q - 16, Q6_K q - 32) and mins (Q4_1, Q5_1, Q4_K, Q5_K) are the float
// term per sub-block, min[j] times the token's activation sum over it (PackedTokens::sums), as in the int16 GEMM;
// each block or super-block is weighed once by d_w * d_x.

// Quads whose int16 pair sums may be added before they are widened: 8 for 4-bit quants (8 * 2 * 15 * 127 =
// 30480), 4 for 5-bit ones (31496), 2 for Q6_K's 6-bit ones (32004).
constexpr int QuadsPerFlush(TensorType type) {
  if (type == TensorType::Q6_K) return 2;
  return type == TensorType::Q5_0 || type == TensorType::Q5_1 || type == TensorType::Q5_K ? 4 : 8;
}

// Elements per sub-block scale of the byte GEMM's integer weighting: Q6_K's 16, else 32 (1 for legacy blocks).
constexpr int64_t SubBlockElements(TensorType type) { return type == TensorType::Q6_K ? 16 : 32; }

// One weight row for the byte GEMM: w[n_in] unsigned quants; per block (legacy) or super-block (K-quants) the
// float scale d; per sub-block (SubBlockElements) the min term (legacy offsets as o * d, Q6_K's as -32 * d * its
// scale) and, for K-quants, the sub-block scale (6-bit, or Q6_K's signed 8-bit).
template <TensorType kType>
HWY_INLINE void UnpackRowForGemmBytes(const uint8_t* row, int64_t n_in, uint8_t* w, float* scale, int16_t* sub_scale,
                                      float* min) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  if constexpr (kType == TensorType::Q6_K) {
    const __m256i two_bits = _mm256_set1_epi8(3);
    const auto* blocks = reinterpret_cast<const fmt::BlockQ6_K*>(row);
    for (int64_t b = 0; b < n_in / fmt::QK_K; ++b) {
      const fmt::BlockQ6_K& blk = blocks[b];
      scale[b] = ScaleF16(blk.d);
      for (int j = 0; j < 16; ++j) {
        sub_scale[16 * b + j] = blk.scales[j];
        min[16 * b + j] = -32.0f * scale[b] * float(blk.scales[j]);
      }
      // Half h, 32k + l (k 0..3): nibble k >= 2 of ql[64h + l + 32(k & 1)], bits 2k..2k+1 of qh[32h + l] on top.
      for (int half = 0; half < 2; ++half) {
        const auto load = [](const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); };
        const __m256i la = load(blk.ql + 64 * half), lb = load(blk.ql + 64 * half + 32), h = load(blk.qh + 32 * half);
        const auto high = [&](int k) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), two_bits), 4); };
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(la, low_nibbles), high(0)),
            _mm256_or_si256(_mm256_and_si256(lb, low_nibbles), high(1)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), low_nibbles), high(2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), low_nibbles), high(3)),
        };
        for (int k = 0; k < 4; ++k) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + b * fmt::QK_K + 128 * half + 32 * k), q[k]);
        }
      }
    }
  } else if constexpr (kType == TensorType::Q4_K || kType == TensorType::Q5_K) {
    constexpr bool kFive = kType == TensorType::Q5_K;
    using Block = std::conditional_t<kFive, fmt::BlockQ5_K, fmt::BlockQ4_K>;
    const auto* blocks = reinterpret_cast<const Block*>(row);
    for (int64_t b = 0; b < n_in / fmt::QK_K; ++b) {
      const Block& blk = blocks[b];
      scale[b] = UnpackQ45KSubScales(blk, sub_scale + 8 * b, min + 8 * b);
      // Chunk c: sub-block 2c in the low nibbles of qs[32c ..], 2c + 1 in the high ones; Q5_K's fifth bits are
      // bits 2c and 2c + 1 of qh[0 .. 32).
      for (int chunk = 0; chunk < 4; ++chunk) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * chunk));
        __m256i lo = _mm256_and_si256(q, low_nibbles), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_nibbles);
        if constexpr (kFive) {
          const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh));
          const __m256i h_lo = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * chunk)), one);
          const __m256i h_hi = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * chunk + 1)), one);
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(h_lo, 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(h_hi, 4));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + b * fmt::QK_K + 64 * chunk), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + b * fmt::QK_K + 64 * chunk + 32), hi);
      }
    }
  } else {
    using L = Legacy<kType>;
    const auto* blocks = reinterpret_cast<const typename L::Block*>(row);
    const hn::Rebind<uint8_t, D16> d8;
    for (int64_t b = 0; b < n_in / 32; ++b) {
      V16 q[kVecs32];
      L::Unpack(blocks[b], q);
      for (size_t k = 0; k < kVecs32; ++k) hn::StoreU(hn::DemoteTo(d8, q[k]), d8, w + 32 * b + k * kLanes);
      scale[b] = ScaleF16(blocks[b].d);
      min[b] = L::kHasMin ? ScaleF16(L::Min(blocks[b])) : float(L::kOffset) * scale[b];
    }
  }
}

// R unpacked rows times kGemmVecs token vectors: out[r][v * kTokensPerVec + lane].
template <TensorType kType, int R>
HWY_INLINE void GemmTileBytes(const uint8_t* const* w, const float* const* scale, const int16_t* const* sub_scale,
                              const float* const* min, int64_t n_in, const PackedTokens& x, int64_t tv0,
                              float (*out)[kGemmVecs * kTokensPerVec]) {
  constexpr int V = kGemmVecs;
  constexpr int64_t NT = int64_t(kTokensPerVec);
  static_assert(NT == 8, "a vector holds an element quad of 8 tokens");
  constexpr bool kK = IsKQuant(kType);
  constexpr int kGroup = kK ? fmt::QK_K : 32;  // elements per float scale d (and per activation scale)
  constexpr int kFlush = QuadsPerFlush(kType);
  constexpr int64_t kSub = SubBlockElements(kType);
  const int64_t n_groups = n_in / kGroup, n_sums = n_in / GemmSumElements(kType);
  const uint8_t* xq[V];
  const float* xscale[V];
  for (int v = 0; v < V; ++v) {
    xq[v] = x.quads + (tv0 + v) * n_in * NT;
    xscale[v] = x.scale + (tv0 + v) * n_groups * NT;
  }
  // The float sums live in `out`, not in registers, which the int16 and int32 sums of the group loop need.
  VF acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(DF());
  }
  AddMinTerms<R>(min, x, tv0, n_sums, acc);  // every type here has a min or an offset
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) hn::StoreU(acc[r][v], DF(), out[r] + v * NT);
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < n_groups; ++g) {
    __m256i isum[R][V];
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < V; ++v) isum[r][v] = _mm256_setzero_si256();
    }
    for (int64_t e0 = g * kGroup; e0 < (g + 1) * kGroup; e0 += 4 * kFlush) {
      __m256i pairs[R][V];
      for (int r = 0; r < R; ++r) {
        for (int v = 0; v < V; ++v) pairs[r][v] = _mm256_setzero_si256();
      }
      // Kept a loop: unrolled, GCC reassociates the int16 adds into a tree over all the quads, whose products
      // then spill (measured 15-25% slower on Zen 3).
#pragma GCC unroll 1
      for (int quad = 0; quad < kFlush; ++quad) {
        const int64_t e = e0 + 4 * quad;
        __m256i xv[V];
        for (int v = 0; v < V; ++v) xv[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[v] + e * NT));
        for (int r = 0; r < R; ++r) {
          int32_t quad_w;
          std::memcpy(&quad_w, w[r] + e, 4);
          const __m256i wb = _mm256_set1_epi32(quad_w);
          for (int v = 0; v < V; ++v) pairs[r][v] = _mm256_add_epi16(pairs[r][v], _mm256_maddubs_epi16(wb, xv[v]));
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256i weight = kK ? _mm256_set1_epi16(sub_scale[r][e0 / kSub]) : ones;
        for (int v = 0; v < V; ++v) isum[r][v] = _mm256_add_epi32(isum[r][v], _mm256_madd_epi16(pairs[r][v], weight));
      }
    }
    for (int v = 0; v < V; ++v) {
      const __m256 dx = _mm256_loadu_ps(xscale[v] + g * NT);
      for (int r = 0; r < R; ++r) {
        float* sum = out[r] + v * NT;
        const __m256 weight = _mm256_mul_ps(_mm256_set1_ps(scale[r][g]), dx);
        _mm256_storeu_ps(sum, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][v]), weight, _mm256_loadu_ps(sum)));
      }
    }
  }
}
#endif  // HWY_TARGET == HWY_AVX2

// Scratch for kGemmRows rows unpacked, per thread: grown as needed. Scales and starts per 16 elements at most.
struct GemmRowScratch {
#if HWY_TARGET == HWY_AVX3_DL
  hwy::AlignedFreeUniquePtr<int8_t[]> w;
  hwy::AlignedFreeUniquePtr<int32_t[]> start, sub_scale;
#else
  hwy::AlignedFreeUniquePtr<int16_t[]> w;
#endif
#if HWY_TARGET == HWY_AVX2
  hwy::AlignedFreeUniquePtr<uint8_t[]> w8;  // the byte GEMM's rows
  hwy::AlignedFreeUniquePtr<int16_t[]> sub_scale16;
#endif
  hwy::AlignedFreeUniquePtr<float[]> scale, min;
  int64_t capacity = 0;
  void Reserve(int64_t n_in) {
    if (n_in <= capacity) return;
#if HWY_TARGET == HWY_AVX3_DL
    w = hwy::AllocateAligned<int8_t>(size_t(kGemmRows * n_in));
    start = hwy::AllocateAligned<int32_t>(size_t(kGemmRows * (n_in / 16)));
    sub_scale = hwy::AllocateAligned<int32_t>(size_t(kGemmRows * (n_in / 16)));
#else
    w = hwy::AllocateAligned<int16_t>(size_t(kGemmRows * n_in));
#endif
#if HWY_TARGET == HWY_AVX2
    w8 = hwy::AllocateAligned<uint8_t>(size_t(kGemmRows * n_in));
    sub_scale16 = hwy::AllocateAligned<int16_t>(size_t(kGemmRows * (n_in / 16)));
#endif
    scale = hwy::AllocateAligned<float>(size_t(kGemmRows * (n_in / 16)));
    min = hwy::AllocateAligned<float>(size_t(kGemmRows * (n_in / 16)));
    capacity = n_in;
  }
};

// A tile's outputs: rows row.. of the kGemmVecs token vectors from tv on.
template <int R>
HWY_INLINE void StoreGemmTile(const MatmulJob& job, int64_t row, int64_t tv, const float (*out)[kGemmVecs * kTokensPerVec]) {
  const int64_t NT = int64_t(kTokensPerVec);
  for (int r = 0; r < R; ++r) {
    for (int64_t i = 0; i < kGemmVecs * NT; ++i) job.y[(tv * NT + i) * job.n_out + row + r] = out[r][i];
  }
}

#if HWY_TARGET == HWY_AVX2
template <TensorType kType, int R>
HWY_INLINE void GemmRowBlockBytes(const MatmulJob& job, const PackedTokens& x, int64_t row, int64_t tv_begin,
                                  int64_t tv_end, GemmRowScratch& scratch) {
  const int64_t n_in = job.n_in;
  const uint8_t* w[R];
  const float* scale[R];
  const int16_t* sub_scale[R];
  const float* min[R];
  for (int r = 0; r < R; ++r) {
    uint8_t* w_r = scratch.w8.get() + r * n_in;
    float* scale_r = scratch.scale.get() + r * (n_in / 16);
    int16_t* sub_scale_r = scratch.sub_scale16.get() + r * (n_in / 16);
    float* min_r = scratch.min.get() + r * (n_in / 16);
    UnpackRowForGemmBytes<kType>(job.weights + (row + r) * job.row_bytes, n_in, w_r, scale_r, sub_scale_r, min_r);
    w[r] = w_r;
    scale[r] = scale_r;
    sub_scale[r] = sub_scale_r;
    min[r] = min_r;
  }
  HWY_ALIGN float out[R][kGemmVecs * kTokensPerVec];
  for (int64_t tv = tv_begin; tv + kGemmVecs <= tv_end; tv += kGemmVecs) {
    GemmTileBytes<kType, R>(w, scale, sub_scale, min, n_in, x, tv, out);
    StoreGemmTile<R>(job, row, tv, out);
  }
}
#endif

template <TensorType kType, int R>
HWY_INLINE void GemmRowBlock(const MatmulJob& job, const PackedTokens& x, int64_t row, int64_t tv_begin,
                             int64_t tv_end, GemmRowScratch& scratch) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (GemmReadsQuads(kType)) return GemmRowBlockBytes<kType, R>(job, x, row, tv_begin, tv_end, scratch);
#endif
  constexpr int kGroup = fmt::activation_group(fmt::find_weight_format(kType)->activation);
  const int64_t n_in = job.n_in;
  const float* scale[R];
  const float* min[R];
#if HWY_TARGET == HWY_AVX3_DL
  const int8_t* w[R];
  const int32_t* start[R];
  const int32_t* sub_scale[R];
#else
  const int16_t* w[R];
#endif
  for (int r = 0; r < R; ++r) {
    float* scale_r = scratch.scale.get() + r * (n_in / 16);
    float* min_r = scratch.min.get() + r * (n_in / 16);
    const uint8_t* row_bytes = job.weights + (row + r) * job.row_bytes;
#if HWY_TARGET == HWY_AVX3_DL
    int8_t* w_r = scratch.w.get() + r * n_in;
    int32_t* start_r = scratch.start.get() + r * (n_in / 16);
    int32_t* sub_scale_r = scratch.sub_scale.get() + r * (n_in / 16);
    UnpackRowForGemmVnni<kType>(row_bytes, n_in, w_r, scale_r, start_r, sub_scale_r, min_r);
    start[r] = start_r;
    sub_scale[r] = sub_scale_r;
#else
    int16_t* w_r = scratch.w.get() + r * n_in;
    UnpackRowForGemm<kType>(row_bytes, n_in, w_r, scale_r, min_r);
#endif
    w[r] = w_r;
    scale[r] = scale_r;
    min[r] = min_r;
  }
  HWY_ALIGN float out[R][kGemmVecs * kTokensPerVec];
  for (int64_t tv = tv_begin; tv + kGemmVecs <= tv_end; tv += kGemmVecs) {
#if HWY_TARGET == HWY_AVX3_DL
    (void)kGroup;
    GemmTileVnni<kType, R>(w, scale, start, sub_scale, min, n_in, x, tv, out);
#else
    GemmTile<kType, R, kGroup>(w, scale, min, n_in, x, tv, out);
#endif
    StoreGemmTile<R>(job, row, tv, out);
  }
}

template <TensorType kType>
void GemmRowsTyped(const MatmulJob& job, const PackedTokens& x, int64_t row_begin, int64_t row_end,
                   int64_t tv_begin, int64_t tv_end) {
  static thread_local GemmRowScratch scratch;
  scratch.Reserve(job.n_in);
  constexpr int R = kGemmRows;
  int64_t r = row_begin;
  for (; r + R <= row_end; r += R) GemmRowBlock<kType, R>(job, x, r, tv_begin, tv_end, scratch);
  if constexpr (R > 2) {
    if (r + 2 <= row_end) GemmRowBlock<kType, 2>(job, x, r, tv_begin, tv_end, scratch), r += 2;
  }
  for (; r < row_end; ++r) GemmRowBlock<kType, 1>(job, x, r, tv_begin, tv_end, scratch);
}

// y[t][r] for rows [row_begin, row_end) and the tokens of token vectors [tv_begin, tv_end), a multiple of
// kGemmVecs of them; only for quantized types, on targets where GemmTileTokens() > 0.
void GemmRows(const MatmulJob& job, const PackedTokens& x, int64_t row_begin, int64_t row_end, int64_t tv_begin,
              int64_t tv_end) {
  if constexpr (kLanes >= 8) {
    fmt::visit_weight_type(job.type, "matmul", [&](auto type) {
      constexpr TensorType kType = decltype(type)::value;
      if constexpr (fmt::activation_group(fmt::find_weight_format(kType)->activation) != 0) {
        GemmRowsTyped<kType>(job, x, row_begin, row_end, tv_begin, tv_end);
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------------------
// Activation quantization, ggml's (formats/activation_blocks.h has the per-group arithmetic): per group of
// `group` elements a scale and 8-bit values; per 32 elements the offset term of activation_sum32.

#if HWY_TARGET == HWY_AVX3_DL
// One block's 8 lanes of QuantizedTokens::pair_scale and pair_sum, from lane `at`.
HWY_INLINE void SetPairLanes(int64_t at, float scale, int sum, float* pair_scale, int32_t* pair_sum) {
  _mm256_storeu_ps(pair_scale + at, _mm256_set1_ps(scale));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(pair_sum + at), _mm256_setr_epi32(sum, 0, 0, 0, 0, 0, 0, 0));
}
#endif

void QuantizeTokens(const float* x, int64_t n_in, int64_t n_tokens, fmt::ActivationFormat format, int16_t* q,
                    int8_t* q8, float* scale, float* scaled_sum32, float* pair_scale, int32_t* pair_sum,
                    int16_t* sum16) {
  const hn::CappedTag<float, 16> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int16_t, decltype(df)> d16;
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_NEON
  const hn::Rebind<int8_t, decltype(df)> d8;
#endif
  const int64_t N = int64_t(hn::Lanes(df));
  const int group = fmt::activation_group(format);
  const int64_t n_groups = n_in / group;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * n_in;
#if HWY_TARGET == HWY_AVX3_DL
    int8_t* q8t = q8 + t * n_in;
#else
    int16_t* qt = q + t * n_in;
#endif
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_NEON
    // For the byte kernels: DotSuperBlockQ45KAvx2 and the interleaved ones; on NEON the dot-product ones.
    int8_t* q8t = q8 + t * n_in;
#endif
    for (int64_t g = 0; g < n_groups; ++g) {
      const float* xg = xt + g * group;
      auto vmax = hn::Zero(df);
      for (int64_t i = 0; i < group; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xg + i)));
      const fmt::ActivationGroupScale s = fmt::activation_group_scale(format, hn::GetLane(hn::MaxOfLanes(df, vmax)));
      const auto inv = hn::Set(df, s.inverse);
      scale[t * n_groups + g] = s.scale;
      for (int64_t k = 0; k < group; k += 32) {
        auto vsum = hn::Zero(di);
        for (int64_t i = k; i < k + 32; i += N) {
          const auto qi = hn::NearestInt(hn::Mul(hn::LoadU(df, xg + i), inv));
          vsum = hn::Add(vsum, qi);
#if HWY_TARGET == HWY_AVX3_DL
          hn::StoreU(hn::DemoteTo(d8, qi), d8, q8t + g * group + i);  // the VNNI kernels read bytes only
#else
          hn::StoreU(hn::DemoteTo(d16, qi), d16, qt + g * group + i);
#endif
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_NEON
          hn::StoreU(hn::DemoteTo(d8, qi), d8, q8t + g * group + i);
#endif
        }
        const int sum = int(hn::GetLane(hn::SumOfLanes(di, vsum)));
        scaled_sum32[t * (n_in / 32) + (g * group + k) / 32] = fmt::activation_sum32(format, s, sum);
#if HWY_TARGET == HWY_AVX3_DL
        if (group == 32) SetPairLanes(t * block_pairs(n_in) * 16 + g * 8, s.scale, sum, pair_scale, pair_sum);
#endif
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
        if (group == 256) {
          for (int64_t i = k; i < k + 32; i += 16) {
            int sum_of_16 = 0;
            for (int64_t j = i; j < i + 16; ++j) sum_of_16 += q8t[g * group + j];
            sum16[t * (n_in / 16) + (g * group + i) / 16] = int16_t(sum_of_16);
          }
        }
#endif
      }
    }
#if HWY_TARGET == HWY_AVX3_DL
    // An odd last block has no partner: its pair's upper lanes stay zero.
    if (group == 32 && n_groups % 2 == 1) SetPairLanes((t + 1) * block_pairs(n_in) * 16 - 8, 0.0f, 0, pair_scale, pair_sum);
#endif
  }
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
