// Optimized CPU ops of tbq3p/tbq4p (TurboQuant inner-product: a (b-1)-bit MSE block plus a 1-bit QJL sketch
// of the residual; layout and bases in formats/kv/turboquant_ip.cpp), compiled once per SIMD target and
// picked at run time. Kernels: cpu/kv/turboquant-inl.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/turboquant_ip.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/kv/turboquant-inl.h"

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

void TbqProdEncode(const float* x, int d, const LloydMaxCodebook& mse_book, uint8_t* block) {
  constexpr int kMax = formats::turboquant::kMaxHeadDim;
  float y[kMax], residual[kMax], sketch[kMax];
  ts::Rotate(x, d, y);
  ts::MseEncode(y, d, mse_book, block);
  if (mse_book.bits == 2) {
    ts::MseDecode<2>(block, d, mse_book, residual);
  } else {
    ts::MseDecode<3>(block, d, mse_book, residual);
  }
  for (int i = 0; i < d; ++i) residual[i] = y[i] - residual[i];
  uint8_t* part = block + formats::turboquant::mse_block_bytes("tbq-prod", d, mse_book.bits);
  formats::turboquant::store_norm(ts::Norm(residual, d), part);
  ts::Project(formats::qjl::projection(d, d), residual, d, d, sketch);
  formats::qjl::pack_signs(sketch, d, part + 2);
}

void TbqProdDecode(const uint8_t* block, int d, const LloydMaxCodebook& mse_book, float* x) {
  constexpr int kMax = formats::turboquant::kMaxHeadDim;
  float y[kMax], v[kMax], r[kMax];
  if (mse_book.bits == 2) {
    ts::MseDecode<2>(block, d, mse_book, y);
  } else {
    ts::MseDecode<3>(block, d, mse_book, y);
  }
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

float TbqProdScore(const float* prepared, const uint8_t* block, int d, const LloydMaxCodebook& mse_book) {
  const float mse = mse_book.bits == 2 ? ts::MseScore<2>(prepared, block, d, mse_book)
                                       : ts::MseScore<3>(prepared, block, d, mse_book);
  const ResidualSketch sketch = ResidualAt(block, d, mse_book);
  return mse + sketch.scaled_norm * ts::SignedSum(prepared + d, sketch.signs, d);
}

void TbqProdAccumulate(float w, const uint8_t* block, int d, const LloydMaxCodebook& mse_book, float* acc) {
  if (mse_book.bits == 2) {
    ts::MseAccumulate<2>(w, block, d, mse_book, acc);
  } else {
    ts::MseAccumulate<3>(w, block, d, mse_book, acc);
  }
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
void ExpandBlocks(const uint8_t* blocks, int n, int d, const LloydMaxCodebook& mse_book, float* rows) {
  const size_t block_bytes = ts::MseBlockBytes(d, kMseBits) + 2 + size_t(d) / 8;
  for (int j = 0; j < n; ++j, blocks += block_bytes, rows += 2 * size_t(d)) {
    ts::MseDecode<kMseBits>(blocks, d, mse_book, rows);
    const ResidualSketch sketch = ResidualAt(blocks, d, mse_book);
    ts::SignedFill(sketch.scaled_norm, sketch.signs, d, rows + d);
  }
}

void TbqProdExpand(const uint8_t* blocks, int n, int d, const LloydMaxCodebook& mse_book, float* rows) {
  if (mse_book.bits == 2) {
    ExpandBlocks<2>(blocks, n, d, mse_book, rows);
  } else {
    ExpandBlocks<3>(blocks, n, d, mse_book, rows);
  }
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/kv/cpu_codec_registry.h"
#include "formats/kv/codec_registry.h"

namespace sparrow::cpu {

HWY_EXPORT(TbqProdEncode);
HWY_EXPORT(TbqProdDecode);
HWY_EXPORT(TbqProdPrepareQuery);
HWY_EXPORT(TbqProdScore);
HWY_EXPORT(TbqProdAccumulate);
HWY_EXPORT(TbqProdFinish);
HWY_EXPORT(TbqProdExpand);

namespace {

// The optimized ops of the b-bit codec ((b-1)-bit MSE part). Head dims are checked here; the kernels trust d.
template <int kBits>
struct TbqProdOps {
  static const formats::KvCodecInfo& info() { return kBits == 3 ? formats::tbq3p_codec() : formats::tbq4p_codec(); }
  static void check(int d) {
    if (!formats::kv_head_dim_supported(d)) formats::turboquant::check_head_dim(info().name.data(), d);
  }
  static const formats::LloydMaxCodebook& mse_book(int d) {
    static const formats::LloydMaxCodebook& small = formats::lloyd_max_codebook(64, kBits - 1);
    static const formats::LloydMaxCodebook& large = formats::lloyd_max_codebook(128, kBits - 1);
    return formats::turboquant::sub_block_size(d) == 64 ? small : large;
  }

  static void encode(const float* x, int d, uint8_t* block) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqProdEncode)(x, d, mse_book(d), block);
  }
  static void decode(const uint8_t* block, int d, float* x) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqProdDecode)(block, d, mse_book(d), x);
  }
  static void prepare_query(const float* q, int d, float* prepared) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqProdPrepareQuery)(q, d, prepared);
  }
  static float score(const float* prepared, const uint8_t* block, int d) {
    check(d);
    return HWY_DYNAMIC_DISPATCH(TbqProdScore)(prepared, block, d, mse_book(d));
  }
  static void accumulate(float w, const uint8_t* block, int d, float* acc) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqProdAccumulate)(w, block, d, mse_book(d), acc);
  }
  static void finish(const float* acc, int d, float* out) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqProdFinish)(acc, d, out);
  }
  static void expand(const uint8_t* blocks, int n, int d, float* rows) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqProdExpand)(blocks, n, d, mse_book(d), rows);
  }

  static const formats::KvCodecOps& ops() {
    static const formats::KvCodecOps table = {encode, decode, prepare_query, score, accumulate, finish};
    return table;
  }
};

}  // namespace

const formats::KvCodecOps& tbq3p_ops() { return TbqProdOps<3>::ops(); }
const formats::KvCodecOps& tbq4p_ops() { return TbqProdOps<4>::ops(); }
void tbq3p_expand(const uint8_t* blocks, int n, int d, float* rows) { TbqProdOps<3>::expand(blocks, n, d, rows); }
void tbq4p_expand(const uint8_t* blocks, int n, int d, float* rows) { TbqProdOps<4>::expand(blocks, n, d, rows); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
