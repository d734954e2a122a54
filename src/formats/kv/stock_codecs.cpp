// The stock KV codecs: f32 (no compression), f16, bf16, q8_0 and q4_0, with the block layouts llama.cpp uses for
// its KV cache (f16/bf16: d halves; q8_0/q4_0: d/32 weight-format blocks of 32 elements, each with an fp16 scale;
// see formats/weight_formats.h), so a head vector is stored exactly as llama.cpp would store it.
//
// f32, f16 and bf16 do not change basis: a prepared query is the query itself, a V accumulator holds plain
// elements, and finish is a copy. q8_0 and q4_0 quantize the head vector in the orthonormal Walsh-Hadamard basis
// W x (formats/kv/rotation.h), as llama.cpp does for its quantized cache types: W makes the elements of every
// 32-element block look alike, so its absmax scale fits them all. On the default model it takes q4_0 K's KLD
// from 0.114 to 0.093, llama.cpp's 0.096 (docs/kv-cache.md).
// Their basis row is the dequantized block (W x^), so a prepared query is W q and finish applies W once more.
// llama.cpp rotates K over the whole head and V in 64-element pieces; here both use the whole head, since a
// codec does not know which side it stores (docs/kv-cache.md).
//
// The reference ops decode into a scratch vector and work on decoded values, which is what "obviously correct"
// means here; the optimized ops live in cpu/kv/stock_codecs.cpp.
#include <cstring>
#include <string>

#include "formats/kv/codec_registry.h"
#include "formats/kv/rotation.h"
#include "formats/weight_formats.h"
#include "util/error.h"

