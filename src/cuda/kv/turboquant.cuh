#pragma once
// Device ops of TurboQuant's MSE codecs (tbq2, tbq3, tbq4; formats/kv/turboquant.{h,cpp}): the randomized
// Hadamard rotation over the CTA, then per sub-block an fp16 norm and one Lloyd-Max code per element, packed
// byte-aligned. The MSE part of tbq3p/tbq4p (turboquant_ip.cuh) is the same block with one bit less.
//
// Parallel shape: encode computes each sub-block's norm and its reconstruction's norm on one thread per
// sub-block, in element order and in double like the reference (so the stored norm is the reference's to the
// bit), the codes on one thread per element, and each packed byte on one thread. Expand gives each lane the
// elements lane, lane + 32, ...; the codebook (at most 16 centroids) sits in the warp's registers, lane i
// holding centroid i % 16, and a shuffle looks each code up.
#include "cuda/kv/device_codec.cuh"
#include "cuda/kv/primitives.cuh"
#include "formats/kv/turboquant.h"

namespace sparrow::cuda {
namespace kv {

// The code of element e of a sub-block's n packed codes (layout: formats/kv/turboquant.h).
__device__ inline int packed_code(const uint8_t* packed, int n, int bits, int e) {
  if (bits == 4) return (packed[e % (n / 2)] >> (4 * (e / (n / 2)))) & 15;
  const int quarter = n / 4;
  int code = (packed[e % quarter] >> (2 * (e / quarter))) & 3;
  if (bits == 3) code |= ((packed[quarter + e / 8] >> (e % 8)) & 1) << 2;
  return code;
}

// Byte j of the packing of a sub-block's n codes (j < code_bytes(n, bits)).
__device__ inline uint8_t packed_byte(const uint8_t* codes, int n, int bits, int j) {
  if (bits == 4) return uint8_t((codes[j] & 15) | codes[j + n / 2] << 4);
  const int quarter = n / 4;
  if (j < quarter) {
    return uint8_t((codes[j] & 3) | (codes[j + quarter] & 3) << 2 | (codes[j + 2 * quarter] & 3) << 4 |
                   (codes[j + 3 * quarter] & 3) << 6);
  }
  const uint8_t* eight = codes + 8 * (j - quarter);  // the 3-bit codes' high-bit plane
  uint8_t byte = 0;
  for (int b = 0; b < 8; ++b) byte |= uint8_t(((eight[b] >> 2) & 1) << b);
  return byte;
}

// Geometry of a b-bit MSE block of head dim d: d / n sub-blocks of [fp16 norm][codes].
template <int kBits>
struct MseBlock {
  static __host__ __device__ int sub_block(int d) { return formats::turboquant::sub_block_size(d); }
  static __host__ __device__ int stride(int d) {
    return int(formats::turboquant::sub_block_bytes(sub_block(d), kBits));
  }
  static __host__ __device__ int bytes(int d) { return d / sub_block(d) * stride(d); }
  static __device__ const formats::LloydMaxCodebook& codebook(int d) {
    return kv_tables().lloyd_max[lloyd_max_slot(sub_block(d), kBits)];
  }

  // Element i of y^ in the rotated basis: norm * centroid, the reference's one product.
  static __device__ float value(const uint8_t* block, int d, int i) {
    const int n = sub_block(d);
    const uint8_t* sub = block + (i / n) * stride(d);
    return __fmul_rn(load_f16(sub), codebook(d).centroids[packed_code(sub + 2, n, kBits, i % n)]);
  }

  // Scratch of encode_rotated: 4 norms, then d code bytes.
  static __host__ __device__ int encode_scratch_floats(int d) { return 4 + d / 4; }

