// Reference (scalar) conversions between float and the weight block types, and the trait table. Dequantization
// decodes through weight_blocks.h, which repeats ggml's arithmetic order exactly (which products are formed
// first, int -> float points) so that results are bit-identical with llama.cpp's to_float; the kernels in cpu/
// and cuda/ are tested against these functions.

// Bit-exactness with ggml needs a*b + c evaluated as two rounded operations, never fused into one FMA, whatever
// -march the library is built with. Before the includes, so that it covers the block decoders inlined here.
#pragma GCC optimize("fp-contract=off")

#include "formats/weight_formats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace sparrow::formats {
namespace {

int nearest_int(float f) { return int(std::lrintf(f)); }

// The inverse of unpack_scale_min_k4 (weight_blocks.h, which describes the 12-byte layout).
void pack_scale_min_k4(const uint8_t scale[8], const uint8_t min[8], uint8_t out[K_SCALE_SIZE]) {
  std::memset(out, 0, K_SCALE_SIZE);
  for (int sub = 0; sub < 8; ++sub) {
    if (sub < 4) {
      out[sub] = scale[sub];
      out[sub + 4] = min[sub];
    } else {
      out[sub + 4] = uint8_t((scale[sub] & 0x0F) | ((min[sub] & 0x0F) << 4));
      out[sub - 4] |= uint8_t((scale[sub] >> 4) << 6);
      out[sub] |= uint8_t((min[sub] >> 4) << 6);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Quantization. Legacy types follow the classic max-based recipe; K-quants search a few scales per sub-block
// and refit them by least squares, which keeps the round-trip error close to ggml's.

// The element of largest magnitude, with its sign.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Symmetric 4/5-bit blocks: the extreme element maps to -2^(bits-1) exactly, the rest round to nearest.
template <int kLevels>
void quantize_symmetric(const float* x, float* d_out, uint8_t* q) {
  const float max = signed_absmax(x, 32);
  const float d = max / -float(kLevels / 2);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) {
    q[j] = uint8_t(std::clamp(nearest_int(x[j] * id) + kLevels / 2, 0, kLevels - 1));
  }
  *d_out = d;
}

// Asymmetric 4/5-bit blocks: value = q*d + m with m the block minimum.
template <int kLevels>
void quantize_asymmetric(const float* x, float* d_out, float* m_out, uint8_t* q) {
  const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
  const float d = (hi - lo) / float(kLevels - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) q[j] = uint8_t(std::clamp(nearest_int((x[j] - lo) * id), 0, kLevels - 1));
  *d_out = d;
  *m_out = lo;
}

void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
}

void pack_fifth_bits(const uint8_t* q, uint8_t qh[4]) {
  uint32_t word = 0;
  for (int j = 0; j < 32; ++j) word |= uint32_t((q[j] >> 4) & 1) << j;
  std::memcpy(qh, &word, 4);
}

// Best (scale, offset) with x ~ scale*q + offset, q in [0, n_max], offset <= 0 (K-quants store -offset as an
// unsigned min). Tries scales around (hi - lo)/n_max and refits each by least squares.
struct ScaleMin { float scale, min; };  // value = scale*q - min, min >= 0

ScaleMin fit_scale_min(const float* x, int n, int n_max) {
  float lo = std::min(0.0f, *std::min_element(x, x + n));
  const float hi = *std::max_element(x, x + n);
  if (hi <= lo) return {0.0f, -lo};
  ScaleMin best{(hi - lo) / float(n_max), -lo};
  auto error_of = [&](ScaleMin f) {
    const float id = f.scale != 0.0f ? 1.0f / f.scale : 0.0f;
    double err = 0;
    for (int j = 0; j < n; ++j) {
      const int q = std::clamp(nearest_int((x[j] + f.min) * id), 0, n_max);
      const double diff = double(f.scale) * q - f.min - x[j];
      err += diff * diff;
    }
    return err;
  };
  double best_err = error_of(best);
  for (int step = -10; step <= 10; ++step) {
    const float iscale = (float(n_max) + 0.1f * float(step)) / (hi - lo);
    double s_l = 0, s_ll = 0, s_x = 0, s_xl = 0;
    for (int j = 0; j < n; ++j) {
      const int q = std::clamp(nearest_int(iscale * (x[j] - lo)), 0, n_max);
      s_l += q; s_ll += double(q) * q; s_x += x[j]; s_xl += double(x[j]) * q;
    }
    const double det = n * s_ll - s_l * s_l;
    if (det <= 0) continue;
    double scale = (n * s_xl - s_l * s_x) / det;
    double offset = (s_ll * s_x - s_l * s_xl) / det;
    if (offset > 0) {  // a positive offset is not representable: refit the scale alone
      offset = 0;
      scale = s_xl / s_ll;
    }
    if (scale <= 0) continue;
    const ScaleMin candidate{float(scale), float(-offset)};
    const double err = error_of(candidate);
    if (err < best_err) {
      best_err = err;
      best = candidate;
    }
  }
  return best;
}

// Best scale with x ~ scale*q, q in [-n_max, n_max - 1]; same search-and-refit idea, signed.
float fit_scale_symmetric(const float* x, int n, int n_max) {
  const float max = signed_absmax(x, n);
  if (max == 0.0f) return 0.0f;
  float best = max / -float(n_max);
  auto error_of = [&](float scale) {
    double err = 0;
    for (int j = 0; j < n; ++j) {
      const int q = std::clamp(nearest_int(x[j] / scale), -n_max, n_max - 1);
      const double diff = double(scale) * q - x[j];
      err += diff * diff;
    }
    return err;
  };
  double best_err = error_of(best);
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -(float(n_max) + 0.1f * float(step)) / max;
    double s_xl = 0, s_ll = 0;
    for (int j = 0; j < n; ++j) {
      const int q = std::clamp(nearest_int(iscale * x[j]), -n_max, n_max - 1);
      s_xl += double(x[j]) * q;
      s_ll += double(q) * q;
    }
    if (s_ll == 0) continue;
    const float scale = float(s_xl / s_ll);
    if (scale == 0.0f) continue;
    const double err = error_of(scale);
    if (err < best_err) {
      best_err = err;
      best = scale;
    }
  }
  return best;
}

// Shared by Q4_K and Q5_K: fits the eight sub-block scales/mins, stores them as 6-bit multiples of two f16
// super-scales, and returns the element levels computed against the stored (rounded) scales.
template <typename Block>
void quantize_k_scales_and_levels(const float* x, Block& b, int n_max, uint8_t levels[QK_K]) {
  ScaleMin fits[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int sub = 0; sub < 8; ++sub) {
    fits[sub] = fit_scale_min(x + 32 * sub, 32, n_max);
    max_scale = std::max(max_scale, fits[sub].scale);
    max_min = std::max(max_min, fits[sub].min);
  }
  b.d = f32_to_f16(max_scale / 63.0f);
  b.dmin = f32_to_f16(max_min / 63.0f);
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  uint8_t sc[8], mn[8];
  for (int sub = 0; sub < 8; ++sub) {
    sc[sub] = uint8_t(d > 0 ? std::clamp(nearest_int(fits[sub].scale / d), 0, 63) : 0);
    mn[sub] = uint8_t(dmin > 0 ? std::clamp(nearest_int(fits[sub].min / dmin), 0, 63) : 0);
  }
  pack_scale_min_k4(sc, mn, b.scales);
  for (int sub = 0; sub < 8; ++sub) {
    const float step = d * float(sc[sub]), offset = dmin * float(mn[sub]);
    for (int j = 0; j < 32; ++j) {
      const int q = step > 0 ? nearest_int((x[32 * sub + j] + offset) / step) : 0;
      levels[32 * sub + j] = uint8_t(std::clamp(q, 0, n_max));
    }
  }
}

}  // namespace

