#pragma once
// Random weight matrices and activations for the matrix-product tests (CPU and GPU), from fixed seeds.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "formats/weight_blocks.h"
#include "formats/weight_formats.h"
#include "gguf/tensor_types.h"

namespace sparrow::testing {

// Byte offsets of the f16 fields of one block (scales and mins), from the ggml block layouts; every other byte
// may hold any bits, and random bits there make every code, sub-block scale and high bit occur.
inline std::vector<size_t> half_fields(TensorType type) {
  switch (type) {
    case TensorType::Q4_0: case TensorType::Q5_0: case TensorType::Q8_0: return {0};
    case TensorType::Q4_1: case TensorType::Q5_1: case TensorType::Q4_K: case TensorType::Q5_K: return {0, 2};
    case TensorType::Q6_K: return {offsetof(formats::BlockQ6_K, d)};
    default: return {};
  }
}

// Weight bytes: random quant bits with f16 scales in +-[1/512, 1/16] for block types; Gaussian values for the
// float types (rounded to the type by its quantize_row).
inline std::vector<uint8_t> random_weights(TensorType type, int64_t n_in, int64_t n_out, uint32_t seed) {
  std::mt19937 rng(seed);
  const TensorTypeInfo& geometry = *tensor_type_info(type);
  std::vector<uint8_t> bytes(tensor_row_bytes(type, n_in) * size_t(n_out));
  if (geometry.block_elements == 1) {
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> values(size_t(n_in * n_out));
    for (float& v : values) v = gauss(rng);
    formats::quantize_row(type, values.data(), bytes.data(), n_in * n_out);
    return bytes;
  }
  for (uint8_t& b : bytes) b = uint8_t(rng());
  std::uniform_real_distribution<float> magnitude(1.0f / 512, 1.0f / 16);
  for (size_t block = 0; block < bytes.size() / geometry.block_bytes; ++block) {
    for (size_t offset : half_fields(type)) {
      const uint16_t h = formats::f32_to_f16((rng() & 1 ? 1.0f : -1.0f) * magnitude(rng));
      std::memcpy(bytes.data() + block * geometry.block_bytes + offset, &h, 2);
    }
  }
  return bytes;
}

// Activations with a few large outliers, like real hidden states.
inline std::vector<float> random_activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = gauss(rng);
  for (int64_t i = 0; i < n; i += 97) x[size_t(i)] *= 20.0f;
  return x;
}

}  // namespace sparrow::testing
