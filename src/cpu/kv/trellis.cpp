// Optimized CPU ops of tcq2/tcq3/tcq4 (trellis-coded TurboQuant), compiled once per SIMD target through
// hwy/foreach_target.h and picked at run time; same bytes as the references in formats/kv/trellis.cpp.
//
// Encode: the Viterbi search is the whole cost (two passes, 1.5 n steps over 2^L states at n = 128). Per step,
// the best of the 2^k predecessors of each group of states is a min over 2^k neighbouring costs, done in
// registers with even/odd de-interleaves (k rounds); then every state's cost is that minimum plus the state's
// squared distance. Every step's costs are kept, and the traceback finds each best
// predecessor again by the reference's scan. The floats are those of the reference (distances and sums in
// separate loops so nothing is fused, ties to the lowest index, the same shared normalisation and norm), so
// encode is bit-exact with the reference on every target.
// Decode, score, accumulate: the states of a vector of elements are one byte shuffle of a 16-byte load of the
// stream, a shift and a mask; the codebook lookups are gathers, then one multiply-add per element. The rotation
// is the shared scalar one (formats/kv/rotation.h), applied once per encoded vector, prepared query or finished
// row.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/trellis.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "cpu/kv/cpu_codec_registry.h"
#include "cpu/kv/dispatched_codec.h"
#include "formats/kv/codec_registry.h"
#include "formats/kv/rotation.h"
#include "formats/kv/trellis.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace tcq = formats::tcq;

using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;

// ---------------------------------------------------------------------------------------------------------
// Encode.

// The path costs of every step of a search: row t + 1 holds the costs after element t, row 0 the start. Kept
// whole so that the traceback can find each best predecessor again (the same first-minimum scan as the
// reference's) instead of the forward pass tracking indices through its reductions. One buffer per thread:
// 129 rows of 512 floats is too much for the stack.
template <int kBits, int kStateBits>
struct ViterbiTables {
  static constexpr int kFan = 1 << kBits;
  static constexpr int kStates = 1 << kStateBits;
  static constexpr int kGroups = kStates >> kBits;  // groups of states that share their 2^k predecessors
  hwy::AlignedFreeUniquePtr<float[]> rows = hwy::AllocateAligned<float>(size_t(tcq::kMaxSubBlock + 1) * kStates);
  HWY_ALIGN float distance[kStates];
  HWY_ALIGN float best[kGroups];

  float* row(int i) { return rows.get() + size_t(i) * kStates; }
  static ViterbiTables& for_this_thread() {
    static thread_local ViterbiTables tables;
    return tables;
  }
};

// Reduces kFan vectors of costs (kFan * N consecutive states, i.e. N groups) to the N group minima.
template <int kFan>
HWY_INLINE VF GroupMinima(DF df, VF* c) {
  for (int width = kFan; width > 1; width /= 2) {
    for (int p = 0; p < width / 2; ++p) {
#if HWY_TARGET == HWY_SCALAR  // one lane: the two vectors are the two states
      c[p] = hn::Min(c[2 * p], c[2 * p + 1]);
#else
      c[p] = hn::Min(hn::ConcatEven(df, c[2 * p + 1], c[2 * p]), hn::ConcatOdd(df, c[2 * p + 1], c[2 * p]));
#endif
    }
  }
  return c[0];
}