namespace detail {

// Dequantization of whole decode units, run by run, through the shared decoder.
template <TensorType T>
void dequantize_units(const void* src, float* dst, int64_t n) {
  using W = WeightBlock<T>;
  const auto* units = static_cast<const typename W::Unit*>(src);
  for (int64_t u = 0; u < n / W::kUnitElements; ++u) {
    for (int first = 0; first < W::kUnitElements; first += kRunElements) {
      W::decode_run(units[u], first, dst + u * W::kUnitElements + first);
    }
  }
}

// Plain types, any n: element by element through the same conversions the decoders use.
void dequantize_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * sizeof(float)); }

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const f16_bits*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const bf16_bits*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
}

// The table in weight_formats.h points at these instances.
template void dequantize_units<TensorType::Q8_0>(const void*, float*, int64_t);
template void dequantize_units<TensorType::Q4_0>(const void*, float*, int64_t);
template void dequantize_units<TensorType::Q4_1>(const void*, float*, int64_t);
template void dequantize_units<TensorType::Q5_0>(const void*, float*, int64_t);
template void dequantize_units<TensorType::Q5_1>(const void*, float*, int64_t);
template void dequantize_units<TensorType::Q4_K>(const void*, float*, int64_t);
template void dequantize_units<TensorType::Q5_K>(const void*, float*, int64_t);
template void dequantize_units<TensorType::Q6_K>(const void*, float*, int64_t);

