// TurboQuant, MSE variant (tbq2, tbq3, tbq4): randomized Hadamard rotation, then per 128-element sub-block
// (the whole head at d = 64) an fp16 norm and one b-bit Lloyd-Max code per coordinate of the normalised
// sub-block (arXiv 2504.19874, algorithm 1; layout in turboquant.h). With n = 128: b + 16/128 bits per
// element, i.e. tbq4 4.125, tbq3 3.125, tbq2 2.125.
//
// The rotation is orthogonal, so attention never un-rotates a key: a prepared query is R q and a score is
// <R q, y^>; V is accumulated as sum w * y^ in the rotated basis and finish applies R^T once per output row.
// The reference ops below decode into a scratch vector and work on decoded values (obviously correct); the
// optimized ops are in cpu/kv/turboquant.cpp.
#include "formats/kv/turboquant.h"

#include <cmath>
#include <cstring>
#include <string>

#include "formats/kv/codec_registry.h"
#include "formats/kv/rotation.h"
#include "formats/weight_formats.h"
#include "util/error.h"

namespace sparrow::formats {
namespace turboquant {

void check_head_dim(const char* codec, int d) {
  if (!kv_head_dim_supported(d)) {
    throw Error(std::string("kv codec ") + codec + ": head dim " + std::to_string(d) +
                " is not supported (expected 64, 128, 256 or 512)");
  }
}

size_t mse_block_bytes(const char* codec, int d, int bits) {
  check_head_dim(codec, d);
  const int n = sub_block_size(d);
  return size_t(d / n) * sub_block_bytes(n, bits);
}

void store_norm(float norm, uint8_t* dst) {
  const f16_bits h = f32_to_f16(std::fmin(norm, 65504.0f));
  std::memcpy(dst, &h, 2);
}

float load_norm(const uint8_t* src) {
  f16_bits h;
  std::memcpy(&h, src, 2);
  return f16_to_f32(h);
}

namespace {

void pack_quarters(const uint8_t* codes, int n, uint8_t* packed) {
  const int q = n / 4;
  for (int j = 0; j < q; ++j)
    packed[j] = uint8_t((codes[j] & 3) | (codes[j + q] & 3) << 2 | (codes[j + 2 * q] & 3) << 4 |
                        (codes[j + 3 * q] & 3) << 6);
}

void unpack_quarters(const uint8_t* packed, int n, uint8_t* codes) {
  const int q = n / 4;
  for (int j = 0; j < q; ++j)
    for (int k = 0; k < 4; ++k) codes[j + k * q] = (packed[j] >> (2 * k)) & 3;
}

}  // namespace

void pack_codes(const uint8_t* codes, int n, int bits, uint8_t* packed) {
  if (bits == 4) {
    for (int j = 0; j < n / 2; ++j) packed[j] = uint8_t((codes[j] & 15) | codes[j + n / 2] << 4);
  } else if (bits == 2) {
    pack_quarters(codes, n, packed);
  } else if (bits == 3) {
    pack_quarters(codes, n, packed);
    uint8_t* high = packed + n / 4;
    for (int j = 0; j < n / 8; ++j) {
      uint8_t byte = 0;
      for (int b = 0; b < 8; ++b) byte |= uint8_t(((codes[8 * j + b] >> 2) & 1) << b);
      high[j] = byte;
    }
  } else {
    throw Error("turboquant: " + std::to_string(bits) + "-bit codes are not packed (expected 2, 3 or 4)");
  }
}

void unpack_codes(const uint8_t* packed, int n, int bits, uint8_t* codes) {
  if (bits == 4) {
    for (int j = 0; j < n / 2; ++j) {
      codes[j] = packed[j] & 15;
      codes[j + n / 2] = packed[j] >> 4;
    }
  } else if (bits == 2) {
    unpack_quarters(packed, n, codes);
  } else if (bits == 3) {
    unpack_quarters(packed, n, codes);
    const uint8_t* high = packed + n / 4;
    for (int e = 0; e < n; ++e) codes[e] |= uint8_t(((high[e / 8] >> (e % 8)) & 1) << 2);
  } else {
    throw Error("turboquant: " + std::to_string(bits) + "-bit codes are not unpacked (expected 2, 3 or 4)");
  }
}

namespace {

// One sub-block: codes of y / ||y||, and the norm that gives the reconstruction ||y||.
void encode_sub_block(const float* y, int n, const LloydMaxCodebook& book, uint8_t* out) {
  double sum_sq = 0;
  for (int i = 0; i < n; ++i) sum_sq += double(y[i]) * y[i];
  const float norm = float(std::sqrt(sum_sq));
  uint8_t codes[kMaxSubBlock];
  double recon_sq = 0;
  for (int i = 0; i < n; ++i) {
    const float u = norm > 0 ? y[i] / norm : 0.0f;
    codes[i] = uint8_t(lloyd_max_index(book, u));
    recon_sq += double(book.centroids[codes[i]]) * book.centroids[codes[i]];
  }
  store_norm(norm > 0 ? float(norm / std::sqrt(recon_sq)) : 0.0f, out);
  pack_codes(codes, n, book.bits, out + 2);
}

}  // namespace

void encode_rotated(const float* y, int d, int bits, uint8_t* block) {
  const int n = sub_block_size(d);
  const LloydMaxCodebook& book = lloyd_max_codebook(n, bits);
  for (int s = 0; s < d / n; ++s) encode_sub_block(y + s * n, n, book, block + s * sub_block_bytes(n, bits));
}

void decode_rotated(const uint8_t* block, int d, int bits, float* y) {
  const int n = sub_block_size(d);
  const LloydMaxCodebook& book = lloyd_max_codebook(n, bits);
  for (int s = 0; s < d / n; ++s) {
    const uint8_t* sub = block + s * sub_block_bytes(n, bits);
    const float norm = load_norm(sub);
    uint8_t codes[kMaxSubBlock];
    unpack_codes(sub + 2, n, bits, codes);
    for (int i = 0; i < n; ++i) y[s * n + i] = norm * book.centroids[codes[i]];
  }
}

}  // namespace turboquant

namespace {

using turboquant::kMaxHeadDim;

// The reference ops of the b-bit codec, named for error messages.
template <int kBits>
struct TurboQuantMse {
  static constexpr const char* kName = kBits == 2 ? "tbq2" : kBits == 3 ? "tbq3" : "tbq4";