// cost_t = (min over each group of cost_{t-1}) + squared distance of u_t, as formats::tcq's viterbi_step.
template <int kBits, int kStateBits>
HWY_INLINE void ViterbiStep(const float* HWY_RESTRICT cb, float u, const float* HWY_RESTRICT cost,
                            float* HWY_RESTRICT next, ViterbiTables<kBits, kStateBits>& v) {
  using Tables = ViterbiTables<kBits, kStateBits>;
  constexpr int kFan = Tables::kFan, kStates = Tables::kStates, kGroups = Tables::kGroups;
  const DF df;
  const int N = int(hn::Lanes(df));
  const VF target = hn::Set(df, u);
  for (int s = 0; s < kStates; s += N) {
    const VF diff = hn::Sub(target, hn::LoadU(df, cb + s));
    hn::Store(hn::Mul(diff, diff), df, v.distance + s);
  }
  for (int first = 0; first < kStates; first += kFan * N) {
    VF c[kFan];
    for (int i = 0; i < kFan; ++i) c[i] = hn::Load(df, cost + first + i * N);
    hn::Store(GroupMinima<kFan>(df, c), df, v.best + first / kFan);
  }
  for (int code = 0; code < kFan; ++code)
    for (int m = 0; m < kGroups; m += N) {
      const int s = code * kGroups + m;
      hn::Store(hn::Add(hn::Load(df, v.best + m), hn::Load(df, v.distance + s)), df, next + s);
    }
}

// The Viterbi search of formats::tcq::viterbi_path (same start/end rules, same floats, same ties).
template <int kBits, int kStateBits>
void ViterbiPath(const float* HWY_RESTRICT cb, const float* HWY_RESTRICT targets, int count, int start_prefix,
                 int end_prefix, uint32_t* HWY_RESTRICT states) {
  using Tables = ViterbiTables<kBits, kStateBits>;
  constexpr int kFan = Tables::kFan, kStates = Tables::kStates, kGroups = Tables::kGroups;
  Tables& v = Tables::for_this_thread();
  float* start = v.row(0);
  if (start_prefix == tcq::kFree) {
    std::fill(start, start + kStates, 0.0f);
  } else {
    std::fill(start, start + kStates, std::numeric_limits<float>::infinity());
    start[start_prefix << kBits] = 0;
  }
  for (int t = 0; t < count; ++t) ViterbiStep<kBits, kStateBits>(cb, targets[t], v.row(t), v.row(t + 1), v);

  const float* last_row = v.row(count);
  uint32_t state = end_prefix == tcq::kFree ? 0u : uint32_t(end_prefix) << kBits;
  const uint32_t last = end_prefix == tcq::kFree ? uint32_t(kStates) : state + kFan;
  for (uint32_t s = state + 1; s < last; ++s)
    if (last_row[s] < last_row[state]) state = s;
  for (int t = count - 1; t >= 0; --t) {
    states[t] = state;
    const float* group = v.row(t) + ((state & (kGroups - 1)) << kBits);  // the predecessors of `state`
    uint32_t j = 0;
    for (uint32_t i = 1; i < kFan; ++i)
      if (group[i] < group[j]) j = i;
    state = ((state & (kGroups - 1)) << kBits) | j;
  }
}

// The two-pass tail-biting search of formats::tcq::viterbi_encode: the junction, then the whole sub-block.
template <int kBits, int kStateBits>
void ViterbiEncodeSubBlock(const float* HWY_RESTRICT cb, const float* HWY_RESTRICT u, int n,
                           uint8_t* HWY_RESTRICT stream, float* HWY_RESTRICT values) {
  uint32_t states[tcq::kMaxSubBlock];
  float junction[tcq::kMaxSubBlock];
  const int w = tcq::junction_window(n);
  std::copy(u + n - w, u + n, junction);
  std::copy(u, u + w, junction + w);
  ViterbiPath<kBits, kStateBits>(cb, junction, 2 * w, tcq::kFree, tcq::kFree, states);
  const int prefix = int(states[w - 1] >> kBits);
  ViterbiPath<kBits, kStateBits>(cb, u, n, prefix, prefix, states);

  std::memset(stream, 0, size_t(n) * kBits / 8);
  for (int t = 0; t < n; ++t) {
    values[t] = cb[states[t]];
    const uint32_t code = states[t] >> (kStateBits - kBits);
    const int pos = t * kBits;
    stream[pos / 8] |= uint8_t(code << (pos % 8));
    if (pos % 8 + kBits > 8) stream[pos / 8 + 1] |= uint8_t(code >> (8 - pos % 8));
  }
}