void quantize_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * sizeof(float)); }

void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<f16_bits*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(src[i]);
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<bf16_bits*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(src[i]);
}

void quantize_q4_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  const int64_t nb = n / QK4_0;
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    uint8_t q[32];
    float d;
    quantize_symmetric<16>(x, &d, q);
    b[i].d = f32_to_f16(d);
    pack_nibbles(q, b[i].qs);
  }
}

void quantize_q5_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  const int64_t nb = n / QK5_0;
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    uint8_t q[32];
    float d;
    quantize_symmetric<32>(x, &d, q);
    b[i].d = f32_to_f16(d);
    pack_nibbles(q, b[i].qs);
    pack_fifth_bits(q, b[i].qh);
  }
}

void quantize_q4_1(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  const int64_t nb = n / QK4_1;
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    uint8_t q[32];
    float d, m;
    quantize_asymmetric<16>(x, &d, &m, q);
    b[i].d = f32_to_f16(d);
    b[i].m = f32_to_f16(m);
    pack_nibbles(q, b[i].qs);
  }
}

void quantize_q5_1(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  const int64_t nb = n / QK5_1;
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    uint8_t q[32];
    float d, m;
    quantize_asymmetric<32>(x, &d, &m, q);
    b[i].d = f32_to_f16(d);
    b[i].m = f32_to_f16(m);
    pack_nibbles(q, b[i].qs);
    pack_fifth_bits(q, b[i].qh);
  }
}

void quantize_q8_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  const int64_t nb = n / QK8_0;
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) b[i].qs[j] = int8_t(std::clamp(nearest_int(x[j] * id), -127, 127));
  }
}

void quantize_q4_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    uint8_t levels[QK_K];
    quantize_k_scales_and_levels(x, b[i], 15, levels);
    for (int chunk = 0; chunk < 4; ++chunk) {
      for (int l = 0; l < 32; ++l) {
        b[i].qs[32 * chunk + l] = uint8_t(levels[64 * chunk + l] | (levels[64 * chunk + 32 + l] << 4));
      }
    }
  }
}

void quantize_q5_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    uint8_t levels[QK_K];
    quantize_k_scales_and_levels(x, b[i], 31, levels);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int chunk = 0; chunk < 4; ++chunk) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = levels[64 * chunk + l], hi = levels[64 * chunk + 32 + l];
        b[i].qs[32 * chunk + l] = uint8_t((lo & 0x0F) | ((hi & 0x0F) << 4));
        b[i].qh[l] |= uint8_t(((lo >> 4) << (2 * chunk)) | ((hi >> 4) << (2 * chunk + 1)));
      }
    }
  }
}