namespace sparrow::formats {
namespace {

constexpr int kMaxHeadDim = 512;

void check_head_dim(const char* codec, int d) {
  if (!kv_head_dim_supported(d)) {
    throw Error(std::string("kv codec ") + codec + ": head dim " + std::to_string(d) +
                " is not supported (expected 64, 128, 256 or 512)");
  }
}

// ---------------------------------------------------------------------------------------------------------
// Per-codec encode and decode: the only parts that differ between the stock codecs.

void f32_encode(const float* x, int d, uint8_t* block) {
  check_head_dim("f32", d);
  std::memcpy(block, x, sizeof(float) * size_t(d));
}

void f32_decode(const uint8_t* block, int d, float* x) {
  check_head_dim("f32", d);
  std::memcpy(x, block, sizeof(float) * size_t(d));
}

// f16 and bf16: element i as 16 bits at bytes 2i..2i+1, one template over the conversion.
constexpr char kF16Name[] = "f16";
constexpr char kBf16Name[] = "bf16";

template <const char* kName, uint16_t (*ToHalf)(float)>
void halves_encode(const float* x, int d, uint8_t* block) {
  check_head_dim(kName, d);
  for (int i = 0; i < d; ++i) {
    const uint16_t h = ToHalf(x[i]);
    std::memcpy(block + 2 * i, &h, 2);
  }
}

template <const char* kName, float (*FromHalf)(uint16_t)>
void halves_decode(const uint8_t* block, int d, float* x) {
  check_head_dim(kName, d);
  for (int i = 0; i < d; ++i) {
    uint16_t h;
    std::memcpy(&h, block + 2 * i, 2);
    x[i] = FromHalf(h);
  }
}

// q8_0 and q4_0 blocks are the weight formats' blocks, d/32 of them per head vector, quantized and dequantized
// by the weight formats' reference functions (one definition of each layout in the code base), of W x.
constexpr const char* codec_name(TensorType type) { return type == TensorType::Q8_0 ? "q8_0" : "q4_0"; }

template <TensorType Type>
void hadamard_quantize(const float* x, int d, uint8_t* block) {
  check_head_dim(codec_name(Type), d);
  float rotated[kMaxHeadDim];
  walsh_hadamard_orthonormal(x, d, rotated);
  quantize_row(Type, rotated, block, d);
}

// The basis row: the dequantized block, still in the Walsh-Hadamard basis.
template <TensorType Type>
void dequantize_basis_row(const uint8_t* block, int d, float* row) {
  check_head_dim(codec_name(Type), d);
  dequantize_row(Type, block, row, d);
}

template <TensorType Type>
void hadamard_dequantize(const uint8_t* block, int d, float* x) {
  dequantize_basis_row<Type>(block, d, x);
  walsh_hadamard_orthonormal(x, d, x);
}

// ---------------------------------------------------------------------------------------------------------
// The ops every stock codec shares, written once over its decode.

void copy_floats(const float* in, int d, float* out) {
  if (!kv_head_dim_supported(d)) {
    throw Error("kv codec: head dim " + std::to_string(d) + " is not supported (expected 64, 128, 256 or 512)");
  }
  if (in != out) std::memmove(out, in, sizeof(float) * size_t(d));
}

// <q, x^>, summed in double so the reference is more accurate than any float kernel it checks.
template <void (*Decode)(const uint8_t*, int, float*)>
float score_decoded(const float* q, const uint8_t* block, int d) {
  float x[kMaxHeadDim];
  Decode(block, d, x);
  double sum = 0;
  for (int i = 0; i < d; ++i) sum += double(q[i]) * double(x[i]);
  return float(sum);
}

template <void (*Decode)(const uint8_t*, int, float*)>
void accumulate_decoded(float w, const uint8_t* block, int d, float* acc) {
  float x[kMaxHeadDim];
  Decode(block, d, x);
  for (int i = 0; i < d; ++i) acc[i] += w * x[i];
}

template <void (*Encode)(const float*, int, uint8_t*), void (*Decode)(const uint8_t*, int, float*)>
constexpr KvCodecOps stock_ops() {
  return KvCodecOps{Encode, Decode, copy_floats, score_decoded<Decode>, accumulate_decoded<Decode>, copy_floats};
}

// Score and accumulate read the basis row; the query enters and the output leaves the basis through W.
template <TensorType Type>
constexpr KvCodecOps hadamard_ops() {
  return KvCodecOps{hadamard_quantize<Type>,       hadamard_dequantize<Type>,
                    walsh_hadamard_orthonormal,    score_decoded<dequantize_basis_row<Type>>,
                    accumulate_decoded<dequantize_basis_row<Type>>, walsh_hadamard_orthonormal};
}

constexpr KvCodecOps kF32Ops = stock_ops<f32_encode, f32_decode>();
constexpr KvCodecOps kF16Ops = stock_ops<halves_encode<kF16Name, f32_to_f16>, halves_decode<kF16Name, f16_to_f32>>();
constexpr KvCodecOps kBf16Ops =
    stock_ops<halves_encode<kBf16Name, f32_to_bf16>, halves_decode<kBf16Name, bf16_to_f32>>();
constexpr KvCodecOps kQ8_0Ops = hadamard_ops<TensorType::Q8_0>();
constexpr KvCodecOps kQ4_0Ops = hadamard_ops<TensorType::Q4_0>();

size_t float_bytes(int d) { return 4 * size_t(d); }
size_t half_bytes(int d) { return 2 * size_t(d); }
size_t q8_0_bytes(int d) { return size_t(d / QK8_0) * sizeof(BlockQ8_0); }
size_t q4_0_bytes(int d) { return size_t(d / QK4_0) * sizeof(BlockQ4_0); }
size_t head_dim_floats(int d) { return size_t(d); }

// Every stock codec stores keys and values alike and works on d floats per query and accumulator.
constexpr KvCodecInfo stock_info(KvCodec codec, std::string_view name, size_t (*block_bytes)(int),
                                 const KvCodecOps* reference) {
  return {.codec = codec,
          .name = name,
          .keys_only = false,
          .block_bytes = block_bytes,
          .query_floats = head_dim_floats,
          .accumulator_floats = head_dim_floats,
          .reference = reference};
}

constexpr KvCodecInfo kF32Info = stock_info(KvCodec::F32, "f32", float_bytes, &kF32Ops);
constexpr KvCodecInfo kF16Info = stock_info(KvCodec::F16, kF16Name, half_bytes, &kF16Ops);
constexpr KvCodecInfo kBf16Info = stock_info(KvCodec::BF16, kBf16Name, half_bytes, &kBf16Ops);
constexpr KvCodecInfo kQ8_0Info = stock_info(KvCodec::Q8_0, "q8_0", q8_0_bytes, &kQ8_0Ops);
constexpr KvCodecInfo kQ4_0Info = stock_info(KvCodec::Q4_0, "q4_0", q4_0_bytes, &kQ4_0Ops);

}  // namespace

const KvCodecInfo& f32_codec() { return kF32Info; }
const KvCodecInfo& f16_codec() { return kF16Info; }
const KvCodecInfo& bf16_codec() { return kBf16Info; }
const KvCodecInfo& q8_0_codec() { return kQ8_0Info; }
const KvCodecInfo& q4_0_codec() { return kQ4_0Info; }

}  // namespace sparrow::formats
