#pragma once
// GELU on the device through the f16 table (elementwise.h: kGeluLastCode, gelu_f16_table), for the element-wise
// kernels and the GEMV epilogue (matmul_int8.cu) alike, so that a fused product has the bits of the ops one by one.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/elementwise.h"
#include "ops/gelu.h"

namespace sparrow::cuda {

// gelu(x) from the device copy of gelu_f16_table(); NaN, the one input outside the table, stays NaN.
__device__ __forceinline__ float gelu_lookup(const uint16_t* table, float x) {
  if (x <= -kGeluSaturation) return 0.0f;
  if (x >= kGeluSaturation) return x;
  const uint16_t code = __half_as_ushort(__float2half_rn(x));
  const uint32_t magnitude = code & 0x7fffu;
  if (magnitude > kGeluLastCode) return x;
  const uint32_t index = (code & 0x8000u) ? kGeluLastCode + 1 + magnitude : magnitude;
  return __half2float(__ushort_as_half(__ldg(table + index)));
}

}  // namespace sparrow::cuda
