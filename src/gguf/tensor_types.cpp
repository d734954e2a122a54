// Block geometry of every ggml tensor type a GGUF file may name. The numbers are facts of the file format:
// (elements per block, bytes per block) as ggml's type traits define them (ggml/src/ggml.c, ggml-common.h).
// Ids that ggml removed (4, 5, 31-33, 36-38) are deliberately absent, so a file naming them is rejected.
#include "gguf/tensor_types.h"

#include <array>
#include <cstdint>

#include "util/error.h"

namespace sparrow {
namespace {

constexpr uint32_t kMaxTypeId = 42;
constexpr uint32_t QK_K = 256;  // elements per super-block of the k-quants, i-quants and ternary types

// Indexed by type id; an entry with block_elements == 0 is an id this build does not know.
constexpr std::array<TensorTypeInfo, kMaxTypeId + 1> make_type_table() {
  std::array<TensorTypeInfo, kMaxTypeId + 1> t{};
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

constexpr auto kTypeTable = make_type_table();

}  // namespace

const TensorTypeInfo* tensor_type_info(uint32_t type_id) {
  if (type_id > kMaxTypeId || kTypeTable[type_id].block_elements == 0) return nullptr;
  return &kTypeTable[type_id];
}

std::string tensor_type_name(TensorType type) {
  const TensorTypeInfo* info = tensor_type_info(static_cast<uint32_t>(type));
  if (info == nullptr) return "type " + std::to_string(static_cast<uint32_t>(type));
  return std::string(info->name);
}

size_t tensor_row_bytes(TensorType type, int64_t n) {
  const TensorTypeInfo* info = tensor_type_info(static_cast<uint32_t>(type));
  if (info == nullptr) throw Error("tensor_row_bytes: unknown tensor " + tensor_type_name(type));
  if (n < 0 || n % info->block_elements != 0) {
    throw Error("tensor_row_bytes: " + std::to_string(n) + " elements of " + std::string(info->name) +
                " is not a multiple of its block size " + std::to_string(info->block_elements));
  }
  const uint64_t blocks = static_cast<uint64_t>(n / info->block_elements);
  if (blocks > SIZE_MAX / info->block_bytes) {
    throw Error("tensor_row_bytes: " + std::to_string(n) + " elements of " + std::string(info->name) +
                " overflow size_t bytes");
  }
  return static_cast<size_t>(blocks) * info->block_bytes;
}

}  // namespace sparrow