  // The block of the rotated vector y (d floats, shared) (formats::turboquant::encode_rotated).
  static __device__ void encode_rotated(const float* y, int d, uint8_t* block, float* scratch) {
    const int n = sub_block(d), subs = d / n;
    const formats::LloydMaxCodebook& book = codebook(d);
    float* norms = scratch;
    uint8_t* codes = reinterpret_cast<uint8_t*>(scratch + 4);
    if (int(threadIdx.x) < subs) norms[threadIdx.x] = float(sqrt(ordered_sum_of_squares(y + threadIdx.x * n, n)));
    __syncthreads();
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) {
      const float norm = norms[i / n];
      const float u = norm > 0 ? y[i] / norm : 0.0f;
      codes[i] = uint8_t(formats::lloyd_max_index(book, u));
    }
    __syncthreads();
    if (int(threadIdx.x) < subs) {
      const int s = int(threadIdx.x);
      double recon_sq = 0;
      for (int i = 0; i < n; ++i) {
        const float c = book.centroids[codes[s * n + i]];
        recon_sq += double(c) * c;
      }
      const float norm = norms[s];
      store_norm(norm > 0 ? float(double(norm) / sqrt(recon_sq)) : 0.0f, block + s * stride(d));
    }
    const int code_bytes = int(formats::turboquant::code_bytes(n, kBits));
    for (int k = int(threadIdx.x); k < subs * code_bytes; k += int(blockDim.x)) {
      const int s = k / code_bytes, j = k % code_bytes;
      block[s * stride(d) + 2 + j] = packed_byte(codes + s * n, n, kBits, j);
    }
    __syncthreads();
  }

  // Warp-cooperative: row[0, d) = y^ in the rotated basis.
  static __device__ void expand(const uint8_t* block, int d, float* row) {
    with_head_dim(d, [&](auto head_dim) { expand_fixed<decltype(head_dim)::value>(block, row); });
    __syncwarp();
  }
  template <int D>
  static __device__ void expand_fixed(const uint8_t* block, float* row) {
    constexpr int n = D < formats::turboquant::kMaxSubBlock ? D : formats::turboquant::kMaxSubBlock;
    const float centroid = codebook(D).centroids[lane_id() % 16];  // zero past the 2^bits used
#pragma unroll
    for (int s = 0; s < D / n; ++s) {
      const uint8_t* sub = block + s * stride(D);
      const float norm = load_f16(sub);
#pragma unroll
      for (int e = lane_id(), k = 0; k < n / kWarpSize; ++k, e += kWarpSize) {  // every lane shuffles
        const float c = __shfl_sync(kFullWarp, centroid, packed_code(sub + 2, n, kBits, e));
        row[s * n + e] = __fmul_rn(norm, c);
      }
    }
  }
};

template <int kBits>
struct TurboQuantMseCodec {
  using Block = MseBlock<kBits>;
  static __host__ __device__ int smem_floats(int d) { return d + Block::encode_scratch_floats(d); }

  static __device__ void encode(float* x, int d, uint8_t* block, float* smem) {
    hadamard_rotate(x, d, x, x);
    Block::encode_rotated(x, d, block, smem);
  }
  static __device__ void decode(const uint8_t* block, int d, float* x, float* smem) {
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) smem[i] = Block::value(block, d, i);
    __syncthreads();
    hadamard_unrotate(smem, d, smem, x);
  }
  static __device__ void prepare_query(float* q, int d, float* prepared, float* smem) {
    hadamard_rotate(q, d, smem, prepared);
  }
  static __device__ void finish(float* acc, int d, float* out, float* smem) { hadamard_unrotate(acc, d, smem, out); }
  static __device__ void expand(const uint8_t* block, int d, float* row) { Block::expand(block, d, row); }
};

}  // namespace kv

template <>
struct DeviceCodec<formats::KvCodec::TBQ2> : kv::TurboQuantMseCodec<2> {};
template <>
struct DeviceCodec<formats::KvCodec::TBQ3> : kv::TurboQuantMseCodec<3> {};
template <>
struct DeviceCodec<formats::KvCodec::TBQ4> : kv::TurboQuantMseCodec<4> {};

}  // namespace sparrow::cuda
