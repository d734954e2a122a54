#pragma once
// TurboQuant's MSE layout (arXiv 2504.19874, "TurboQuant_mse"), shared by tbq2/tbq3/tbq4 (turboquant.cpp),
// the inner-product codecs tbq3p/tbq4p (turboquant_ip.cpp, whose first part is a tbq2/tbq3 block) and the
// optimized CPU kernels.
//
// One block = one head vector of d elements, already rotated (y = R x, formats/kv/rotation.h), split into
// d / n sub-blocks of n = min(d, 128) elements. Each sub-block is stored as
//   [fp16 norm][codes: n * bits / 8 bytes]
// where code i is the Lloyd-Max cell (lloyd_max.h, table for n) of y_i / ||y_sub||, and the stored norm is
// ||y_sub|| / ||c_sub|| (c_sub: the codebook values of the codes), so the reconstruction norm * c_sub has
// exactly the sub-block's original norm (up to fp16 rounding; norms above 65504 saturate).
// Codes are packed byte-aligned, element order chosen so that SIMD lanes map to consecutive elements:
//   4 bits: n/2 bytes; byte j = code[j] | code[j + n/2] << 4                        (nibbles)
//   2 bits: n/4 bytes; byte j = sum over k < 4 of code[j + k * n/4] << 2k            (quarters)
//   3 bits: the 2-bit packing of (code & 3), then an n/8-byte plane where bit e % 8 of byte e / 8 is
//           code[e] >> 2 (little-endian bit order: the layout Highway's LoadMaskBits reads).
#include <cstddef>
#include <cstdint>

#include "formats/host_device.h"
#include "formats/kv/lloyd_max.h"

namespace sparrow::formats::turboquant {

constexpr int kMaxSubBlock = 128;
constexpr int kMaxHeadDim = 512;

SPARROW_HOST_DEVICE inline int sub_block_size(int d) { return d < kMaxSubBlock ? d : kMaxSubBlock; }
SPARROW_HOST_DEVICE inline size_t code_bytes(int n, int bits) { return size_t(n) * bits / 8; }
SPARROW_HOST_DEVICE inline size_t sub_block_bytes(int n, int bits) { return 2 + code_bytes(n, bits); }

// Throws sparrow::Error naming the codec unless d is a supported head dim.
void check_head_dim(const char* codec, int d);
// Bytes of the MSE part of a head vector (d / n sub-blocks); checks d.
size_t mse_block_bytes(const char* codec, int d, int bits);

// Byte-aligned packing of one sub-block's n codes (bits 2, 3 or 4), as described above.
void pack_codes(const uint8_t* codes, int n, int bits, uint8_t* packed);
void unpack_codes(const uint8_t* packed, int n, int bits, uint8_t* codes);

// Quantizes the rotated head vector y (d floats) into d / n sub-blocks; bits 2..4.
void encode_rotated(const float* y, int d, int bits, uint8_t* block);
// The reconstruction y^ in the rotated basis.
void decode_rotated(const uint8_t* block, int d, int bits, float* y);

// fp16 norm storage shared by the TurboQuant family: saturates at the largest finite half (65504).
void store_norm(float norm, uint8_t* dst);
float load_norm(const uint8_t* src);

}  // namespace sparrow::formats::turboquant