  static size_t block_bytes(int d) { return turboquant::mse_block_bytes(kName, d, kBits); }
  static size_t rotated_floats(int d) {
    turboquant::check_head_dim(kName, d);
    return size_t(d);
  }

  static void encode(const float* x, int d, uint8_t* block) {
    turboquant::check_head_dim(kName, d);
    float y[kMaxHeadDim];
    hadamard_rotate(x, d, y);
    turboquant::encode_rotated(y, d, kBits, block);
  }
  static void decode(const uint8_t* block, int d, float* x) {
    turboquant::check_head_dim(kName, d);
    float y[kMaxHeadDim];
    turboquant::decode_rotated(block, d, kBits, y);
    hadamard_unrotate(y, d, x);
  }
  static void prepare_query(const float* q, int d, float* prepared) {
    turboquant::check_head_dim(kName, d);
    hadamard_rotate(q, d, prepared);
  }
  static float score(const float* prepared, const uint8_t* block, int d) {
    turboquant::check_head_dim(kName, d);
    float y[kMaxHeadDim];
    turboquant::decode_rotated(block, d, kBits, y);
    double sum = 0;
    for (int i = 0; i < d; ++i) sum += double(prepared[i]) * y[i];
    return float(sum);
  }
  static void accumulate(float w, const uint8_t* block, int d, float* acc) {
    turboquant::check_head_dim(kName, d);
    float y[kMaxHeadDim];
    turboquant::decode_rotated(block, d, kBits, y);
    for (int i = 0; i < d; ++i) acc[i] += w * y[i];
  }
  static void finish(const float* acc, int d, float* out) {
    turboquant::check_head_dim(kName, d);
    hadamard_unrotate(acc, d, out);
  }

  static const KvCodecInfo& info(KvCodec codec) {
    static const KvCodecOps ops = {encode, decode, prepare_query, score, accumulate, finish};
    static const KvCodecInfo entry = {codec, kName, false, block_bytes, rotated_floats, rotated_floats, &ops};
    return entry;
  }
};

}  // namespace

const KvCodecInfo& tbq2_codec() { return TurboQuantMse<2>::info(KvCodec::TBQ2); }
const KvCodecInfo& tbq3_codec() { return TurboQuantMse<3>::info(KvCodec::TBQ3); }
const KvCodecInfo& tbq4_codec() { return TurboQuantMse<4>::info(KvCodec::TBQ4); }

}  // namespace sparrow::formats
