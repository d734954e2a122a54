// Optimized CPU ops of the qjl key codec ([fp16 ||k||][2d / 8 sign bytes]; formats/kv/qjl.cpp), compiled
// once per SIMD target and picked at run time. Kernels: cpu/kv/turboquant-inl.h. Sign bits are decided on
// float dot products summed in another order than the reference's double sums, so encode may differ only for
// projections within rounding of zero.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/qjl.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/kv/turboquant-inl.h"

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

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/kv/cpu_codec_registry.h"
#include "formats/kv/codec_registry.h"

namespace sparrow::cpu {

HWY_EXPORT(QjlEncode);
HWY_EXPORT(QjlDecode);
HWY_EXPORT(QjlPrepareQuery);
HWY_EXPORT(QjlScore);
HWY_EXPORT(QjlAccumulate);
HWY_EXPORT(QjlFinish);
HWY_EXPORT(QjlExpand);

namespace {

// Head dims are checked here; the kernels trust d.
void check(int d) {
  if (!formats::kv_head_dim_supported(d)) formats::turboquant::check_head_dim("qjl", d);
}

void encode(const float* k, int d, uint8_t* block) {
  check(d);
  HWY_DYNAMIC_DISPATCH(QjlEncode)(k, d, block);
}
void decode(const uint8_t* block, int d, float* x) {
  check(d);
  HWY_DYNAMIC_DISPATCH(QjlDecode)(block, d, x);
}
void prepare_query(const float* q, int d, float* prepared) {
  check(d);
  HWY_DYNAMIC_DISPATCH(QjlPrepareQuery)(q, d, prepared);
}
float score(const float* prepared, const uint8_t* block, int d) {
  check(d);
  return HWY_DYNAMIC_DISPATCH(QjlScore)(prepared, block, d);
}
void accumulate(float w, const uint8_t* block, int d, float* acc) {
  check(d);
  HWY_DYNAMIC_DISPATCH(QjlAccumulate)(w, block, d, acc);
}
void finish(const float* acc, int d, float* out) {
  check(d);
  HWY_DYNAMIC_DISPATCH(QjlFinish)(acc, d, out);
}

}  // namespace

void qjl_expand(const uint8_t* blocks, int n, int d, float* rows) {
  check(d);
  HWY_DYNAMIC_DISPATCH(QjlExpand)(blocks, n, d, rows);
}

const formats::KvCodecOps& qjl_ops() {
  static const formats::KvCodecOps table = {encode, decode, prepare_query, score, accumulate, finish};
  return table;
}

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
