#pragma once
// Products of block-quantized weights on their 8-bit codes: the weights' codes (formats/weight_int8.h) times the
// activations' 8-bit codes (activations.h), each sub-block's integer dot product (16 or 32 elements along n_in)
// scaled to fp32 with the weight and activation scales and added, with the weight minimum times the activations'
// sum, as ggml's vec_dot forms it:
//
//   y[t][o] = sum over sub-blocks s of
//             (w_scale[o][s] * x_scale[t][group(s)]) * dot_int(w_code[o][s], xq[t][s])  +  w_min[o][s] * x_sum[t][s]
//
// x_sum is ggml's offset term for the sub-block: for 32-element sub-blocks the activations' sum32
// (formats::activation_sum32: Q8_1's f16-rounded sum for Q4_1 / Q5_1, scale * sum of codes for Q8_K), for
// 16-element ones x_scale * (sum of the 16 codes), formed in the kernel. Only types with a minimum
// (WeightInt8<T>::kHasMin: Q4_1, Q5_1, Q4_K, Q5_K) have the second term.
//
// Two kernels (matmul_int8.cu): up to kMaxGemvTokens tokens (decode) a GEMV on CUDA cores, one warp per row,
// dp4a on the codes, the terms summed per lane and then across the warp (quantizing the activations itself where
// they fit its shared memory); more tokens (prefill) mma.sync on integer tensor cores, the terms added in
// sub-block order.
#include <cstdint>
#include <span>

#include "cuda/matmul.h"
#include "formats/weight_matrix.h"
#include "gguf/tensor_types.h"

namespace sparrow::cuda {

// Whether matmul_int8 takes weights of this type (the block types of formats/weight_int8.h).
bool matmul_int8_supports(TensorType type);

// y[t][o] as above for t < n_tokens, o < w.n_out (y: [n_tokens][n_out], device memory). xq: the activations'
// codes, [n_tokens][n_in], 16-byte aligned; x_scale: [n_tokens][n_in / group] for the weight type's activation
// format (formats::find_weight_format(w.type)->activation; group 32 or 256); x_sum32: [n_tokens][n_in / 32], the
// activations' sum32 (may be null for types without a minimum). These are what cuda::quantize_activations writes
// into ActivationOutputs{.q, .scale, .sum32}. w.data: device memory or mapped host memory, GGUF layout.
// Enqueued on ctx's stream. Throws an Error for a type without an integer form, a shape the type cannot have,
// a misaligned or null pointer, or, for more than kMaxGemvTokens tokens, a device (or a build) below sm_80.
void matmul_int8(MatmulContext& ctx, const WeightMatrix& w, const int8_t* xq, const float* x_scale,
                 const float* x_sum32, int64_t n_tokens, float* y);

// The products of up to kMaxGemvMatrices matrices of one type and n_in with the same activations (q, k and v;
// gate and up): the decode GEMV runs them all in one launch, the prefill GEMM one launch each. Throws an Error
// as above, and for matrices that differ in type or n_in.
constexpr int kMaxGemvMatrices = 4;
void matmul_int8(MatmulContext& ctx, std::span<const MatmulTarget> targets, const int8_t* xq, const float* x_scale,
                 const float* x_sum32, int64_t n_tokens);

// Whether the decode GEMV quantizes n_tokens x n_in float activations for weights of this type itself: up to
// kMaxGemvTokens tokens whose codes fit its shared memory (one token of n_in up to about 13000).
bool matmul_int8_quantizes(TensorType type, int64_t n_in, int64_t n_tokens);

// The same products from the float activations x (device memory, [n_tokens][n_in], 16-byte aligned), where
// matmul_int8_quantizes: each CTA of the GEMV quantizes x into shared memory (the code of quantize_activations,
// while its first weight loads are in flight) instead of a kernel before it, so each y_i has the bits of
// quantize_activations followed by matmul_int8 on the codes. Throws as above, and where matmul_int8_quantizes
// is false.
void matmul_int8(MatmulContext& ctx, std::span<const MatmulTarget> targets, const float* x, int64_t n_tokens);

// Whether matmul_int8_gated takes this product: the decode GEMV quantizes its activations for p.gate
// (matmul_int8_quantizes), and up, if any, has the gate's type and shape (else mul is set).
bool matmul_int8_fuses(const GatedProduct& p, int64_t n_tokens);

// Backend::gated_matmul in one launch of the decode GEMV, from the float activations x as above: the epilogue
// multiplies, gelu(gate x) times the same row of up x (one warp walks a row of each) or of mul, so that y has the
// bits of matmul_int8 followed by gelu_mul (and mul_rows). gelu_table: the device copy of gelu_f16_table()
// (elementwise.h). p.up_y is not written. Throws as above, and where matmul_int8_fuses is false.
void matmul_int8_gated(MatmulContext& ctx, const uint16_t* gelu_table, const GatedProduct& p, const float* x,
                       int64_t n_tokens, float* y);

// Whether matmul_int8_residual takes this product: the decode GEMV quantizes its activations
// (matmul_int8_quantizes) and add_rms_norm holds rows of w.n_out floats at these addresses in registers (the
// kernel whose bits the residual step reproduces).
bool matmul_int8_fuses_residual(const WeightMatrix& w, int64_t n_tokens, const float* r, const ResidualStep& step);

// Backend::matmul_residual in one launch of the decode GEMV, from the float activations x as above: r = w x,
// then the CTA that finishes last runs the residual step on r, with the bits of matmul_int8 followed by
// add_rms_norm. Throws as above, and where matmul_int8_fuses_residual is false.
void matmul_int8_residual(MatmulContext& ctx, const WeightMatrix& w, const float* x, int64_t n_tokens, float* r,
                          const ResidualStep& step);

}  // namespace sparrow::cuda
