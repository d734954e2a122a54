// Optimized CPU ops of tbq2/tbq3/tbq4 (TurboQuant MSE), compiled once per SIMD target through
// hwy/foreach_target.h and picked at run time; same bytes as formats/kv/turboquant.cpp. The kernels are in
// cpu/kv/turboquant-inl.h. Encode may differ from the reference only for values within float rounding of a
// Lloyd-Max boundary; score and accumulate only by float summation order. Expand writes exactly the
// reference's reconstruction in the rotated basis.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kv/turboquant.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/kv/turboquant-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace ts = turboquant_simd;
using formats::LloydMaxCodebook;

void TbqEncode(const float* x, int d, const LloydMaxCodebook& book, uint8_t* block) {
  float y[formats::turboquant::kMaxHeadDim];
  ts::Rotate(x, d, y);
  ts::MseEncode(y, d, book, block);
}

void TbqDecode(const uint8_t* block, int d, const LloydMaxCodebook& book, float* x) {
  float y[formats::turboquant::kMaxHeadDim];
  switch (book.bits) {
    case 2: ts::MseDecode<2>(block, d, book, y); break;
    case 3: ts::MseDecode<3>(block, d, book, y); break;
    default: ts::MseDecode<4>(block, d, book, y); break;
  }
  ts::Unrotate(y, d, x);
}

void TbqRotate(const float* x, int d, float* y) { ts::Rotate(x, d, y); }
void TbqUnrotate(const float* y, int d, float* x) { ts::Unrotate(y, d, x); }

float TbqScore(const float* q, const uint8_t* block, int d, const LloydMaxCodebook& book) {
  switch (book.bits) {
    case 2: return ts::MseScore<2>(q, block, d, book);
    case 3: return ts::MseScore<3>(q, block, d, book);
    default: return ts::MseScore<4>(q, block, d, book);
  }
}

void TbqAccumulate(float w, const uint8_t* block, int d, const LloydMaxCodebook& book, float* acc) {
  switch (book.bits) {
    case 2: ts::MseAccumulate<2>(w, block, d, book, acc); break;
    case 3: ts::MseAccumulate<3>(w, block, d, book, acc); break;
    default: ts::MseAccumulate<4>(w, block, d, book, acc); break;
  }
}

// The rows of n consecutive blocks: y^ in the rotated basis (codebook[code] * norm, nothing to un-rotate).
void TbqExpand(const uint8_t* blocks, int n, int d, const LloydMaxCodebook& book, float* rows) {
  switch (book.bits) {
    case 2: ts::MseExpand<2>(blocks, n, d, book, rows); break;
    case 3: ts::MseExpand<3>(blocks, n, d, book, rows); break;
    default: ts::MseExpand<4>(blocks, n, d, book, rows); break;
  }
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "cpu/kv/cpu_codec_registry.h"
#include "formats/kv/codec_registry.h"

namespace sparrow::cpu {

HWY_EXPORT(TbqEncode);
HWY_EXPORT(TbqDecode);
HWY_EXPORT(TbqRotate);
HWY_EXPORT(TbqUnrotate);
HWY_EXPORT(TbqScore);
HWY_EXPORT(TbqAccumulate);
HWY_EXPORT(TbqExpand);

namespace {

// The optimized ops of the b-bit codec. Head dims are checked here; the kernels trust d.
template <int kBits>
struct TbqOps {
  static const formats::KvCodecInfo& info() {
    return kBits == 2 ? formats::tbq2_codec() : kBits == 3 ? formats::tbq3_codec() : formats::tbq4_codec();
  }
  static void check(int d) {
    if (!formats::kv_head_dim_supported(d)) formats::turboquant::check_head_dim(info().name.data(), d);
  }
  static const formats::LloydMaxCodebook& book(int d) {
    static const formats::LloydMaxCodebook& small = formats::lloyd_max_codebook(64, kBits);
    static const formats::LloydMaxCodebook& large = formats::lloyd_max_codebook(128, kBits);
    return formats::turboquant::sub_block_size(d) == 64 ? small : large;
  }

  static void encode(const float* x, int d, uint8_t* block) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqEncode)(x, d, book(d), block);
  }
  static void decode(const uint8_t* block, int d, float* x) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqDecode)(block, d, book(d), x);
  }
  static void prepare_query(const float* q, int d, float* prepared) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqRotate)(q, d, prepared);
  }
  static float score(const float* prepared, const uint8_t* block, int d) {
    check(d);
    return HWY_DYNAMIC_DISPATCH(TbqScore)(prepared, block, d, book(d));
  }
  static void accumulate(float w, const uint8_t* block, int d, float* acc) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqAccumulate)(w, block, d, book(d), acc);
  }
  static void finish(const float* acc, int d, float* out) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqUnrotate)(acc, d, out);
  }
  static void expand(const uint8_t* blocks, int n, int d, float* rows) {
    check(d);
    HWY_DYNAMIC_DISPATCH(TbqExpand)(blocks, n, d, book(d), rows);
  }

  static const formats::KvCodecOps& ops() {
    static const formats::KvCodecOps table = {encode, decode, prepare_query, score, accumulate, finish};
    return table;
  }
};

}  // namespace

const formats::KvCodecOps& tbq2_ops() { return TbqOps<2>::ops(); }
const formats::KvCodecOps& tbq3_ops() { return TbqOps<3>::ops(); }
const formats::KvCodecOps& tbq4_ops() { return TbqOps<4>::ops(); }
void tbq2_expand(const uint8_t* blocks, int n, int d, float* rows) { TbqOps<2>::expand(blocks, n, d, rows); }
void tbq3_expand(const uint8_t* blocks, int n, int d, float* rows) { TbqOps<3>::expand(blocks, n, d, rows); }
void tbq4_expand(const uint8_t* blocks, int n, int d, float* rows) { TbqOps<4>::expand(blocks, n, d, rows); }

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