template <int kBits, int kStateBits>
void EncodeRotated(const tcq::Trellis& tr, float* y, int d, uint8_t* block) {
  const int n = tcq::sub_block_size(d);
  const float* cb = tcq::scaled_codebook(tr, n);
  HWY_ALIGN float u[tcq::kMaxSubBlock];
  HWY_ALIGN float values[tcq::kMaxSubBlock];
  for (int sub = 0; sub < d / n; ++sub) {
    uint8_t* stream = block + sub * tr.sub_block_bytes(n);
    const float norm = tcq::normalise_sub_block(y + sub * n, n, u);
    ViterbiEncodeSubBlock<kBits, kStateBits>(cb, u, n, stream, values);
    tcq::store_corrected_norm(norm, values, n, stream + tr.stream_bytes(n));
  }
}

void Tcq2EncodeRotated(float* y, int d, uint8_t* block) { EncodeRotated<2, 8>(tcq::tcq2_trellis(), y, d, block); }
void Tcq3EncodeRotated(float* y, int d, uint8_t* block) { EncodeRotated<3, 9>(tcq::tcq3_trellis(), y, d, block); }
void Tcq4EncodeRotated(float* y, int d, uint8_t* block) { EncodeRotated<4, 8>(tcq::tcq4_trellis(), y, d, block); }

// ---------------------------------------------------------------------------------------------------------
// Decode, score, accumulate.

// The codebook indices (states) of one sub-block's elements, a vector at a time. The stream is copied behind its
// own last 4 bytes (the trellis is tail-biting: the bits before bit 0 are the stream's last bits) and ahead of
// zero bytes, so that no window needs a special case. Element t = 8 g + i has its window at stream bit
// k t + k - L, which is bit 8 + k i + k - L of the 16 bytes from byte k g - 1 (the group's lead byte) on, for
// every i < 16. So max(N, 8) elements are one 16-byte load copied into every 128-bit block, one byte shuffle
// that gives each lane the 32 bits from its window's byte on, a shift by the lane's bit and a mask; the scalar
// target reads each window from the same bytes.
template <int kBits, int kStateBits>
class SubBlockStates {
  static constexpr int kPad = 4, kTail = 16;
  static constexpr int kMaxLanes = 16;
  static_assert(kStateBits - kBits <= 8 && kStateBits + 7 <= 32 && (8 + kMaxLanes * kBits - kStateBits) / 8 + 3 < 16,
                "the 32 bits from every window's byte on, for 16 elements, lie in the 16 bytes from the lead byte");
  static constexpr uint32_t kMask = (1u << kStateBits) - 1;

  // Per lane i < 16: the byte of its window (relative to the group's lead byte) and the bit within it.
  static constexpr int window_byte(int i) { return (8 + kBits * i + kBits - kStateBits) / 8; }
  static constexpr int window_bit(int i) { return (8 + kBits * i + kBits - kStateBits) % 8; }
  struct Pattern {
    uint8_t bytes[4 * kMaxLanes];  // lane i: its four bytes, window_byte(i) on
    uint32_t bits[kMaxLanes];
  };
  static constexpr Pattern pattern() {
    Pattern p{};
    for (int i = 0; i < kMaxLanes; ++i) {
      for (int b = 0; b < 4; ++b) p.bytes[4 * i + b] = uint8_t(window_byte(i) + b);
      p.bits[i] = uint32_t(window_bit(i));
    }
    return p;
  }
  static constexpr Pattern kPattern = pattern();

  uint8_t padded_[kPad + tcq::kMaxSubBlock * kBits / 8 + kTail] = {};

  // The lead byte of element t's group of 8.
  const uint8_t* lead(int t) const { return padded_ + kPad + kBits * (t / 8) - 1; }

 public:
  SubBlockStates(const uint8_t* HWY_RESTRICT stream, int n) {
    const int bytes = n * kBits / 8;
    std::memcpy(padded_, stream + bytes - kPad, kPad);
    std::memcpy(padded_ + kPad, stream, size_t(bytes));
  }

