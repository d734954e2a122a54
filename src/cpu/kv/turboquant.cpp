// Optimized CPU ops of tbq2/tbq3/tbq4 (TurboQuant MSE), compiled once per SIMD target through
// hwy/foreach_target.h and picked at run time; same bytes as formats/kv/turboquant.cpp. The kernels are in
// cpu/kv/turboquant-inl.h. Encode may differ from the reference only for values within float rounding of a
// Lloyd-Max boundary; score and accumulate only by float summation order. Expand writes exactly the
// reference's reconstruction in the rotated basis.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/turboquant.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/kv/dispatched_codec.h"
#include "cpu/kv/turboquant-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace ts = turboquant_simd;

template <int kBits>
void TbqEncode(const float* x, int d, uint8_t* block) {
  float y[formats::turboquant::kMaxHeadDim];
  ts::Rotate(x, d, y);
  ts::MseEncode(y, d, ts::MseCodebook<kBits>(d), block);
}

template <int kBits>
void TbqDecode(const uint8_t* block, int d, float* x) {
  float y[formats::turboquant::kMaxHeadDim];
  ts::MseDecode<kBits>(block, d, ts::MseCodebook<kBits>(d), y);
  ts::Unrotate(y, d, x);
}

template <int kBits>
float TbqScore(const float* q, const uint8_t* block, int d) {
  return ts::MseScore<kBits>(q, block, d, ts::MseCodebook<kBits>(d));
}

template <int kBits>
void TbqAccumulate(float w, const uint8_t* block, int d, float* acc) {
  ts::MseAccumulate<kBits>(w, block, d, ts::MseCodebook<kBits>(d), acc);
}

// The rows of n consecutive blocks: y^ in the rotated basis (codebook[code] * norm, nothing to un-rotate).
template <int kBits>
void TbqExpand(const uint8_t* blocks, int n, int d, float* rows) {
  ts::MseExpand<kBits>(blocks, n, d, ts::MseCodebook<kBits>(d), rows);
}

// Queries enter the rotated basis and output rows leave it.
template <int kBits>
constexpr CodecKernels kTbqKernels{
    {TbqEncode<kBits>, TbqDecode<kBits>, ts::Rotate, TbqScore<kBits>, TbqAccumulate<kBits>, ts::Unrotate},
    TbqExpand<kBits>};

// This target's kernels of the b-bit codec (b = 2, 3 or 4).
const CodecKernels& TbqKernels(int bits) {
  return bits == 2 ? kTbqKernels<2> : bits == 3 ? kTbqKernels<3> : kTbqKernels<4>;
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/kv/cpu_codec_registry.h"
#include "formats/kv/codec_registry.h"

namespace sparrow::cpu {

HWY_EXPORT(TbqKernels);

namespace {

template <int kBits>
const CodecKernels& tbq_kernels() {
  return HWY_DYNAMIC_DISPATCH(TbqKernels)(kBits);
}

using Tbq2 = DispatchedCodec<formats::tbq2_codec, tbq_kernels<2>>;
using Tbq3 = DispatchedCodec<formats::tbq3_codec, tbq_kernels<3>>;
using Tbq4 = DispatchedCodec<formats::tbq4_codec, tbq_kernels<4>>;

}  // namespace

const formats::KvCodecOps& tbq2_ops() { return Tbq2::ops(); }
const formats::KvCodecOps& tbq3_ops() { return Tbq3::ops(); }
const formats::KvCodecOps& tbq4_ops() { return Tbq4::ops(); }
void tbq2_expand(const uint8_t* blocks, int n, int d, float* rows) { Tbq2::expand(blocks, n, d, rows); }
void tbq3_expand(const uint8_t* blocks, int n, int d, float* rows) { Tbq3::expand(blocks, n, d, rows); }
void tbq4_expand(const uint8_t* blocks, int n, int d, float* rows) { Tbq4::expand(blocks, n, d, rows); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
