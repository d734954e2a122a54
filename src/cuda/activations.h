#pragma once
// Activations in the form the weights are multiplied with (formats/activation_blocks.h): rounded to f16 / bf16
// for float weights of those types, quantized to 8 bits per element in groups (ggml's Q8_0 / Q8_1 / Q8_K) for
// block types. The CPU does the same before every product, so both backends multiply the same numbers.
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/activation_blocks.h"

namespace sparrow::cuda {

// Where quantize_activations writes; any pointer may be null (that output is skipped). Layouts for x of
// [n_tokens][n_in]: rounded and half [n_tokens][n_in]; q [n_tokens][n_in]; scale [n_tokens][n_in / group];
// sum32 [n_tokens][n_in / 32] (activation_sum32 of each 32 elements).
struct ActivationOutputs {
  float* rounded = nullptr;   // every format: the value the CPU multiplies with (scale * q for 8-bit ones)
  uint16_t* half = nullptr;   // F16 / BF16 only: the rounded values' 16-bit encodings
  int8_t* q = nullptr;        // 8-bit formats only
  float* scale = nullptr;     // 8-bit formats only
  float* sum32 = nullptr;     // 8-bit formats only
};

// Enqueues the conversion of x (device memory, [n_tokens][n_in]) on stream. n_in must be a multiple of the
// format's group (32 or 256 for the 8-bit formats; any for the float ones); throws an Error otherwise. Bit-exact
// with formats::quantize_activations / round_activations.
void quantize_activations(cudaStream_t stream, formats::ActivationFormat format, const float* x, int64_t n_tokens,
                          int64_t n_in, const ActivationOutputs& out);

}  // namespace sparrow::cuda
