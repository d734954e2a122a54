// Optimized CPU ops of tbq2/tbq3/tbq4 (TurboQuant MSE), compiled once per SIMD target through
// hwy/foreach_target.h and picked at run time; same bytes as formats/kv/turboquant.cpp. The kernels are in
// cpu/kv/turboquant-inl.h. Encode may differ from the reference only for values within float rounding of a
// Lloyd-Max boundary; score and accumulate only by float summation order. Expand writes exactly the
// reference's reconstruction in the rotated basis.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/turboquant.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/kv/cpu_codec_registry.h"
#include "cpu/kv/dispatched_codec.h"
#include "cpu/kv/turboquant-inl.h"
#include "formats/kv/codec_registry.h"

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

// Queries enter the rotated basis and output rows leave it (out of line: CheckedKernels calls them from code
// compiled for the baseline target).
void TbqRotate(const float* x, int d, float* y) { ts::Rotate(x, d, y); }
void TbqUnrotate(const float* y, int d, float* x) { ts::Unrotate(y, d, x); }

template <int kBits>
constexpr const formats::KvCodecInfo& (*kTbqInfo)() =
    kBits == 2 ? formats::tbq2_codec : kBits == 3 ? formats::tbq3_codec : formats::tbq4_codec;

template <int kBits>
using TbqCodecKernels = CheckedKernels<kTbqInfo<kBits>, TbqEncode<kBits>, TbqDecode<kBits>, TbqRotate, TbqScore<kBits>,
                                       TbqAccumulate<kBits>, TbqUnrotate, TbqExpand<kBits>>;

// This target's kernels of the b-bit codec (b = 2, 3 or 4).
const CodecKernels& TbqKernels(int bits) {
  return bits == 2 ? TbqCodecKernels<2>::kTable : bits == 3 ? TbqCodecKernels<3>::kTable : TbqCodecKernels<4>::kTable;
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparrow::cpu {

HWY_EXPORT(TbqKernels);

const CodecKernels& tbq_kernels(int bits) { return HWY_DYNAMIC_DISPATCH(TbqKernels)(bits); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