void quantize_q6_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  const int64_t nb = n / QK_K;
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[16];
    float max_abs = 0.0f;
    for (int sub = 0; sub < 16; ++sub) {
      scales[sub] = fit_scale_symmetric(x + 16 * sub, 16, 32);
      max_abs = std::max(max_abs, std::fabs(scales[sub]));
    }
    b[i].d = f32_to_f16(max_abs / 127.0f);
    const float d = f16_to_f32(b[i].d);
    int8_t levels[QK_K];  // q - 32 in [-32, 31]
    for (int sub = 0; sub < 16; ++sub) {
      b[i].scales[sub] = int8_t(d > 0 ? std::clamp(nearest_int(scales[sub] / d), -127, 127) : 0);
      const float step = d * float(b[i].scales[sub]);
      for (int j = 0; j < 16; ++j) {
        const int q = step != 0.0f ? nearest_int(x[16 * sub + j] / step) : 0;
        levels[16 * sub + j] = int8_t(std::clamp(q, -32, 31));
      }
    }
    for (int half = 0; half < 2; ++half) {
      uint8_t* ql = b[i].ql + 64 * half;
      uint8_t* qh = b[i].qh + 32 * half;
      const int8_t* lv = levels + 128 * half;
      for (int l = 0; l < 32; ++l) {
        uint8_t q[4];
        for (int k = 0; k < 4; ++k) q[k] = uint8_t(lv[32 * k + l] + 32);
        ql[l] = uint8_t((q[0] & 0x0F) | ((q[2] & 0x0F) << 4));
        ql[l + 32] = uint8_t((q[1] & 0x0F) | ((q[3] & 0x0F) << 4));
        qh[l] = uint8_t((q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6));
      }
    }
  }
}

}  // namespace detail

namespace {

// The number of blocks in n elements; throws unless n is a whole number of them.
int64_t checked_block_count(const char* what, const WeightFormat& format, int64_t n) {
  const int64_t per_block = format.geometry.block_elements;
  if (n < 0 || n % per_block != 0) {
    throw Error(std::string(what) + ": " + std::to_string(n) + " elements is not a multiple of the " +
                std::to_string(per_block) + "-element block of " + std::string(format.geometry.name));
  }
  return n / per_block;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Activations.

namespace {

int checked_activation_group(ActivationFormat format, int64_t n, const char* what) {
  const int group = activation_group(format);
  if (group == 0) throw Error(std::string(what) + ": not an 8-bit activation format");
  if (n < 0 || n % group != 0) {
    throw Error(std::string(what) + ": " + std::to_string(n) + " activations is not a multiple of the " +
                std::to_string(group) + "-element group");
  }
  return group;
}

}  // namespace

void quantize_activations(ActivationFormat format, const float* x, int64_t n, int8_t* q, float* scale,
                          float* sum32) {
  const int group = checked_activation_group(format, n, "quantize_activations");
  for (int64_t g = 0; g < n / group; ++g) {
    const float* xg = x + g * group;
    float amax = 0.0f;
    for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(xg[i]));
    const ActivationGroupScale s = activation_group_scale(format, amax);
    scale[g] = s.scale;
    for (int k = 0; k < group; k += 32) {
      int sum = 0;
      for (int i = k; i < k + 32; ++i) {
        const int level = quantize_activation(s, xg[i]);
        q[g * group + i] = int8_t(level);
        sum += level;
      }
      sum32[(g * group + k) / 32] = activation_sum32(format, s, sum);
    }
  }
}

void round_activations(ActivationFormat format, const float* x, int64_t n, float* out) {
  switch (format) {
    case ActivationFormat::F32:
      std::copy(x, x + n, out);
      return;
    case ActivationFormat::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(f32_to_f16(x[i]));
      return;
    case ActivationFormat::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i]));
      return;
    default:
      break;
  }
  const int group = checked_activation_group(format, n, "round_activations");
  std::vector<int8_t> q(static_cast<size_t>(n));
  std::vector<float> scale(size_t(n / group)), sum32(size_t(n / 32));
  quantize_activations(format, x, n, q.data(), scale.data(), sum32.data());
  for (int64_t i = 0; i < n; ++i) out[i] = scale[size_t(i / group)] * float(q[size_t(i)]);
}

const WeightFormat& weight_format(TensorType type, const char* what) {
  const WeightFormat* format = find_weight_format(type);
  if (format == nullptr) {
    throw Error(std::string(what) + ": weight type " + tensor_type_name(type) + " is not supported");
  }
  return *format;
}

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  const WeightFormat& format = weight_format(type, "dequantize_row");
  checked_block_count("dequantize_row", format, n);
  format.dequantize_row(src, dst, n);
}

void quantize_row(TensorType type, const float* src, void* dst, int64_t n) {
  const WeightFormat& format = weight_format(type, "quantize_row");
  checked_block_count("quantize_row", format, n);
  format.quantize_row(src, dst, n);
}

}  // namespace sparrow::formats