  // The states of elements t .. t + Lanes(di) - 1 (t a multiple of the lane count).
  template <class DI>
  HWY_INLINE hn::Vec<DI> At(DI di, int t) const {
#if HWY_TARGET == HWY_SCALAR
    const uint8_t* p = lead(t) + window_byte(t % 8);
    const uint32_t word = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    return hn::Set(di, int32_t((word >> window_bit(t % 8)) & kMask));
#else
    const hn::RebindToUnsigned<DI> du;
    const hn::Repartition<uint8_t, DI> du8;
    const int i = t % 8;  // 0, or 4 for the second half of a group with 4 lanes
    const auto bytes = hn::LoadDup128(du8, lead(t));
    const auto words = hn::BitCast(du, hn::TableLookupBytes(bytes, hn::LoadU(du8, kPattern.bytes + 4 * i)));
    return hn::BitCast(di, hn::And(words >> hn::LoadU(du, kPattern.bits + i), hn::Set(du, kMask)));
#endif
  }
};

template <int kBits, int kStateBits>
HWY_INLINE float SubBlockDot(const float* HWY_RESTRICT q, const uint8_t* HWY_RESTRICT stream, int n,
                             const float* HWY_RESTRICT cb) {
  const DF df;
  const DI di;
  const int N = int(hn::Lanes(df));
  const SubBlockStates<kBits, kStateBits> states(stream, n);
  VF s0 = hn::Zero(df), s1 = hn::Zero(df);
  for (int t = 0; t < n; t += 2 * N) {
    s0 = hn::MulAdd(hn::LoadU(df, q + t), hn::GatherIndex(df, cb, states.At(di, t)), s0);
    s1 = hn::MulAdd(hn::LoadU(df, q + t + N), hn::GatherIndex(df, cb, states.At(di, t + N)), s1);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
}

// out[t] = scale * cb[state_t] (+ out[t] when kAdd).
template <int kBits, int kStateBits, bool kAdd>
HWY_INLINE void SubBlockScaled(float scale, const uint8_t* HWY_RESTRICT stream, int n, const float* HWY_RESTRICT cb,
                               float* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const int N = int(hn::Lanes(df));
  const SubBlockStates<kBits, kStateBits> states(stream, n);
  const VF s = hn::Set(df, scale);
  for (int t = 0; t < n; t += N) {
    const VF value = hn::GatherIndex(df, cb, states.At(di, t));
    hn::StoreU(kAdd ? hn::MulAdd(s, value, hn::LoadU(df, out + t)) : hn::Mul(s, value), df, out + t);
  }
}

template <int kBits, int kStateBits>
float Score(const tcq::Trellis& tr, const float* q, const uint8_t* block, int d) {
  const int n = tcq::sub_block_size(d);
  const float* cb = tcq::scaled_codebook(tr, n);
  float score = 0;
  for (int sub = 0; sub < d / n; ++sub) {
    const uint8_t* stream = block + sub * tr.sub_block_bytes(n);
    score += tcq::load_norm(stream + tr.stream_bytes(n)) * SubBlockDot<kBits, kStateBits>(q + sub * n, stream, n, cb);
  }
  return score;
}

template <int kBits, int kStateBits, bool kAdd>
void Scaled(const tcq::Trellis& tr, float w, const uint8_t* block, int d, float* out) {
  const int n = tcq::sub_block_size(d);
  const float* cb = tcq::scaled_codebook(tr, n);
  for (int sub = 0; sub < d / n; ++sub) {
    const uint8_t* stream = block + sub * tr.sub_block_bytes(n);
    const float scale = w * tcq::load_norm(stream + tr.stream_bytes(n));
    SubBlockScaled<kBits, kStateBits, kAdd>(scale, stream, n, cb, out + sub * n);
  }
}

float Tcq2Score(const float* q, const uint8_t* b, int d) { return Score<2, 8>(tcq::tcq2_trellis(), q, b, d); }
float Tcq3Score(const float* q, const uint8_t* b, int d) { return Score<3, 9>(tcq::tcq3_trellis(), q, b, d); }
float Tcq4Score(const float* q, const uint8_t* b, int d) { return Score<4, 8>(tcq::tcq4_trellis(), q, b, d); }
void Tcq2DecodeRotated(const uint8_t* b, int d, float* y) { Scaled<2, 8, false>(tcq::tcq2_trellis(), 1.0f, b, d, y); }
void Tcq3DecodeRotated(const uint8_t* b, int d, float* y) { Scaled<3, 9, false>(tcq::tcq3_trellis(), 1.0f, b, d, y); }
void Tcq4DecodeRotated(const uint8_t* b, int d, float* y) { Scaled<4, 8, false>(tcq::tcq4_trellis(), 1.0f, b, d, y); }
void Tcq2Accumulate(float w, const uint8_t* b, int d, float* acc) {
  Scaled<2, 8, true>(tcq::tcq2_trellis(), w, b, d, acc);
}
void Tcq3Accumulate(float w, const uint8_t* b, int d, float* acc) {
  Scaled<3, 9, true>(tcq::tcq3_trellis(), w, b, d, acc);
}
void Tcq4Accumulate(float w, const uint8_t* b, int d, float* acc) {
  Scaled<4, 8, true>(tcq::tcq4_trellis(), w, b, d, acc);
}

// The rows of n consecutive blocks: y^ in the rotated basis, norm * cb[state] per element (decode's values).
template <int kBits, int kStateBits>
void Expand(const tcq::Trellis& tr, const uint8_t* blocks, int n, int d, float* rows) {
  const int sub = tcq::sub_block_size(d);
  const size_t block_bytes = size_t(d / sub) * tr.sub_block_bytes(sub);
  for (int j = 0; j < n; ++j, blocks += block_bytes, rows += d) {
    Scaled<kBits, kStateBits, false>(tr, 1.0f, blocks, d, rows);
  }
}

void Tcq2Expand(const uint8_t* b, int n, int d, float* rows) { Expand<2, 8>(tcq::tcq2_trellis(), b, n, d, rows); }
void Tcq3Expand(const uint8_t* b, int n, int d, float* rows) { Expand<3, 9>(tcq::tcq3_trellis(), b, n, d, rows); }
void Tcq4Expand(const uint8_t* b, int n, int d, float* rows) { Expand<4, 8>(tcq::tcq4_trellis(), b, n, d, rows); }

// Queries enter the rotated basis and output rows leave it through the shared scalar rotation.
template <const formats::KvCodecInfo& (*kInfo)(), void (*EncodeRotated)(float*, int, uint8_t*),
          void (*DecodeRotated)(const uint8_t*, int, float*), float (*Score)(const float*, const uint8_t*, int),
          void (*Accumulate)(float, const uint8_t*, int, float*), void (*Expand)(const uint8_t*, int, int, float*)>
using TcqKernels = CheckedKernels<kInfo, encode_rotating<EncodeRotated>, decode_rotating<DecodeRotated>,
                                  formats::hadamard_rotate, Score, Accumulate, formats::hadamard_unrotate, Expand>;

// This target's kernels of the b-bit codec (b = 2, 3 or 4).
const CodecKernels& TcqCodecKernels(int bits) {
  switch (bits) {
    case 2:
      return TcqKernels<formats::tcq2_codec, Tcq2EncodeRotated, Tcq2DecodeRotated, Tcq2Score, Tcq2Accumulate,
                        Tcq2Expand>::kTable;
    case 3:
      return TcqKernels<formats::tcq3_codec, Tcq3EncodeRotated, Tcq3DecodeRotated, Tcq3Score, Tcq3Accumulate,
                        Tcq3Expand>::kTable;
    default:
      return TcqKernels<formats::tcq4_codec, Tcq4EncodeRotated, Tcq4DecodeRotated, Tcq4Score, Tcq4Accumulate,
                        Tcq4Expand>::kTable;
  }
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparrow::cpu {

HWY_EXPORT(TcqCodecKernels);

const CodecKernels& tcq_kernels(int bits) { return HWY_DYNAMIC_DISPATCH(TcqCodecKernels)(bits); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
