// TurboQuant, inner-product variant (tbq3p, tbq4p; arXiv 2504.19874, algorithm 2 "TurboQuant_prod"): a
// (b-1)-bit MSE block of the rotated vector y = R x, then a 1-bit QJL sketch (qjl.h, m = d rows) of the
// residual r = y - y^_mse and ||r||. Inner products are unbiased (the MSE part alone shrinks them), at the
// price of more variance. A research option: public ports found it hurts under softmax, so it is not a default.
//
// Block: [(b-1)-bit MSE sub-blocks (turboquant.h)][fp16 ||r||][d / 8 bytes: sign(S r), qjl.h bit order].
// Bits per element at d >= 128: tbq4p 3.125 + 0.125 + 1 = 4.25, tbq3p 3.25.
// Estimate (rotated basis): y~ = y^_mse + sqrt(pi/2)/d * ||r|| * S^T sign(S r); x~ = R^T y~.
// Prepared query: [R q, S R q] (2d floats), so a score is <R q, y^_mse> + sqrt(pi/2)/d ||r|| <S R q, sign>.
// V accumulator: [sum w y^_mse, sum w sqrt(pi/2)/d ||r|| sign] (2d floats); finish: R^T (acc0 + S^T acc1).
#include <cmath>
#include <string>

#include "formats/kv/codec_registry.h"
#include "formats/kv/qjl.h"
#include "formats/kv/rotation.h"
#include "formats/kv/turboquant.h"
#include "util/error.h"

namespace sparrow::formats {
namespace {

using turboquant::kMaxHeadDim;

template <int kBits>
struct TurboQuantProd {
  static constexpr const char* kName = kBits == 3 ? "tbq3p" : "tbq4p";
  static constexpr int kMseBits = kBits - 1;

  static size_t mse_bytes(int d) { return turboquant::mse_block_bytes(kName, d, kMseBits); }
  static size_t block_bytes(int d) { return mse_bytes(d) + 2 + size_t(d) / 8; }
  static size_t two_bases_floats(int d) {
    turboquant::check_head_dim(kName, d);
    return 2 * size_t(d);
  }

  static void encode(const float* x, int d, uint8_t* block) {
    const size_t mse = mse_bytes(d);
    float y[kMaxHeadDim], y_mse[kMaxHeadDim], residual[kMaxHeadDim], sketch[kMaxHeadDim];
    hadamard_rotate(x, d, y);
    turboquant::encode_rotated(y, d, kMseBits, block);
    turboquant::decode_rotated(block, d, kMseBits, y_mse);  // the stored (fp16-normed) reconstruction
    double sum_sq = 0;
    for (int i = 0; i < d; ++i) {
      residual[i] = y[i] - y_mse[i];
      sum_sq += double(residual[i]) * residual[i];
    }
    turboquant::store_norm(float(std::sqrt(sum_sq)), block + mse);
    qjl::project(residual, d, d, sketch);
    qjl::pack_signs(sketch, d, block + mse + 2);
  }

  // The two parts of the estimate in the rotated basis: y^_mse, and the residual in the sketch basis.
  static void estimate_parts(const uint8_t* block, int d, float* y_mse, float* residual_sketch) {
    const size_t mse = mse_bytes(d);
    turboquant::decode_rotated(block, d, kMseBits, y_mse);
    const float scaled_norm = qjl::estimator_scale(d) * turboquant::load_norm(block + mse);
    for (int i = 0; i < d; ++i) residual_sketch[i] = scaled_norm * qjl::sign_at(block + mse + 2, i);
  }

  static void decode(const uint8_t* block, int d, float* x) {
    float y[kMaxHeadDim], v[kMaxHeadDim], r[kMaxHeadDim];
    estimate_parts(block, d, y, v);
    qjl::project_transposed(v, d, d, r);
    for (int i = 0; i < d; ++i) y[i] += r[i];
    hadamard_unrotate(y, d, x);
  }
  static void prepare_query(const float* q, int d, float* prepared) {
    turboquant::check_head_dim(kName, d);
    hadamard_rotate(q, d, prepared);
    qjl::project(prepared, d, d, prepared + d);
  }
  static float score(const float* prepared, const uint8_t* block, int d) {
    float y[kMaxHeadDim], v[kMaxHeadDim];
    estimate_parts(block, d, y, v);
    double sum = 0;
    for (int i = 0; i < d; ++i) sum += double(prepared[i]) * y[i] + double(prepared[d + i]) * v[i];
    return float(sum);
  }
  static void accumulate(float w, const uint8_t* block, int d, float* acc) {
    float y[kMaxHeadDim], v[kMaxHeadDim];
    estimate_parts(block, d, y, v);
    for (int i = 0; i < d; ++i) {
      acc[i] += w * y[i];
      acc[d + i] += w * v[i];
    }
  }
  static void finish(const float* acc, int d, float* out) {
    turboquant::check_head_dim(kName, d);
    float y[kMaxHeadDim];
    qjl::project_transposed(acc + d, d, d, y);
    for (int i = 0; i < d; ++i) y[i] += acc[i];
    hadamard_unrotate(y, d, out);
  }

  static const KvCodecInfo& info(KvCodec codec) {
    static const KvCodecOps ops = {encode, decode, prepare_query, score, accumulate, finish};
    static const KvCodecInfo entry = {codec, kName, false, block_bytes, two_bases_floats, two_bases_floats, &ops};
    return entry;
  }
};

}  // namespace

const KvCodecInfo& tbq3p_codec() { return TurboQuantProd<3>::info(KvCodec::TBQ3P); }
const KvCodecInfo& tbq4p_codec() { return TurboQuantProd<4>::info(KvCodec::TBQ4P); }

}  // namespace sparrow::formats
