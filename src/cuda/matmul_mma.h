#pragma once
// Prefill products of block-quantized weights on integer tensor cores: the weights' 8-bit codes
// (formats/weight_int8.h) times the activations' 8-bit codes (activations.h) with mma.sync in int32, one
// sub-block (16 or 32 elements along n_in) at a time, each sub-block's integer dot product scaled to fp32 with
// the weight and activation scales and added, with the weight minimum times the activations' sum, in
// sub-block order:
//
//   y[t][o] = sum over sub-blocks s, in order, of
//             (w_scale[o][s] * x_scale[t][group(s)]) * dot_int(w_code[o][s], xq[t][s])  +  w_min[o][s] * x_sum[t][s]
//
// x_sum is ggml's offset term for the sub-block: for 32-element sub-blocks the activations' sum32
// (formats::activation_sum32: Q8_1's f16-rounded sum for Q4_1 / Q5_1, scale * sum of codes for Q8_K), for
// 16-element ones x_scale * (sum of the 16 codes), formed in the kernel. Only types with a minimum
// (WeightInt8<T>::kHasMin: Q4_1, Q5_1, Q4_K, Q5_K) have the second term. Launch shape: matmul_mma.cu.
#include <cstdint>

#include "cuda/matmul.h"
#include "formats/weight_matrix.h"
#include "gguf/tensor_types.h"

namespace sparrow::cuda {

// Whether matmul_int8_mma takes weights of this type (the block types of formats/weight_int8.h).
bool int8_mma_supports(TensorType type);

// y[t][o] as above for t < n_tokens, o < w.n_out (y: [n_tokens][n_out], device memory). xq: the activations'
// codes, [n_tokens][n_in], 16-byte aligned; x_scale: [n_tokens][n_in / group] for the weight type's activation
// format (formats::find_weight_format(w.type)->activation; group 32 or 256); x_sum32: [n_tokens][n_in / 32], the
// activations' sum32 (may be null for types without a minimum). These are what cuda::quantize_activations writes
// into ActivationOutputs{.q, .scale, .sum32}. w.data: device memory or mapped host memory, GGUF layout.
// Enqueued on ctx's stream. Throws an Error for a type without an integer form, a shape the type cannot have,
// a misaligned or null pointer, or a device (or a build) below sm_80.
void matmul_int8_mma(MatmulContext& ctx, const WeightMatrix& w, const int8_t* xq, const float* x_scale,
                     const float* x_sum32, int64_t n_tokens, float* y);

}  // namespace sparrow::cuda
