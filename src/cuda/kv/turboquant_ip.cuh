#pragma once
// Device ops of TurboQuant's inner-product codecs (tbq3p, tbq4p; formats/kv/turboquant_ip.cpp): a (b-1)-bit MSE
// block of y = R x (turboquant.cuh), then the fp16 norm of the residual r = y - y^_mse and its d sign bits
// sign(S r) (qjl.cuh, m = d). Basis rows and prepared queries are 2d floats: [y^_mse, sqrt(pi/2)/d ||r|| sign].
//
// Parallel shape: as the two parts' own codecs (turboquant.cuh, qjl.cuh); encode reads its own MSE block back
// (the fp16-normed reconstruction, as the reference does) to form the residual.
#include "cuda/kv/device_codec.cuh"
#include "cuda/kv/primitives.cuh"
#include "cuda/kv/qjl.cuh"
#include "cuda/kv/turboquant.cuh"

namespace sparrow::cuda {
namespace kv {

template <int kBits>
struct TurboQuantProdCodec {
  using Mse = MseBlock<kBits - 1>;

  // encode: residual (d) | MSE scratch | sign flags (d bytes); decode: y^_mse (d) | sketch values (d).
  static __host__ __device__ int smem_floats(int d) { return 2 * d + Mse::encode_scratch_floats(d); }

  static __device__ void encode(float* x, int d, uint8_t* block, float* smem) {
    float* residual = smem;
    float* mse_scratch = smem + d;
    uint8_t* flags = reinterpret_cast<uint8_t*>(smem + d + Mse::encode_scratch_floats(d));
    const int mse = Mse::bytes(d);
    hadamard_rotate(x, d, x, x);
    Mse::encode_rotated(x, d, block, mse_scratch);
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) residual[i] = x[i] - Mse::value(block, d, i);
    __syncthreads();
    if (threadIdx.x == 0) store_norm(float(sqrt(ordered_sum_of_squares(residual, d))), block + mse);
    sketch_signs(residual, d, d, flags, block + mse + 2);
  }

  static __device__ void decode(const uint8_t* block, int d, float* x, float* smem) {
    float* y = smem;
    float* sketch = smem + d;
    const int mse = Mse::bytes(d);
    const float scaled_norm = qjl_estimator_scale(d) * load_f16(block + mse);
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) {
      y[i] = Mse::value(block, d, i);
      sketch[i] = __fmul_rn(scaled_norm, formats::qjl::sign_at(block + mse + 2, i));
    }
    __syncthreads();
    project_transposed(sketch, d, d, y, y);  // y^_mse + S^T sketch
    hadamard_unrotate(y, d, y, x);
  }

  // [R q, S R q].
  static __device__ void prepare_query(float* q, int d, float* prepared, float* smem) {
    hadamard_rotate(q, d, smem, smem);
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) prepared[i] = smem[i];
    project(smem, d, d, prepared + d);
  }

  // R^T (acc[0, d) + S^T acc[d, 2d)).
  static __device__ void finish(float* acc, int d, float* out, float* smem) {
    project_transposed(acc + d, d, d, acc, smem);
    hadamard_unrotate(smem, d, smem, out);
  }

  static __device__ void expand(const uint8_t* block, int d, float* row) {
    Mse::expand(block, d, row);
    const int mse = Mse::bytes(d);
    const float scaled_norm = qjl_estimator_scale(d) * load_f16(block + mse);
    for (int i = lane_id(); i < d; i += kWarpSize)
      row[d + i] = __fmul_rn(scaled_norm, formats::qjl::sign_at(block + mse + 2, i));
    __syncwarp();
  }
};

}  // namespace kv

template <>
struct DeviceCodec<formats::KvCodec::TBQ3P> : kv::TurboQuantProdCodec<3> {};
template <>
struct DeviceCodec<formats::KvCodec::TBQ4P> : kv::TurboQuantProdCodec<4> {};

}  // namespace sparrow::cuda
