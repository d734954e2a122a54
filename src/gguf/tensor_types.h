#pragma once
// The tensor type ids a GGUF file may name (ggml's enum values, which are part of the file format), with the
// block geometry needed to size a tensor. Layouts and kernels for each type live in formats/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sparrow {

enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42,
};

struct TensorTypeInfo {
  std::string_view name;    // ggml's name: "q4_K", "f16", ...
  uint32_t block_elements;  // elements per block (1 for plain types)
  uint32_t block_bytes;     // bytes per block
};

// Geometry of a known type id, or nullptr for an id this build does not know (a corrupt or future file).
const TensorTypeInfo* tensor_type_info(uint32_t type_id);
// Bytes of a row of n elements; n must be a multiple of the block size.
size_t tensor_row_bytes(TensorType type, int64_t n);
// ggml's name of a type ("q4_K"), or "type <id>" for an unknown id; for messages.
std::string tensor_type_name(TensorType type);

}  // namespace sparrow
