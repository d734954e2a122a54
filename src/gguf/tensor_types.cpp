// Row sizes and names of GGUF tensor types; the geometry table itself is constexpr, in the header.
#include "gguf/tensor_types.h"

#include <cstdint>

#include "util/error.h"

namespace sparrow {

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
