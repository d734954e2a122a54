// Optimized CPU ops of tbq3p/tbq4p (TurboQuant inner-product: a (b-1)-bit MSE block plus a 1-bit QJL sketch
// of the residual; layout and bases in formats/kv/turboquant_ip.cpp), compiled once per SIMD target and
// picked at run time. Kernels: cpu/kv/turboquant-inl.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/turboquant_ip.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/kv/cpu_codec_registry.h"
#include "cpu/kv/dispatched_codec.h"
#include "cpu/kv/turboquant-inl.h"
#include "formats/kv/codec_registry.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace ts = turboquant_simd;
using formats::LloydMaxCodebook;

// The residual part of a block, after its MSE part: [fp16 ||r||][d / 8 sign bytes].
struct ResidualSketch {
  float scaled_norm;     // sqrt(pi/2) / d * ||r||
  const uint8_t* signs;  // sign(S r)
};

ResidualSketch ResidualAt(const uint8_t* block, int d, const LloydMaxCodebook& mse_book) {
  const uint8_t* part = block + ts::MseBlockBytes(d, mse_book.bits);
  return {formats::qjl::estimator_scale(d) * ts::LoadNorm(part), part + 2};
}

template <int kMseBits>
void TbqProdEncode(const float* x, int d, uint8_t* block) {
  constexpr int kMax = formats::turboquant::kMaxHeadDim;
  const LloydMaxCodebook& mse_book = ts::MseCodebook<kMseBits>(d);
  float y[kMax], residual[kMax], sketch[kMax];
  ts::Rotate(x, d, y);
  ts::MseEncode(y, d, mse_book, block);
  ts::MseDecode<kMseBits>(block, d, mse_book, residual);
  for (int i = 0; i < d; ++i) residual[i] = y[i] - residual[i];
  uint8_t* part = block + ts::MseBlockBytes(d, kMseBits);
  formats::turboquant::store_norm(ts::Norm(residual, d), part);
  ts::Project(formats::qjl::projection(d, d), residual, d, d, sketch);
  formats::qjl::pack_signs(sketch, d, part + 2);
}

template <int kMseBits>
void TbqProdDecode(const uint8_t* block, int d, float* x) {
  constexpr int kMax = formats::turboquant::kMaxHeadDim;
  const LloydMaxCodebook& mse_book = ts::MseCodebook<kMseBits>(d);
  float y[kMax], v[kMax], r[kMax];
  ts::MseDecode<kMseBits>(block, d, mse_book, y);
  const ResidualSketch sketch = ResidualAt(block, d, mse_book);
  ts::SignedFill(sketch.scaled_norm, sketch.signs, d, v);
  ts::ProjectTransposedInDouble(formats::qjl::projection(d, d), v, d, d, r);
  for (int i = 0; i < d; ++i) y[i] += r[i];
  ts::Unrotate(y, d, x);
}

// prepared = [R q, S R q].
void TbqProdPrepareQuery(const float* q, int d, float* prepared) {
  ts::Rotate(q, d, prepared);
  ts::Project(formats::qjl::projection(d, d), prepared, d, d, prepared + d);
}

template <int kMseBits>
float TbqProdScore(const float* prepared, const uint8_t* block, int d) {
  const LloydMaxCodebook& mse_book = ts::MseCodebook<kMseBits>(d);
  const float mse = ts::MseScore<kMseBits>(prepared, block, d, mse_book);
  const ResidualSketch sketch = ResidualAt(block, d, mse_book);
  return mse + sketch.scaled_norm * ts::SignedSum(prepared + d, sketch.signs, d);
}

template <int kMseBits>
void TbqProdAccumulate(float w, const uint8_t* block, int d, float* acc) {
  const LloydMaxCodebook& mse_book = ts::MseCodebook<kMseBits>(d);
  ts::MseAccumulate<kMseBits>(w, block, d, mse_book, acc);
  const ResidualSketch sketch = ResidualAt(block, d, mse_book);
  ts::SignedAccumulate(w * sketch.scaled_norm, sketch.signs, d, acc + d);
}

// out = R^T (acc[0, d) + S^T acc[d, 2d)).
void TbqProdFinish(const float* acc, int d, float* out) {
  float y[formats::turboquant::kMaxHeadDim];
  ts::ProjectTransposed(formats::qjl::projection(d, d), acc + d, d, d, y);
  for (int i = 0; i < d; ++i) y[i] += acc[i];
  ts::Unrotate(y, d, out);
}

// The rows of n consecutive blocks: [y^_mse, sqrt(pi/2)/d ||r|| sign(S r)], the accumulator's two bases.
template <int kMseBits>
void TbqProdExpand(const uint8_t* blocks, int n, int d, float* rows) {
  const LloydMaxCodebook& mse_book = ts::MseCodebook<kMseBits>(d);
  const size_t block_bytes = ts::MseBlockBytes(d, kMseBits) + 2 + size_t(d) / 8;
  for (int j = 0; j < n; ++j, blocks += block_bytes, rows += 2 * size_t(d)) {
    ts::MseDecode<kMseBits>(blocks, d, mse_book, rows);
    const ResidualSketch sketch = ResidualAt(blocks, d, mse_book);
    ts::SignedFill(sketch.scaled_norm, sketch.signs, d, rows + d);
  }
}

// The b-bit codec (b = 3 or 4) has a (b-1)-bit MSE part.
template <int kMseBits>
constexpr const formats::KvCodecInfo& (*kTbqProdInfo)() = kMseBits == 2 ? formats::tbq3p_codec : formats::tbq4p_codec;

template <int kMseBits>
using TbqProdCodecKernels =
    CheckedKernels<kTbqProdInfo<kMseBits>, TbqProdEncode<kMseBits>, TbqProdDecode<kMseBits>, TbqProdPrepareQuery,
                   TbqProdScore<kMseBits>, TbqProdAccumulate<kMseBits>, TbqProdFinish, TbqProdExpand<kMseBits>>;

// This target's kernels of the b-bit codec (b = 3 or 4).
const CodecKernels& TbqProdKernels(int bits) {
  return bits == 3 ? TbqProdCodecKernels<2>::kTable : TbqProdCodecKernels<3>::kTable;
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparrow::cpu {

HWY_EXPORT(TbqProdKernels);

const CodecKernels& tbq_prod_kernels(int bits) { return HWY_DYNAMIC_DISPATCH(TbqProdKernels)(bits); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
