#pragma once
// Device ops of PolarQuant (polar4; formats/kv/polar.{h,cpp}): rotation, then per group of 16 rotated
// coordinates an fp16 radius and 15 angle codes over 4 levels, in byte-aligned 31-byte chunks of 4 groups.
//
// Parallel shape. Encode: one thread per group runs the reference's recursive polar transform in double
// (products and sums rounded separately, as on the host, not fused), writing its codes to shared memory; then
// one thread per chunk byte gathers them into the layout. Decode and expand: one thread (lane) per element,
// which multiplies the group radius down its own path of the tree (level 4, 3, 2, 1: cosine for a first
// child, sine for a second), the very products the reference forms, so values match it to the bit.
// Encode's angles come from the device's atan2, which may differ from the host's in the last bit of a double:
// a code can differ from the reference's only for an angle within ~1e-16 of a cell boundary.
#include <cmath>

#include "cuda/kv/device_codec.cuh"
#include "cuda/kv/primitives.cuh"
#include "formats/kv/polar.h"

namespace sparrow::cuda {
namespace kv {

struct PolarCodec {
  static constexpr int kGroup = formats::polar::kGroupElements;
  static constexpr int kChunk = formats::polar::kChunkElements;
  static constexpr int kChunkBytes = int(formats::polar::kChunkBytes);
  static constexpr int kCodesPerGroup = 15;  // 8 + 4 + 2 + 1 angles (polar.h)

  static __device__ const formats::polar::AngleCodebook& level(int l) { return kv_tables().polar_angles[l - 1]; }

  // Element i of y^ in the rotated basis.
  static __device__ float value(const uint8_t* block, int i) {
    using namespace formats::polar;
    const uint8_t* chunk = block + (i / kChunk) * kChunkBytes;
    const int g = (i % kChunk) / kGroup, k = i % kGroup;
    const int code4 = (chunk[kLevel4Offset] >> (2 * g)) & 3;
    const int code3 = (chunk[kLevel3Offset + g / 2] >> (4 * (g % 2) + 2 * (k / 8))) & 3;
    const int code2 = (chunk[kLevel2Offset + g] >> (2 * (k / 4))) & 3;
    const int code1 = (chunk[kLevel1Offset + 4 * g + k / 4] >> (4 * ((k / 2) % 2))) & 15;
    const float r3 = __fmul_rn(load_f16(chunk + kRadiiOffset + 2 * g), factor(level(4), code4, k / 8));
    const float r2 = __fmul_rn(r3, factor(level(3), code3, (k / 4) % 2));
    const float r1 = __fmul_rn(r2, factor(level(2), code2, (k / 2) % 2));
    return __fmul_rn(r1, factor(level(1), code1, k % 2));
  }
  // cos of the centroid for a first child, sin for a second.
  static __device__ float factor(const formats::polar::AngleCodebook& book, int code, int second) {
    return second ? book.sin[code] : book.cos[code];
  }

  // ---------------------------------------------------------------------------------------------------------
  // Encode (formats/kv/polar.cpp encode_group), on doubles with every product and sum rounded on its own.

  static __device__ double hypot_unfused(double a, double b) {
    return sqrt(__dadd_rn(__dmul_rn(a, a), __dmul_rn(b, b)));
  }

  // Level 1: the cell of the uniform 16-cell quantizer of [0, 2 pi) that holds atan2(b, a); NaN lands in 0.
  static __device__ uint8_t quantize_full_angle(double a, double b) {
    double psi = atan2(b, a);
    if (psi < 0) psi += 2 * M_PI;
    const double cell = psi * 16 / (2 * M_PI);
    if (!(cell >= 0)) return 0;
    return uint8_t(cell >= 15 ? 15 : int(cell));
  }

  // Levels 2-4: the nearest centroid (lowest index on ties) of atan2(r1, r0).
  static __device__ uint8_t quantize_quarter_angle(const formats::polar::AngleCodebook& book, double r0, double r1) {
    const double psi = atan2(r1, r0);
    int best = 0;
    for (int i = 1; i < book.size; ++i)
      if (fabs(psi - book.centroid[i]) < fabs(psi - book.centroid[best])) best = i;
    return uint8_t(best);
  }

