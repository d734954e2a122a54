// Reference (scalar) conversions between float and the weight block types. Dequantization repeats ggml's
// arithmetic order exactly (which products are formed first, int -> float points) so that results are
// bit-identical with llama.cpp's to_float; the kernels in cpu/ are tested against these functions.
#include "formats/weight_formats.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "util/error.h"

// Bit-exactness with ggml needs a*b - c evaluated as two rounded operations, never fused into one FMA,
// whatever -march the library is built with.
#pragma GCC optimize("fp-contract=off")

namespace sparrow::formats {
namespace {

uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
float bits_float(uint32_t u) { return std::bit_cast<float>(u); }

std::string type_label(TensorType type) { return "tensor type id " + std::to_string(uint32_t(type)); }

// Elements per block of a supported type.
int64_t block_elements(TensorType type) {
  switch (type) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16: return 1;
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q8_0: return 32;
    case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K: return QK_K;
    default: throw Error("weight formats: unsupported " + type_label(type));
  }
}

int64_t checked_block_count(const char* what, TensorType type, int64_t n) {
  const int64_t per_block = block_elements(type);
  if (n < 0 || n % per_block != 0) {
    throw Error(std::string(what) + ": " + std::to_string(n) + " elements is not a multiple of the " +
                std::to_string(per_block) + "-element block of " + type_label(type));
  }
  return n / per_block;
}

int nearest_int(float f) { return int(std::lrintf(f)); }

// ---------------------------------------------------------------------------------------------------------
// Dequantization, one function per block type.

void dequantize_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[j] = float((b[i].qs[j] & 0x0F) - 8) * d;
      y[j + QK4_0 / 2] = float((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      y[j] = float(b[i].qs[j] & 0x0F) * d + m;
      y[j + QK4_1 / 2] = float(b[i].qs[j] >> 4) * d + m;
    }
  }
}

// The fifth bit of element j (0..31) of a Q5 block is bit j of the little-endian qh word.
uint32_t high_bits_q5(const uint8_t qh[4]) {
  uint32_t word;
  std::memcpy(&word, qh, 4);
  return word;
}

void dequantize_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
    const float d = f16_to_f32(b[i].d);
    const uint32_t qh = high_bits_q5(b[i].qh);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int lo = (b[i].qs[j] & 0x0F) | int(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
      y[j] = float(lo - 16) * d;
      y[j + QK5_0 / 2] = float(hi - 16) * d;
    }
  }
}

void dequantize_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    const uint32_t qh = high_bits_q5(b[i].qh);
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int lo = (b[i].qs[j] & 0x0F) | int(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
      y[j] = float(lo) * d + m;
      y[j + QK5_1 / 2] = float(hi) * d + m;
    }
  }
}

void dequantize_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = float(b[i].qs[j]) * d;
  }
}

}  // namespace

// The 12 scale bytes of Q4_K/Q5_K hold eight 6-bit scales and eight 6-bit mins: sub-blocks 0..3 in the low
// six bits of bytes 0..3 (scales) and 4..7 (mins); sub-blocks 4..7 split into a low nibble in bytes 8..11
// and their top two bits in the spare high bits of bytes 0..7.
void unpack_scale_min_k4(const uint8_t scales[K_SCALE_SIZE], int sub, uint8_t* scale, uint8_t* min) {
  if (sub < 4) {
    *scale = scales[sub] & 63;
    *min = scales[sub + 4] & 63;
  } else {
    *scale = uint8_t((scales[sub + 4] & 0x0F) | ((scales[sub - 4] >> 6) << 4));
    *min = uint8_t((scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4));
  }
}

