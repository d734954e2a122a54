#pragma once
// The tensor type ids a GGUF file may name (ggml's enum values, which are part of the file format), with the
// block geometry needed to size a tensor. This table is the one statement of every type's geometry: formats/
// (layouts and reference codecs of the types Sparrow computes with) and the kernels refer to it.
#include <array>
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

namespace detail {

constexpr uint32_t kMaxTensorTypeId = 42;

// (elements per block, bytes per block) as ggml's type traits define them, indexed by type id; an entry with
// block_elements == 0 is an id this build does not know. Ids that ggml removed (4, 5, 31-33, 36-38) are
// deliberately absent, so a file naming them is rejected.
constexpr std::array<TensorTypeInfo, kMaxTensorTypeId + 1> make_tensor_type_table() {
  constexpr uint32_t QK_K = 256;  // elements per super-block of the k-quants, i-quants and ternary types
  std::array<TensorTypeInfo, kMaxTensorTypeId + 1> t{};
  auto set = [&t](TensorType type, std::string_view name, uint32_t block_elements, uint32_t block_bytes) {
    t[static_cast<uint32_t>(type)] = TensorTypeInfo{name, block_elements, block_bytes};
  };
  // Plain types: one element per "block".
  set(TensorType::F32, "f32", 1, 4);
  set(TensorType::F16, "f16", 1, 2);
  set(TensorType::BF16, "bf16", 1, 2);
  set(TensorType::F64, "f64", 1, 8);
  set(TensorType::I8, "i8", 1, 1);
  set(TensorType::I16, "i16", 1, 2);
  set(TensorType::I32, "i32", 1, 4);
  set(TensorType::I64, "i64", 1, 8);
  // 32-element blocks: an f16 scale (and min for the _1 types), then the quants.
  set(TensorType::Q4_0, "q4_0", 32, 18);
  set(TensorType::Q4_1, "q4_1", 32, 20);
  set(TensorType::Q5_0, "q5_0", 32, 22);
  set(TensorType::Q5_1, "q5_1", 32, 24);
  set(TensorType::Q8_0, "q8_0", 32, 34);
  set(TensorType::Q8_1, "q8_1", 32, 36);
  set(TensorType::IQ4_NL, "iq4_nl", 32, 18);
  set(TensorType::MXFP4, "mxfp4", 32, 17);  // e8m0 shared exponent + 16 bytes of 4-bit values
  set(TensorType::NVFP4, "nvfp4", 64, 36);  // four 16-element sub-blocks with e4m3 scales
  set(TensorType::Q1_0, "q1_0", 128, 18);
  set(TensorType::Q2_0, "q2_0", 64, 18);
  // 256-element super-blocks.
  set(TensorType::Q2_K, "q2_K", QK_K, 84);
  set(TensorType::Q3_K, "q3_K", QK_K, 110);
  set(TensorType::Q4_K, "q4_K", QK_K, 144);
  set(TensorType::Q5_K, "q5_K", QK_K, 176);
  set(TensorType::Q6_K, "q6_K", QK_K, 210);
  set(TensorType::Q8_K, "q8_K", QK_K, 292);
  set(TensorType::IQ2_XXS, "iq2_xxs", QK_K, 66);
  set(TensorType::IQ2_XS, "iq2_xs", QK_K, 74);
  set(TensorType::IQ2_S, "iq2_s", QK_K, 82);
  set(TensorType::IQ3_XXS, "iq3_xxs", QK_K, 98);
  set(TensorType::IQ3_S, "iq3_s", QK_K, 110);
  set(TensorType::IQ1_S, "iq1_s", QK_K, 50);
  set(TensorType::IQ1_M, "iq1_m", QK_K, 56);
  set(TensorType::IQ4_XS, "iq4_xs", QK_K, 136);
  set(TensorType::TQ1_0, "tq1_0", QK_K, 54);
  set(TensorType::TQ2_0, "tq2_0", QK_K, 66);
  return t;
}

inline constexpr auto kTensorTypeTable = make_tensor_type_table();

}  // namespace detail

// Geometry of a known type id, or nullptr for an id this build does not know (a corrupt or future file).
constexpr const TensorTypeInfo* tensor_type_info(uint32_t type_id) {
  if (type_id > detail::kMaxTensorTypeId || detail::kTensorTypeTable[type_id].block_elements == 0) return nullptr;
  return &detail::kTensorTypeTable[type_id];
}
constexpr const TensorTypeInfo* tensor_type_info(TensorType type) {
  return tensor_type_info(static_cast<uint32_t>(type));
}
// Bytes of a row of n elements; n must be a multiple of the block size.
size_t tensor_row_bytes(TensorType type, int64_t n);
// ggml's name of a type ("q4_K"), or "type <id>" for an unknown id; for messages.
std::string tensor_type_name(TensorType type);

}  // namespace sparrow