  // The codes of the 16 coordinates y into codes[0, 15) (level 1 pairs, level 2, level 3, level 4) and the
  // group's fp16 radius bits.
  static __device__ void encode_group(const float* y, uint8_t* codes, uint16_t* radius_bits) {
    double r1[8], r2[4], r3[2];
    for (int p = 0; p < 8; ++p) {
      const double a = y[2 * p], b = y[2 * p + 1];
      r1[p] = hypot_unfused(a, b);
      codes[p] = quantize_full_angle(a, b);
    }
    for (int j = 0; j < 4; ++j) {
      r2[j] = hypot_unfused(r1[2 * j], r1[2 * j + 1]);
      codes[8 + j] = quantize_quarter_angle(level(2), r1[2 * j], r1[2 * j + 1]);
    }
    for (int j = 0; j < 2; ++j) {
      r3[j] = hypot_unfused(r2[2 * j], r2[2 * j + 1]);
      codes[12 + j] = quantize_quarter_angle(level(3), r2[2 * j], r2[2 * j + 1]);
    }
    codes[14] = quantize_quarter_angle(level(4), r3[0], r3[1]);
    float radius = float(hypot_unfused(r3[0], r3[1]));
    if (radius > 65504.0f) radius = 65504.0f;  // formats::polar::write_group_radius; NaN stays NaN
    *radius_bits = __half_as_ushort(__float2half_rn(radius));
  }

  // Byte b of a chunk whose 4 groups' codes and radius bits are given (layout: formats/kv/polar.h).
  static __device__ uint8_t chunk_byte(const uint8_t* codes, const uint16_t* radius_bits, int b) {
    using namespace formats::polar;
    if (b < int(kLevel1Offset)) return uint8_t(radius_bits[b / 2] >> (8 * (b % 2)));
    if (b < int(kLevel2Offset)) {  // group g, pairs 2h and 2h + 1
      const int g = (b - int(kLevel1Offset)) / 4, h = (b - int(kLevel1Offset)) % 4;
      const uint8_t* c = codes + g * kCodesPerGroup;
      return uint8_t(c[2 * h] | c[2 * h + 1] << 4);
    }
    if (b < int(kLevel3Offset)) {
      const uint8_t* c = codes + (b - int(kLevel2Offset)) * kCodesPerGroup + 8;
      return uint8_t(c[0] | c[1] << 2 | c[2] << 4 | c[3] << 6);
    }
    if (b < int(kLevel4Offset)) {  // groups 2h and 2h + 1, two codes each
      const uint8_t* c = codes + 2 * (b - int(kLevel3Offset)) * kCodesPerGroup + 12;
      return uint8_t(c[0] | c[1] << 2 | c[kCodesPerGroup] << 4 | c[kCodesPerGroup + 1] << 6);
    }
    return uint8_t(codes[14] | codes[kCodesPerGroup + 14] << 2 | codes[2 * kCodesPerGroup + 14] << 4 |
                   codes[3 * kCodesPerGroup + 14] << 6);
  }

  // Scratch: the radius bits of d / 16 groups, then their codes (15 bytes per group).
  static __host__ __device__ int smem_floats(int d) {
    const int groups = d / kGroup;
    const int encode_bytes = 2 * groups + kCodesPerGroup * groups;
    const int encode_floats = (encode_bytes + 3) / 4;
    return d > encode_floats ? d : encode_floats;
  }

  static __device__ void encode(float* x, int d, uint8_t* block, float* smem) {
    const int groups = d / kGroup;
    uint16_t* radius_bits = reinterpret_cast<uint16_t*>(smem);
    uint8_t* codes = reinterpret_cast<uint8_t*>(radius_bits + groups);
    hadamard_rotate(x, d, x, x);
    for (int g = int(threadIdx.x); g < groups; g += int(blockDim.x))
      encode_group(x + g * kGroup, codes + g * kCodesPerGroup, radius_bits + g);
    __syncthreads();
    const int groups_per_chunk = kChunk / kGroup;
    for (int k = int(threadIdx.x); k < (d / kChunk) * kChunkBytes; k += int(blockDim.x)) {
      const int c = k / kChunkBytes;
      block[k] = chunk_byte(codes + c * groups_per_chunk * kCodesPerGroup, radius_bits + c * groups_per_chunk,
                            k % kChunkBytes);
    }
    __syncthreads();
  }
  static __device__ void decode(const uint8_t* block, int d, float* x, float* smem) {
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) smem[i] = value(block, i);
    __syncthreads();
    hadamard_unrotate(smem, d, smem, x);
  }
  static __device__ void prepare_query(float* q, int d, float* prepared, float* smem) {
    hadamard_rotate(q, d, smem, prepared);
  }
  static __device__ void finish(float* acc, int d, float* out, float* smem) { hadamard_unrotate(acc, d, smem, out); }
  static __device__ void expand(const uint8_t* block, int d, float* row) {
    for (int i = lane_id(); i < d; i += kWarpSize) row[i] = value(block, i);
    __syncwarp();
  }
};

}  // namespace kv

template <>
struct DeviceCodec<formats::KvCodec::POLAR4> : kv::PolarCodec {};

}  // namespace sparrow::cuda