namespace {

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

// Q4_K: 8 sub-blocks of 32 elements, value = (d*scale) * q - (dmin*min), q in 0..15. Bytes qs[32c + l]
// hold element 64c + l in the low nibble and element 64c + 32 + l in the high nibble.
void dequantize_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int chunk = 0; chunk < 4; ++chunk, q += 32) {
      uint8_t sc, m;
      unpack_scale_min_k4(b[i].scales, 2 * chunk, &sc, &m);
      const float d_lo = d * float(sc), m_lo = dmin * float(m);
      unpack_scale_min_k4(b[i].scales, 2 * chunk + 1, &sc, &m);
      const float d_hi = d * float(sc), m_hi = dmin * float(m);
      for (int l = 0; l < 32; ++l) *y++ = d_lo * float(q[l] & 0x0F) - m_lo;
      for (int l = 0; l < 32; ++l) *y++ = d_hi * float(q[l] >> 4) - m_hi;
    }
  }
}

// Q5_K: Q4_K plus a fifth bit per element: bit 2c of qh[l] for element 64c + l, bit 2c+1 for 64c + 32 + l.
void dequantize_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int chunk = 0; chunk < 4; ++chunk, q += 32) {
      uint8_t sc, m;
      unpack_scale_min_k4(b[i].scales, 2 * chunk, &sc, &m);
      const float d_lo = d * float(sc), m_lo = dmin * float(m);
      unpack_scale_min_k4(b[i].scales, 2 * chunk + 1, &sc, &m);
      const float d_hi = d * float(sc), m_hi = dmin * float(m);
      const int bit_lo = 2 * chunk, bit_hi = 2 * chunk + 1;
      for (int l = 0; l < 32; ++l) {
        *y++ = d_lo * float((q[l] & 0x0F) + (((b[i].qh[l] >> bit_lo) & 1) << 4)) - m_lo;
      }
      for (int l = 0; l < 32; ++l) {
        *y++ = d_hi * float((q[l] >> 4) + (((b[i].qh[l] >> bit_hi) & 1) << 4)) - m_hi;
      }
    }
  }
}

// Q6_K: 16 sub-blocks of 16 elements, value = (d*scale) * (q - 32), q 6 bits. Each half of 128 elements
// uses 64 ql bytes, 32 qh bytes and 8 scales; element 32k + l of the half (k 0..3, l 0..31) takes nibble
// (k >= 2) of ql[l + 32*(k&1)] and bits 2k..2k+1 of qh[l].
void dequantize_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int half = 0; half < 2; ++half, y += 128) {
      const uint8_t* ql = b[i].ql + 64 * half;
      const uint8_t* qh = b[i].qh + 32 * half;
      const int8_t* sc = b[i].scales + 8 * half;
      for (int k = 0; k < 4; ++k) {
        for (int l = 0; l < 32; ++l) {
          const uint8_t low_byte = ql[l + 32 * (k & 1)];
          const int low = k < 2 ? (low_byte & 0x0F) : (low_byte >> 4);
          const int q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
          y[32 * k + l] = d * float(sc[2 * k + l / 16]) * float(q);
        }
      }
    }
  }
}

// f16 -> f32 for the row loop: the common finite case without branches (the 15 magnitude bits shifted into a
// float's exponent and mantissa are the value times 2^-112, subnormal halves included), inf/NaN aside. Same
// bits as f16_to_f32; rows of f16 (KV caches, f16 weights) are converted often enough for this to matter.
inline float half_to_float_fast(f16_bits h) {
  const uint32_t magnitude_bits = h & 0x7FFFu;
  if (magnitude_bits >= 0x7C00u) return f16_to_f32(h);
  const float magnitude = bits_float(magnitude_bits << 13) * 0x1.0p112f;
  return bits_float(float_bits(magnitude) | (uint32_t(h & 0x8000u) << 16));
}

void dequantize_f16(const f16_bits* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = half_to_float_fast(src[i]);
}

void dequantize_bf16(const bf16_bits* src, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(src[i]);
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

void quantize_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    uint8_t q[32];
    float d;
    quantize_symmetric<16>(x, &d, q);
    b[i].d = f32_to_f16(d);
    pack_nibbles(q, b[i].qs);
  }
}

void quantize_q5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    uint8_t q[32];
    float d;
    quantize_symmetric<32>(x, &d, q);
    b[i].d = f32_to_f16(d);
    pack_nibbles(q, b[i].qs);
    pack_fifth_bits(q, b[i].qh);
  }
}

