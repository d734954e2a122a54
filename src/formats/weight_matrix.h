#pragma once
// A weight matrix as stored in GGUF, as every backend's matrix products and row gathers take it.
#include <cstdint>

#include "gguf/tensor_types.h"

namespace sparrow {

// n_in elements per row (ggml ne0, contiguous), n_out rows, each row_bytes = tensor_row_bytes(type, n_in)
// (in the file's layout; see `interleaved`).
// data: host memory on the CPU; device memory (or host memory mapped into the device) on CUDA.
struct WeightMatrix {
  TensorType type = TensorType::F32;
  const void* data = nullptr;
  int64_t n_in = 0;
  int64_t n_out = 0;
  // Rows stored in groups of eight as the type's interleaved blocks (formats/weight_interleave.h), a layout the
  // CPU's weight store makes for its kernels; false: the file's rows, one after another.
  bool interleaved = false;
};

}  // namespace sparrow
