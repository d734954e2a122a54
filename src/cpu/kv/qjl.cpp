// Optimized CPU ops of the qjl key codec ([fp16 ||k||][2d / 8 sign bytes]; formats/kv/qjl.cpp), compiled
// once per SIMD target and picked at run time. Kernels: cpu/kv/turboquant-inl.h. Sign bits are decided on
// float dot products summed in another order than the reference's double sums, so encode may differ only for
// projections within rounding of zero.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/qjl.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/kv/cpu_codec_registry.h"
#include "cpu/kv/dispatched_codec.h"
#include "cpu/kv/turboquant-inl.h"
#include "formats/kv/codec_registry.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace ts = turboquant_simd;
namespace qjl = formats::qjl;

void QjlEncode(const float* k, int d, uint8_t* block) {
  const int m = qjl::kCodecRowsPerDim * d;
  float sketch[qjl::kCodecRowsPerDim * formats::turboquant::kMaxHeadDim];
  formats::turboquant::store_norm(ts::Norm(k, d), block);
  ts::Project(qjl::projection(m, d), k, m, d, sketch);
  qjl::pack_signs(sketch, m, block + 2);
}

float QjlScaledNorm(const uint8_t* block, int m) {
  return qjl::estimator_scale(m) * ts::LoadNorm(block);
}

void QjlDecode(const uint8_t* block, int d, float* x) {
  const int m = qjl::kCodecRowsPerDim * d;
  float v[qjl::kCodecRowsPerDim * formats::turboquant::kMaxHeadDim];
  ts::SignedFill(QjlScaledNorm(block, m), block + 2, m, v);
  ts::ProjectTransposedInDouble(qjl::projection(m, d), v, m, d, x);
}

void QjlPrepareQuery(const float* q, int d, float* prepared) {
  const int m = qjl::kCodecRowsPerDim * d;
  ts::Project(qjl::projection(m, d), q, m, d, prepared);
}

float QjlScore(const float* prepared, const uint8_t* block, int d) {
  const int m = qjl::kCodecRowsPerDim * d;
  return QjlScaledNorm(block, m) * ts::SignedSum(prepared, block + 2, m);
}

void QjlAccumulate(float w, const uint8_t* block, int d, float* acc) {
  const int m = qjl::kCodecRowsPerDim * d;
  ts::SignedAccumulate(w * QjlScaledNorm(block, m), block + 2, m, acc);
}

void QjlFinish(const float* acc, int d, float* out) {
  const int m = qjl::kCodecRowsPerDim * d;
  ts::ProjectTransposed(qjl::projection(m, d), acc, m, d, out);
}

// The rows of n consecutive blocks in the sketch basis: sqrt(pi/2)/m ||k|| sign(S k), m = 2d floats each.
void QjlExpand(const uint8_t* blocks, int n, int d, float* rows) {
  const int m = qjl::kCodecRowsPerDim * d;
  const size_t block_bytes = 2 + size_t(m) / 8;
  for (int j = 0; j < n; ++j, blocks += block_bytes, rows += m) {
    ts::SignedFill(QjlScaledNorm(blocks, m), blocks + 2, m, rows);
  }
}

using QjlKernels = CheckedKernels<formats::qjl_codec, QjlEncode, QjlDecode, QjlPrepareQuery, QjlScore, QjlAccumulate,
                                  QjlFinish, QjlExpand>;

// This target's kernels.
const CodecKernels& QjlCodecKernels() { return QjlKernels::kTable; }

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sparrow::cpu {

HWY_EXPORT(QjlCodecKernels);

const CodecKernels& qjl_kernels() { return HWY_DYNAMIC_DISPATCH(QjlCodecKernels)(); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