void quantize_q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    uint8_t q[32];
    float d, m;
    quantize_asymmetric<16>(x, &d, &m, q);
    b[i].d = f32_to_f16(d);
    b[i].m = f32_to_f16(m);
    pack_nibbles(q, b[i].qs);
  }
}

void quantize_q5_1(const float* x, BlockQ5_1* b, int64_t nb) {
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

void quantize_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) b[i].qs[j] = int8_t(std::clamp(nearest_int(x[j] * id), -127, 127));
  }
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

void quantize_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
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

void quantize_q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
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

void quantize_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
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

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Half and bfloat16.

float f16_to_f32(f16_bits h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  if (exponent == 0x1F) {  // inf, or NaN made quiet (as a float multiply would)
    return bits_float(sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = float(mantissa) * 0x1.0p-24f;
    return bits_float(sign | float_bits(magnitude));
  }
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

f16_bits f32_to_f16(float f) {
  const uint32_t bits = float_bits(f);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000u) return uint16_t(sign | 0x7E00);  // NaN -> canonical quiet NaN
  if (magnitude >= 0x477FF000u) return uint16_t(sign | 0x7C00);  // rounds past 65504 -> inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal, in units of 2^-24, rounded to nearest even.
    // Adding 0.5 (2^-1) puts the units at the bottom of the float mantissa and lets the FPU round.
    const float shifted = bits_float(magnitude) + 0.5f;
    return uint16_t(sign | (float_bits(shifted) - float_bits(0.5f)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const uint32_t odd = (magnitude >> 13) & 1;
  const uint32_t rounded = magnitude + 0xFFF + odd;
  return uint16_t(sign | ((rounded - (112u << 23)) >> 13));
}

float bf16_to_f32(bf16_bits h) { return bits_float(uint32_t(h) << 16); }

bf16_bits f32_to_bf16(float f) {
  const uint32_t bits = float_bits(f);
  if ((bits & 0x7FFFFFFF) > 0x7F800000u) return uint16_t((bits >> 16) | 0x0040);  // quiet the NaN
  return uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// ---------------------------------------------------------------------------------------------------------

bool is_supported_weight_type(TensorType type) {
  switch (type) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16: case TensorType::Q8_0:
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K: return true;
    default: return false;
  }
}

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
  const int64_t nb = checked_block_count("dequantize_row", type, n);
  switch (type) {
    case TensorType::F32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case TensorType::F16: return dequantize_f16(static_cast<const f16_bits*>(src), dst, n);
    case TensorType::BF16: return dequantize_bf16(static_cast<const bf16_bits*>(src), dst, n);
    case TensorType::Q4_0: return dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case TensorType::Q4_1: return dequantize_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case TensorType::Q5_0: return dequantize_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case TensorType::Q5_1: return dequantize_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case TensorType::Q8_0: return dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case TensorType::Q4_K: return dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case TensorType::Q5_K: return dequantize_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case TensorType::Q6_K: return dequantize_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    default: throw Error("dequantize_row: unsupported " + type_label(type));
  }
}

void quantize_row(TensorType type, const float* src, void* dst, int64_t n) {
  const int64_t nb = checked_block_count("quantize_row", type, n);
  switch (type) {
    case TensorType::F32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case TensorType::F16: {
      auto* out = static_cast<f16_bits*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(src[i]);
      return;
    }
    case TensorType::BF16: {
      auto* out = static_cast<bf16_bits*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(src[i]);
      return;
    }
    case TensorType::Q4_0: return quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case TensorType::Q4_1: return quantize_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case TensorType::Q5_0: return quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case TensorType::Q5_1: return quantize_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    case TensorType::Q8_0: return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case TensorType::Q4_K: return quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
    case TensorType::Q5_K: return quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), nb);
    case TensorType::Q6_K: return quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
    default: throw Error("quantize_row: unsupported " + type_label(type));
  }
}

}  // namespace sparrow::formats
